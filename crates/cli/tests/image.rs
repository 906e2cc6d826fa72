//! The image's build steps, without a container engine: the Dockerfile runs
//! `scripts/image-rootfs.sh`; this test runs it too and checks the filesystem it lays
//! out — both binaries there, static (`file`, `ldd`), answering with this build.

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// Lays out the image's filesystem with the script the Dockerfile runs, in a temp dir.
fn image_rootfs() -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(repo().join("scripts/image-rootfs.sh"))
        .arg(out.path())
        .env("CARGO", env!("CARGO"))
        .status()
        .unwrap();
    assert!(status.success(), "scripts/image-rootfs.sh failed");
    out
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
    let out = image_rootfs();
    let bin = out.path().join("usr/local/bin");
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
    let out = image_rootfs();
    let plugin = out.path().join("usr/local/bin/interlock-cni");
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
        .find(|(n, _)| n.contains("interlock_nft7netlink6SHARED"))
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
    let out = image_rootfs();
    let root = out.path();
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
