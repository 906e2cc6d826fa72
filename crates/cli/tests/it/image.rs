//! The image, without a container engine daemon. The Dockerfile runs
//! `scripts/image-rootfs.sh`; these tests run it too (once per test process: the static
//! builds are most of this file's time) and check the filesystem it lays out — both
//! binaries there, static (`file`, `ldd`), answering with this build. `make image` packs
//! that filesystem into an OCI archive (`scripts/image-oci.sh`, umoci): the archive is
//! checked byte for byte (reproducible, labelled, the Dockerfile's entrypoint), and then
//! run — imported into the test kit's containerd and started over CRI as the DaemonSet
//! `interlock manifests` renders runs it, on a node in a box, where it must install the
//! plugin and protect a meshed pod. `make release` lays out the same bytes in `dist/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tool(name: &str, arg: &Path) -> String {
    let out = Command::new(name)
        .arg(arg)
        .output()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The image's filesystem and its OCI archive, built once per test process.
struct Built {
    rootfs: PathBuf,
    archive: PathBuf,
    /// Every path of the rootfs (relative) when it was packed: a test may add to the
    /// rootfs later (the legacy-iptables test's lock file).
    packed: std::collections::BTreeSet<String>,
}

/// The second packing of the same rootfs.
fn packed_again() -> PathBuf {
    built().archive.with_file_name("again.oci.tar")
}

/// Lays out the image's filesystem with the script the Dockerfile runs and packs it with
/// the script `make image` runs, under the target dir, once for all tests here (before
/// any test sees it, so a test that writes into the rootfs cannot change the archive).
fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("image-test");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rootfs = dir.join("rootfs");
        let status = Command::new(repo().join("scripts/image-rootfs.sh"))
            .arg(&rootfs)
            .env("CARGO", env!("CARGO"))
            .status()
            .unwrap();
        assert!(status.success(), "scripts/image-rootfs.sh failed");
        let archive = dir.join(format!("interlock-{}.oci.tar", env!("CARGO_PKG_VERSION")));
        pack(&rootfs, &archive);
        // Packed again at once, before any test can write into the rootfs.
        let again = dir.join("again.oci.tar");
        pack(&rootfs, &again);
        let packed = walk(&rootfs)
            .iter()
            .map(|p| {
                p.strip_prefix(&rootfs)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        Built {
            rootfs,
            archive,
            packed,
        }
    })
}

/// `scripts/image-oci.sh ROOTFS ARCHIVE`.
fn pack(rootfs: &Path, archive: &Path) {
    let out = Command::new(repo().join("scripts/image-oci.sh"))
        .arg(rootfs)
        .arg(archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/image-oci.sh failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn image_rootfs() -> &'static Path {
    &built().rootfs
}

#[test]
fn the_dockerfile_runs_the_rootfs_script() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    assert!(dockerfile.contains("RUN scripts/image-rootfs.sh /rootfs"));
    assert!(dockerfile.contains("COPY --from=build /rootfs/ /"));
    // Every FROM is pinned: an exact tag (with a patch version) or the empty image.
    for from in dockerfile.lines().filter(|l| l.starts_with("FROM ")) {
        let image = from.split_whitespace().nth(1).unwrap();
        let tag = image.rsplit(':').next().unwrap();
        assert!(
            image == "scratch"
                || image.contains("@sha256:")
                || tag.split('-').next().unwrap().matches('.').count() == 2,
            "{from}: not pinned"
        );
    }
}

#[test]
fn the_image_rootfs_holds_both_binaries_static() {
    let bin = image_rootfs().join("usr/local/bin");
    for name in ["interlock", "interlock-cni"] {
        let p = bin.join(name);
        let file = tool("file", &p);
        assert!(
            file.contains("statically linked") || file.contains("static-pie linked"),
            "{file}"
        );
        let ldd = tool("ldd", &p);
        assert!(
            ldd.contains("not a dynamic executable") || ldd.contains("statically linked"),
            "{name}: {ldd}"
        );
    }
    // The plugin stays non-PIE, as `make plugin-static` ships it.
    assert!(tool("file", &bin.join("interlock-cni")).contains("LSB executable"));
    // Both carry this build.
    let v = Command::new(bin.join("interlock"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&v.stdout).trim(),
        format!("interlock {}", interlock_buildinfo::VERSION)
    );
    let v = Command::new(bin.join("interlock-cni"))
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    assert_eq!(answer["interlockVersion"], interlock_buildinfo::VERSION);
    // The image's plugin runs the lean start-up, and its invariants hold.
    let check = Command::new(bin.join("interlock-cni"))
        .arg("--self-check")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && report.contains("interlock's lean start-up ran"),
        "{report}"
    );
    // The manifests run the agent from there and install the plugin from there.
    let yaml = std::fs::read_to_string(repo().join("deploy/interlock.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let kind = |k: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == k && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {k} {name}"))
            .clone()
    };
    let ds = kind("DaemonSet", "interlock-node");
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["command"],
        serde_json::json!(["/usr/local/bin/interlock", "agent"])
    );
    assert_eq!(
        kind("ConfigMap", "interlock-config")["data"]["INTERLOCK_PLUGIN_SOURCE"],
        "/usr/local/bin/interlock-cni"
    );
}

/// The image's plugin carries the code a pod's ADD and DEL run first in its text, in the
/// order of `crates/plugin/hot-text.order` (scripts/plugin-rustflags.sh): every Rust
/// function named there sits after the one named before it (each is a section of its own,
/// so the linker keeps the file's order exactly; a build without the order keeps about
/// half of them in order). And the file still names the binary's functions: most names
/// survive a code change, a toolchain or dependency upgrade renames them all.
#[test]
fn the_image_plugin_places_the_code_of_an_add_first() {
    let order = std::fs::read_to_string(repo().join("crates/plugin/hot-text.order")).unwrap();
    let names: Vec<&str> = order
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let plugin = image_rootfs().join("usr/local/bin/interlock-cni");
    let nm = Command::new("nm")
        .arg("--defined-only")
        .arg(&plugin)
        .output()
        .unwrap();
    assert!(nm.status.success(), "nm failed");
    // Functions, and (listed last) the small .bss objects.
    let mut at = std::collections::HashMap::new();
    let mut bss = std::collections::HashMap::new();
    for line in String::from_utf8_lossy(&nm.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let [addr, kind, name] = f[..] {
            let addr = u64::from_str_radix(addr, 16).unwrap();
            if "tTwWiI".contains(kind) {
                at.entry(name.to_string()).or_insert(addr);
            } else if "bB".contains(kind) {
                bss.entry(name.to_string()).or_insert(addr);
            }
        }
    }
    let present: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| at.contains_key(*n) || bss.contains_key(*n))
        .collect();
    assert!(
        present.len() * 4 >= names.len() * 3,
        "only {} of the {} functions in crates/plugin/hot-text.order are in the plugin: \
         regenerate it (make plugin-hot-text)",
        present.len(),
        names.len()
    );
    let rust: Vec<(&str, u64)> = present
        .iter()
        .filter(|n| n.starts_with("_ZN") || n.starts_with("_R"))
        .filter_map(|n| at.get(*n).map(|a| (*n, *a)))
        .collect();
    assert!(
        rust.len() > 100,
        "{} Rust functions in the order",
        rust.len()
    );
    for w in rust.windows(2) {
        assert!(
            w[1].1 > w[0].1,
            "{} ({:#x}) is not placed after {} ({:#x}): the plugin was linked without \
             crates/plugin/hot-text.order",
            w[1].0,
            w[1].1,
            w[0].0,
            w[0].1
        );
    }
    // glibc's start-up comes before the ADD's code, and the small .bss objects before the
    // netlink receive buffer (64 KiB), which would otherwise spread them over more pages.
    // Built with the soft-sha256 feature: no SHA-256 backend probing the CPU with cpuid.
    let probes: Vec<&String> = at.keys().filter(|n| n.contains("shani_cpuid")).collect();
    assert!(
        probes.is_empty(),
        "the image's plugin asks the CPU for SHA extensions (built without the soft-sha256 \
         feature): {probes:?}"
    );
    // Built with the lean-start feature: the start-up is crates/lean-start/c/lean_start.c,
    // so glibc's, which identifies the CPU with 43 `cpuid` (its local functions below come
    // only with it), is not in the binary.
    let identify: Vec<&String> = at
        .keys()
        .filter(|n| {
            [
                "handle_amd",
                "handle_intel",
                "update_active",
                "get_common_indices",
            ]
            .iter()
            .any(|f| n.starts_with(f))
        })
        .collect();
    assert!(
        identify.is_empty(),
        "the image's plugin carries glibc's start-up and its CPU identification (built \
         without the lean-start feature): {identify:?}"
    );
    let start = at
        .get("__libc_start_main")
        .expect("a static glibc plugin has __libc_start_main");
    assert!(
        start < &at["main"],
        "glibc's start-up is not placed before main: regenerate crates/plugin/hot-text.order \
         (make plugin-hot-text)"
    );
    // The .bss output section (glibc keeps some pointers in a section of their own).
    let sections = Command::new("readelf")
        .args(["-SW"])
        .arg(&plugin)
        .output()
        .unwrap();
    let (bss_start, bss_end) = String::from_utf8_lossy(&sections.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|x| *x == ".bss")?;
            let addr = u64::from_str_radix(f.get(i + 2)?, 16).ok()?;
            let size = u64::from_str_radix(f.get(i + 4)?, 16).ok()?;
            Some((addr, addr + size))
        })
        .expect("the plugin has a .bss section");
    let buffer = bss
        .iter()
        .find(|(n, _)| n.contains("interlock_netlink4recv6SHARED"))
        .map(|(_, a)| *a)
        .expect("the netlink receive buffer is a .bss object of the plugin");
    let small: Vec<(&str, u64)> = present
        .iter()
        .filter_map(|n| bss.get(*n).map(|a| (*n, *a)))
        .filter(|(_, a)| (bss_start..bss_end).contains(a))
        .collect();
    assert!(
        small.len() > 20,
        "{} small .bss objects in the order",
        small.len()
    );
    for (n, a) in &small {
        assert!(
            *a < buffer,
            "{n} ({a:#x}) is placed after the netlink receive buffer ({buffer:#x})"
        );
    }
}

/// ux-3 finding 5: on a node whose rules are legacy iptables, the agent reads a pod's
/// rules back and repairs them with the image's own iptables-legacy tools. The redirect
/// backend's code (what the audit runs) drives the image's tools, each run in the image's
/// filesystem (`chroot`, as the container's root) inside a test netns, with the lock file
/// the DaemonSet points them to (the image's root is read-only): apply, read back exact,
/// remove.
#[test]
fn the_image_reads_and_repairs_legacy_iptables_rules() {
    interlock_testkit::require_root!();
    use interlock_redirect::backend::iptables::{Flavour, IptablesBackend, Tool};
    use interlock_redirect::backend::{Backend, ToolLookup};
    use interlock_redirect::spec::Family;
    use std::os::unix::fs::PermissionsExt;
    let root = image_rootfs();
    // The DaemonSet's lock file, in the state dir (mounted read-write).
    let yaml = std::fs::read_to_string(repo().join("deploy/interlock.yaml")).unwrap();
    assert!(
        yaml.contains("XTABLES_LOCKFILE"),
        "the DaemonSet sets no lock file"
    );
    std::fs::create_dir_all(root.join("var/run/interlock")).unwrap();
    let chroot = ["/usr/sbin/chroot", "/usr/bin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chroot");
    let wrappers = tempfile::tempdir().unwrap();
    for family in [Family::V4, Family::V6] {
        for tool in [Tool::Iptables, Tool::Restore, Tool::Save] {
            let name = Flavour::Legacy.tool(family, tool);
            let path = wrappers.path().join(&name);
            std::fs::write(
                &path,
                format!(
                    "#!/bin/sh\nexec env -i XTABLES_LOCKFILE=/var/run/interlock/xtables.lock {chroot} {} /usr/sbin/{name} \"$@\"\n",
                    root.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    let backend = IptablesBackend::with_tools(
        Flavour::Legacy,
        ToolLookup::Dirs(vec![wrappers.path().to_path_buf()]),
    );
    let ann: std::collections::BTreeMap<String, String> =
        [("sidecar.istio.io/status".to_string(), "{}".to_string())].into();
    let facts = interlock_testkit::pods::istio_sidecar();
    let spec = interlock_redirect::spec_for(
        &interlock_redirect::PodView::with_facts(&ann, &facts),
        &interlock_redirect::ProfileName::ALL,
    )
    .unwrap()
    .unwrap()
    .1;
    let ns = interlock_testkit::Netns::new("imglg").unwrap();
    let host_save = || ns.exec_ok(&["iptables-legacy-save", "-t", "nat"]);
    ns.run(|| {
        assert!(!backend.verify(&spec).unwrap().is_exact());
        backend.apply(&spec).unwrap();
        assert!(
            backend.verify(&spec).unwrap().is_exact(),
            "read back with the image's tools"
        );
    });
    // The host's own tools see what the image's wrote.
    assert!(host_save().contains("IL_OUTPUT"), "{}", host_save());
    ns.run(|| backend.remove().unwrap());
    assert!(!host_save().contains("IL_"), "{}", host_save());
    assert!(root.join("var/run/interlock/xtables.lock").exists());
    assert!(
        !root.join("run/xtables.lock").exists(),
        "the tools took the lock on the (read-only) image root"
    );
}

/// Every file of a tar archive: path → (bytes, header's mtime, uid, gid).
fn tar_files(bytes: &[u8]) -> std::collections::BTreeMap<String, (Vec<u8>, u64, u64, u64)> {
    let mut files = std::collections::BTreeMap::new();
    let mut ar = tar::Archive::new(bytes);
    for entry in ar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let h = entry.header();
        let meta = (h.mtime().unwrap(), h.uid().unwrap(), h.gid().unwrap());
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        files.insert(path, (data, meta.0, meta.1, meta.2));
    }
    files
}

fn git(args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The OCI archive, opened: its index, the image's config, its one layer (uncompressed).
struct Oci {
    index: serde_json::Value,
    config: serde_json::Value,
    layer: Vec<u8>,
}

fn open_oci(archive: &Path) -> Oci {
    let files = tar_files(&std::fs::read(archive).unwrap());
    assert!(
        files.contains_key("oci-layout"),
        "not an OCI layout: {:?}",
        files.keys()
    );
    let blob = |digest: &serde_json::Value| {
        let digest = digest.as_str().unwrap();
        let data = &files[&format!("blobs/sha256/{}", &digest["sha256:".len()..])].0;
        assert_eq!(
            format!(
                "sha256:{}",
                interlock_agent::guard::install::sha256_hex(data)
            ),
            digest,
            "a blob's digest"
        );
        data.clone()
    };
    let index: serde_json::Value = serde_json::from_slice(&files["index.json"].0).unwrap();
    assert_eq!(index["manifests"].as_array().unwrap().len(), 1, "{index}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&blob(&index["manifests"][0]["digest"])).unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&blob(&manifest["config"]["digest"])).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    let mut layer = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&blob(&layers[0]["digest"])[..]),
        &mut layer,
    )
    .unwrap();
    assert_eq!(
        config["rootfs"]["diff_ids"][0],
        format!(
            "sha256:{}",
            interlock_agent::guard::install::sha256_hex(&layer)
        )
    );
    // The archive's own entries carry the same fixed time as everything inside.
    let epoch = config_epoch(&config);
    for (path, (_, mtime, uid, gid)) in &files {
        assert_eq!((*mtime, *uid, *gid), (epoch, 0, 0), "{path} in the archive");
    }
    Oci {
        index,
        config,
        layer,
    }
}

fn config_epoch(config: &serde_json::Value) -> u64 {
    let created = config["created"].as_str().unwrap();
    let out = Command::new("date")
        .args(["-u", "-d", created, "+%s"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The image `interlock manifests` runs by default: the DaemonSet's container image.
fn manifest_image(docs: &[serde_json::Value]) -> String {
    daemonset(docs)["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_string()
}

fn daemonset(docs: &[serde_json::Value]) -> &serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the manifests hold a DaemonSet")
}

/// `interlock manifests [--set k=v…]` from the image's own binary, parsed.
fn render(rootfs: &Path, sets: &[String]) -> Vec<serde_json::Value> {
    let mut cmd = Command::new(rootfs.join("usr/local/bin/interlock"));
    cmd.arg("manifests");
    for s in sets {
        cmd.arg("--set").arg(s);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "interlock manifests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(d).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// `make image`'s archive: an OCI layout with one layer holding exactly the rootfs, named
/// as the manifests pull it, labelled with this commit and version, the Dockerfile's
/// entrypoint, command and environment, every timestamp the commit's time, and the same
/// bytes when packed again.
#[test]
fn the_image_archive_is_reproducible_labelled_and_named_as_the_manifests_pull_it() {
    let b = built();
    let oci = open_oci(&b.archive);
    let version = env!("CARGO_PKG_VERSION");
    // Named as `interlock manifests` pulls it.
    let image = manifest_image(&render(&b.rootfs, &[]));
    let entry = &oci.index["manifests"][0];
    assert_eq!(entry["annotations"]["io.containerd.image.name"], image);
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        format!("v{version}")
    );
    assert!(image.ends_with(&format!(":v{version}")), "{image}");
    // Labels.
    let labels = &oci.config["config"]["Labels"];
    let head = git(&["rev-parse", "HEAD"]);
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap();
    assert!(
        revision == head || revision == format!("{head}-dirty"),
        "revision {revision}, HEAD {head}"
    );
    assert_eq!(
        revision.ends_with("-dirty"),
        !git(&["status", "--porcelain"]).is_empty()
    );
    assert_eq!(labels["org.opencontainers.image.version"], version);
    assert!(labels["org.opencontainers.image.source"]
        .as_str()
        .unwrap()
        .starts_with("https://"));
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    // Timestamps: the commit's.
    let epoch: u64 = git(&["log", "-1", "--format=%ct", "HEAD"]).parse().unwrap();
    assert_eq!(config_epoch(&oci.config), epoch);
    assert_eq!(
        labels["org.opencontainers.image.created"],
        oci.config["created"]
    );
    for h in oci.config["history"].as_array().unwrap() {
        assert_eq!(h["created"], oci.config["created"]);
    }
    // The architecture of the binaries' target.
    let host =
        String::from_utf8(Command::new("rustc").arg("-vV").output().unwrap().stdout).unwrap();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert!(host.contains(std::env::consts::ARCH));
    assert_eq!(oci.config["architecture"], arch);
    assert_eq!(entry["platform"]["architecture"], arch);
    // Entrypoint, command and environment: the Dockerfile's final stage.
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let last = dockerfile.rsplit("\nFROM ").next().unwrap();
    let json_line = |key: &str| -> serde_json::Value {
        let line = last
            .lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("the Dockerfile has no {key}"));
        serde_json::from_str(&line[key.len() + 1..]).unwrap()
    };
    assert_eq!(oci.config["config"]["Entrypoint"], json_line("ENTRYPOINT"));
    assert_eq!(oci.config["config"]["Cmd"], json_line("CMD"));
    let env: Vec<&str> = oci.config["config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for line in last.lines().filter_map(|l| l.strip_prefix("ENV ")) {
        assert!(env.contains(&line), "{line} not in the image's Env {env:?}");
    }
    // The layer: exactly the rootfs, owned by root, every mtime the commit's.
    let layer = tar_files(&oci.layer);
    let got: std::collections::BTreeSet<String> = layer
        .keys()
        .map(|k| k.trim_start_matches("./").trim_end_matches('/').to_string())
        .filter(|k| !k.is_empty() && k != ".")
        .collect();
    assert_eq!(got, b.packed, "the layer holds exactly the rootfs");
    for (path, (data, mtime, uid, gid)) in &layer {
        assert_eq!((*mtime, *uid, *gid), (epoch, 0, 0), "{path} in the layer");
        if path.ends_with("usr/local/bin/interlock-cni") {
            assert_eq!(
                data,
                &std::fs::read(b.rootfs.join("usr/local/bin/interlock-cni")).unwrap()
            );
        }
    }
    // Reproducible: the same rootfs packs to the same bytes.
    assert!(
        std::fs::read(&b.archive).unwrap() == std::fs::read(packed_again()).unwrap(),
        "packing the same rootfs twice gave different archives"
    );
}

/// Every path under `dir` (not `dir` itself), symlinks not followed.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        out.push(p.clone());
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

/// `make image` builds committed files only: in a work tree with an untracked file or an
/// uncommitted change it refuses before building, naming the files.
#[test]
fn make_image_refuses_a_work_tree_that_differs_from_its_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    std::fs::create_dir(t.join("scripts")).unwrap();
    std::fs::copy(repo().join("scripts/image.sh"), t.join("scripts/image.sh")).unwrap();
    std::fs::write(
        t.join("Cargo.toml"),
        "[workspace.package]\nversion = \"9.9.9\"\n",
    )
    .unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(t)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "x"]);
    std::fs::write(t.join("notes.txt"), "local").unwrap();
    std::fs::write(
        t.join("Cargo.toml"),
        "[workspace.package]\nversion = \"9.9.10\"\n",
    )
    .unwrap();
    let out = Command::new(t.join("scripts/image.sh"))
        .arg(t.join("out"))
        .env_remove("INTERLOCK_IMAGE_ALLOW_DIRTY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refusing") && err.contains("notes.txt") && err.contains("Cargo.toml"),
        "{err}"
    );
    assert!(
        !t.join("out").exists(),
        "it built something before refusing"
    );
}

/// `make release`: the image's binaries under versioned names for this triple, the image
/// archive, and SHA256SUMS that `sha256sum -c` accepts; each binary reports the version.
#[test]
fn make_release_lays_out_versioned_binaries_the_image_and_their_checksums() {
    let b = built();
    let dist = tempfile::tempdir().unwrap();
    let out = Command::new(repo().join("scripts/release.sh"))
        .arg(dist.path())
        .arg(&b.rootfs)
        .arg(&b.archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version = env!("CARGO_PKG_VERSION");
    let host =
        String::from_utf8(Command::new("rustc").arg("-vV").output().unwrap().stdout).unwrap();
    let triple = host.lines().find_map(|l| l.strip_prefix("host: ")).unwrap();
    let agent = dist.path().join(format!("interlock-{version}-{triple}"));
    let cni = dist
        .path()
        .join(format!("interlock-cni-{version}-{triple}"));
    let sums = std::fs::read_to_string(dist.path().join("SHA256SUMS")).unwrap();
    let listed: Vec<&str> = sums
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(listed.len(), 3, "{sums}");
    for f in [&agent, &cni] {
        assert!(
            listed.contains(&f.file_name().unwrap().to_str().unwrap()),
            "{sums}"
        );
    }
    assert!(
        listed
            .iter()
            .any(|f| f.starts_with(&format!("interlock-{version}-")) && f.ends_with(".oci.tar")),
        "{sums}"
    );
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(dist.path())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    // A corrupted file fails the check: the sums are of these files, not recomputed.
    let image = dist.path().join(listed[2]);
    let mut bytes = std::fs::read(&image).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&image, bytes).unwrap();
    let check = Command::new("sha256sum")
        .args(["--check", "--quiet", "SHA256SUMS"])
        .current_dir(dist.path())
        .output()
        .unwrap();
    assert!(
        !check.status.success(),
        "a corrupted archive passed the check"
    );
    // The binaries report the version.
    let v = Command::new(&agent).arg("--version").output().unwrap();
    assert!(
        String::from_utf8_lossy(&v.stdout).starts_with(&format!("interlock {version}")),
        "{}",
        String::from_utf8_lossy(&v.stdout)
    );
    let v = Command::new(&cni)
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    assert!(
        answer["interlockVersion"]
            .as_str()
            .unwrap()
            .starts_with(version),
        "{answer}"
    );
}

/// Replaces every occurrence of `from` in the strings of `v` with `to`.
fn replace_in_strings(v: &mut serde_json::Value, from: &str, to: &str) {
    match v {
        serde_json::Value::String(s) => *s = s.replace(from, to),
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| replace_in_strings(x, from, to)),
        serde_json::Value::Object(o) => {
            o.values_mut().for_each(|x| replace_in_strings(x, from, to))
        }
        _ => {}
    }
}

/// A port free on both loopback addresses the pod uses.
fn free_port(hosts: &[&str]) -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        if hosts
            .iter()
            .all(|h| std::net::TcpListener::bind((*h, port)).is_ok())
        {
            return port;
        }
    }
}

/// The image run for real, as the DaemonSet runs it (ux-3 finding 2): `make image`'s
/// archive imported into the test kit's containerd, and the agent started from it over
/// CRI with what `interlock manifests` renders — the DaemonSet's securityContext
/// (capabilities dropped to the three, seccomp RuntimeDefault, read-only root, not
/// privileged, no privilege escalation), hostNetwork, its hostPath and ConfigMap mounts
/// and environment, its memory limit — taken from the rendered YAML by the test kit's
/// kubelet, which refuses any field it does not apply. Rendered with the node's own conf
/// dir, bin dir and CRI socket (`--set`) and a free health port; the state dir, which the
/// manifests mount at the same path on both sides, is moved to the node's as a whole. The
/// one thing the kubelet adds that the manifests do not name, the service account's
/// credentials, is a kubeconfig for the fake API (mounted read-only, `KUBECONFIG`),
/// carrying a token of the DaemonSet's service account on this node.
///
/// The agent in the image must: pass the manifest's readiness probe, install its plugin
/// (the image's bytes) into the node's bin dir and its config into the conf dir, clear the
/// node's startup taint with `InterlockReady=True`, protect a meshed pod the same
/// containerd then starts (a connection from the pod lands on the proxy port; an
/// unmeshed pod's does not), and stop cleanly on the runtime's SIGTERM.
#[test]
fn the_agent_in_the_image_protects_a_pod_as_the_daemonset_runs_it() {
    interlock_testkit::require_root!();
    use interlock_testkit_node::kubeapi::UserInfo;
    use interlock_testkit_node::kubelet::{run_daemonset_pod, PodContext};
    use interlock_testkit_node::node::{Capture, Node, NodeOptions, NODE_NAME, TAINT_NOT_READY};
    use std::time::{Duration, Instant};
    let b = built();
    let image_cni = b.rootfs.join("usr/local/bin/interlock-cni");
    let node = Node::start(
        NodeOptions::new(b.rootfs.join("usr/local/bin/interlock"), &image_cni).with_kube(),
    )
    .unwrap();
    node.write_primary().unwrap();
    let kit = node.containerd();

    // The archive into the node's containerd, as `ctr images import` loads it.
    let out = Command::new("ctr")
        .arg("--address")
        .arg(kit.socket())
        .args(["-n", "k8s.io", "images", "import"])
        .arg(&b.archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The manifests, rendered for this node.
    let host_ip = "127.0.0.2";
    let port = free_port(&["127.0.0.1", host_ip]);
    let mut docs = render(
        &b.rootfs,
        &[
            format!("cniConfDir={}", kit.conf_dir().display()),
            format!("cniBinDir={}", kit.bin_dir().display()),
            format!("criSocket={}", kit.socket().display()),
            format!("healthPort={port}"),
        ],
    );
    let image = manifest_image(&docs);
    let listed = Command::new("ctr")
        .arg("--address")
        .arg(kit.socket())
        .args(["-n", "k8s.io", "images", "ls", "-q"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .any(|l| l == image),
        "the archive did not load as {image}: {}",
        String::from_utf8_lossy(&listed.stdout)
    );
    // The state dir: the same path on the host and in the container (the plugin, run on
    // the host, finds the agent's socket by the path the agent writes); moved whole.
    let ds = daemonset(&docs).clone();
    let state = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "state")
        .expect("a state volume")["hostPath"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    let mounted_at = ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "state")
        .unwrap()["mountPath"]
        .clone();
    assert_eq!(mounted_at, state.as_str(), "the state dir's paths differ");
    let node_state = node.state_dir();
    for d in docs.iter_mut() {
        replace_in_strings(d, &state, node_state.to_str().unwrap());
    }
    let ds = daemonset(&docs).clone();
    let namespace = ds["metadata"]["namespace"].as_str().unwrap().to_string();
    let account = ds["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap()
        .to_string();
    let config_maps: Vec<serde_json::Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .cloned()
        .collect();

    // The service account's credentials: a kubeconfig for the fake API.
    let api = node.api().unwrap();
    let secrets = kit.dir().join("agent-pod-secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    api.add_token(
        "image-test-agent",
        UserInfo::service_account(&namespace, &account, Some(NODE_NAME)),
    );
    api.write_kubeconfig_with_token(&secrets.join("kubeconfig"), "image-test-agent")
        .unwrap();
    // The in-cluster mount carries the cluster's CA (ca.crt), and the image has no system
    // CA bundle: without a CA in the kubeconfig the client finds no roots at all.
    let kubeconfig = std::fs::read_to_string(secrets.join("kubeconfig")).unwrap();
    let ca = test_ca(&secrets);
    let kubeconfig = kubeconfig.replacen(
        "    server: ",
        &format!("    certificate-authority-data: {ca}\n    server: "),
        1,
    );
    std::fs::write(secrets.join("kubeconfig"), kubeconfig).unwrap();
    // The manifests' RBAC and node-scope policy, as the API server holds them.
    for d in &docs {
        if [
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
        .contains(&d["kind"].as_str().unwrap_or_default())
        {
            api.put_object(d.clone());
        }
    }
    let ctx = PodContext {
        node_name: NODE_NAME.to_string(),
        host_ip: host_ip.to_string(),
        pod_name: interlock_testkit::unique("interlock-node"),
        pod_uid: format!("uid-{}", interlock_testkit::unique("agent")),
        host_paths: Default::default(),
        pod_dir: kit.dir().join("agent-pod"),
        extra_mounts: vec![(secrets.clone(), "/var/run/secrets/interlock-test".into())],
        extra_env: vec![(
            "KUBECONFIG".into(),
            "/var/run/secrets/interlock-test/kubeconfig".into(),
        )],
    };
    let cri = node.cri();
    let started = Instant::now();
    let pod = node
        .block_on(run_daemonset_pod(&cri, &ds, &config_maps, &ctx))
        .unwrap_or_else(|e| panic!("running the DaemonSet's pod: {e}\n{}", kit.log_tail()));
    let status = || {
        let cri = cri.clone();
        let id = pod.container_id.clone();
        node.block_on(async move { cri.container_status(&id).await })
            .unwrap()
    };
    let explain = || format!("container: {:?}\nagent log:\n{}", status(), pod.log(&ctx));
    // What the container got is what the manifests say.
    assert_eq!(pod.env["NODE_NAME"], NODE_NAME);
    assert_eq!(pod.env["POD_NAMESPACE"], namespace);
    assert_eq!(
        pod.env["INTERLOCK_PLUGIN_SOURCE"],
        "/usr/local/bin/interlock-cni"
    );
    assert_eq!(
        pod.env["INTERLOCK_HEALTH_ADDR"],
        format!("{host_ip}:{port}")
    );
    let sc = &ds["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], true);

    // Ready by the manifest's own readiness probe.
    let deadline = Instant::now() + Duration::from_secs(60);
    while pod.probe("readinessProbe") != Some(true) {
        assert!(
            status().running(),
            "the agent's container is not running\n{}",
            explain()
        );
        assert!(
            Instant::now() < deadline,
            "not ready within 60 s\n{}",
            explain()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ready_in = started.elapsed();
    assert_eq!(pod.probe("livenessProbe"), Some(true), "{}", explain());
    // The securityContext as the kernel holds it for the agent's process: exactly the
    // three capabilities, a seccomp filter, no new privileges, the root mounted read-only.
    let pid = agent_pid(&pod.container_id).unwrap_or_else(|| panic!("no process\n{}", explain()));
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| {
        proc_status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .unwrap_or_else(|| panic!("{k} not in /proc/{pid}/status"))
            .trim()
            .to_string()
    };
    // CAP_NET_ADMIN 12, CAP_NET_RAW 13, CAP_SYS_ADMIN 21.
    let caps = (1u64 << 12) | (1 << 13) | (1 << 21);
    assert_eq!(
        u64::from_str_radix(&field("CapEff"), 16).unwrap(),
        caps,
        "CapEff"
    );
    assert_eq!(
        u64::from_str_radix(&field("CapBnd"), 16).unwrap(),
        caps,
        "CapBnd"
    );
    assert_eq!(field("Seccomp"), "2", "no seccomp filter");
    assert_eq!(field("NoNewPrivs"), "1");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .unwrap();
    assert!(
        root.split_whitespace()
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "the root is not read-only: {root}"
    );
    // hostNetwork: the agent's network namespace is the host's (this test's).
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap(),
        std::fs::read_link("/proc/self/ns/net").unwrap()
    );
    // The plugin, the image's own bytes, in the node's bin dir; its config first in the
    // conf dir, naming the node's state dir.
    assert_eq!(
        std::fs::read(kit.bin_dir().join("interlock-cni")).unwrap(),
        std::fs::read(&image_cni).unwrap(),
        "the installed plugin is not the image's"
    );
    let conf: serde_json::Value = serde_json::from_slice(
        &std::fs::read(kit.conf_dir().join("00-interlock.conflist"))
            .unwrap_or_else(|e| panic!("no 00-interlock.conflist: {e}\n{}", explain())),
    )
    .unwrap();
    let ours = conf["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "interlock-cni")
        .unwrap_or_else(|| panic!("no interlock-cni entry: {conf}"));
    assert!(
        ours.to_string().contains(node_state.to_str().unwrap()),
        "{ours}"
    );
    // The node's gate clears.
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.taints().iter().any(|t| t == TAINT_NOT_READY)
        || node.condition().map(|c| c["status"] == "True") != Some(true)
    {
        assert!(
            Instant::now() < deadline,
            "the gate did not clear: taints {:?}, condition {:?}\n{}",
            node.taints(),
            node.condition(),
            explain()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A meshed pod is protected, proven by a connection; an unmeshed one is left alone.
    let meshed = node
        .run_pod("imgm", true)
        .unwrap_or_else(|e| panic!("{e}\n{}", explain()));
    assert_eq!(node.capture(&meshed), Capture::Redirected, "{}", explain());
    let plain = node.run_pod("imgp", false).unwrap();
    assert_eq!(node.capture(&plain), Capture::NotRedirected);
    // The metrics listener on the host IP, as Prometheus scrapes it.
    let metrics = std::net::TcpStream::connect((host_ip, port));
    assert!(metrics.is_ok(), "no listener on {host_ip}:{port}");
    // SIGTERM from the runtime: a clean exit within the grace period.
    let cri2 = cri.clone();
    let id = pod.container_id.clone();
    let grace = pod.grace_seconds;
    node.block_on(async move { cri2.stop_container(&id, grace).await })
        .unwrap();
    let end = status();
    assert_eq!(
        (end.state.as_str(), end.exit_code),
        ("CONTAINER_EXITED", 0),
        "{}",
        explain()
    );
    eprintln!("the agent in the image was ready {ready_in:?} after its container was created");
}

/// The PID of the process of container `id` (its cgroup names the container).
fn agent_pid(id: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        (cgroup.contains(id) && cmdline.starts_with(b"/usr/local/bin/interlock\0agent"))
            .then_some(pid)
    })
}

/// A self-signed CA certificate (base64 PEM), as a cluster's `ca.crt`.
fn test_ca(dir: &Path) -> String {
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=interlock-image-test"])
        .arg("-keyout")
        .arg(dir.join("ca.key"))
        .arg("-out")
        .arg(dir.join("ca.crt"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b64 = Command::new("base64")
        .args(["-w0"])
        .arg(dir.join("ca.crt"))
        .output()
        .unwrap();
    String::from_utf8(b64.stdout).unwrap()
}
