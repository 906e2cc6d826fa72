//! `interlock manifests [-f values.yaml] [--set key=value …]`: the Kubernetes objects
//! that install interlock — the source of truth (`deploy/base/interlock.yaml` is the
//! default rendering, kept identical by a test, and the kustomize base of `deploy/`).
//! The settings are validated in [`values`]; the objects are built typed in [`objects`],
//! so tests check the fields that matter and validate every object against the
//! Kubernetes schemas.

pub mod objects;
pub mod values;

use clap::Args;
use std::path::PathBuf;
pub use values::Values;

/// The ConfigMap of the agents' `INTERLOCK_*` settings (`check cluster` reads guard mode
/// from it).
pub const AGENT_CONFIG_MAP: &str = "interlock-config";

/// `interlock manifests` flags.
#[derive(Debug, Args)]
pub struct ManifestsArgs {
    /// A values file: a YAML map of settings (repeatable, applied in order; an unknown
    /// key is an error naming it and the file). Every key is listed in docs/install.md.
    #[arg(short = 'f', long = "values", value_name = "FILE")]
    values: Vec<PathBuf>,
    /// A setting, `key=value` (repeatable, after the values files): e.g. image,
    /// namespace, configMode, runtime, nodeSelector.<label>, tolerations=<YAML list>;
    /// every key is listed in docs/install.md.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// The objects, as one YAML stream.
pub fn render(v: &Values) -> String {
    let mut out = String::from(
        "# interlock: the node agent and the interlock-cni plugin, as a DaemonSet.\n\
         # Rendered by `interlock manifests` (the source of truth); change settings with\n\
         # `interlock manifests -f values.yaml --set key=value … | kubectl apply -f -`.\n",
    );
    for (i, o) in objects::objects(v).into_iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        for line in o.comment.lines() {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&o.yaml);
    }
    out
}

/// The settings from the values files, then `--set`.
pub fn values(files: &[PathBuf], set: &[String]) -> Result<Values, String> {
    let mut v = Values::default();
    for f in files {
        v.apply_file(f)?;
    }
    for kv in set {
        v.set(kv)?;
    }
    v.check()?;
    Ok(v)
}

/// Runs `interlock manifests`.
pub fn run(a: ManifestsArgs) -> anyhow::Result<std::process::ExitCode> {
    let v = values(&a.values, &a.set).map_err(|e| anyhow::anyhow!("{e}"))?;
    for w in v.warnings() {
        eprintln!("interlock manifests: warning: {w}");
    }
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(render(&v).as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(std::process::ExitCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_validated_with_a_message_naming_the_key() {
        let mut v = Values::default();
        for (kv, needle) in [
            ("image=interlock:dev", "full reference"),
            ("image=ghcr.io/x/interlock", "tag or digest"),
            ("image=ghcr.io/x/interlock@sha256:abc", "tag or digest"),
            ("configMode=inline", "owned, chain"),
            ("runtime=docker", "containerd, crio"),
            ("repairPolicy=kill", "repair, restart"),
            ("taintEffect=NoWay", "NoSchedule"),
            ("profiles=kuma", "istio, linkerd, consul, generic"),
            ("excludeNamespaces=Kube_System", "namespace name"),
            ("cniConfDir=etc/cni", "absolute"),
            ("healthPort=80", "1024"),
            ("podMonitor=yes", "true or false"),
            ("nope=1", "unknown setting"),
            ("image", "key=value"),
        ] {
            let e = v.set(kv).unwrap_err();
            assert!(e.contains(needle), "{kv}: {e}");
        }
        assert_eq!(v, Values::default(), "a refused setting changes nothing");
        v.set("image=registry.example.com:5000/team/interlock@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
            .unwrap();
        v.set("image=localhost/interlock:test").unwrap();
        v.set("profiles=linkerd, istio").unwrap();
        assert_eq!(v.profiles, ["linkerd", "istio"]);
        v.set("runtime=crio").unwrap();
        assert_eq!(v.cri_socket(), "/var/run/crio/crio.sock");
        assert_eq!(v.cri_socket_dir(), "/var/run/crio");
    }

    #[test]
    fn the_default_image_is_a_full_reference_with_this_version() {
        let v = Values::default();
        assert!(v.image.starts_with("ghcr.io/"), "{}", v.image);
        assert!(v
            .image
            .ends_with(&format!(":v{}", interlock_buildinfo::CRATE_VERSION)));
        let mut w = Values::default();
        w.set(&format!("image={}", v.image)).unwrap();
    }
}
