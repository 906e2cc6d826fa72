//! `make demo`: nodes in a box. For each of the four race scenarios, two fresh nodes —
//! each a private containerd with a reference primary (`bridge` + `host-local` +
//! `portmap` as `10-calico.conflist`) and a fake Kubernetes API — show the same events
//! without interlock and with it (the real `interlock agent`; in the fourth, a mesh that
//! keeps its own CNI plugin, istio-cni's stand-in, guarded), and print for every pod
//! whether its traffic was redirected, proven by connections from inside it. Exits 1
//! when the "with interlock" side left a meshed pod unprotected; removes everything it
//! created, also on failure or Ctrl-C.

mod capture;
mod check_agrees;
mod interrupt;
mod node_box;
mod pods;
mod report;
mod scenarios;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use node_box::Binaries;
use scenarios::Stop;

const USAGE: &str = "usage: interlock-demo [--bin-dir DIR]   (DIR holds interlock, interlock-cni and mesh-standin; default: next to this binary)";

fn main() -> ExitCode {
    let bins = match binaries() {
        Ok(Some(b)) => b,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("interlock-demo: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = preflight(&bins)
        .and_then(|()| interrupt::listen().map_err(|e| format!("listening for Ctrl-C: {e}")))
    {
        eprintln!("interlock-demo: {e}");
        return ExitCode::from(2);
    }
    println!("interlock demo: four race scenarios on real containerd, without and with interlock");
    println!("(each node: a private containerd, bridge+host-local+portmap as 10-calico.conflist, a fake Kubernetes API;");
    println!(" pods shop/web (Istio sidecar), shop/api (Linkerd proxy), shop/db (no mesh); traffic checked by connecting from inside each pod;");
    println!(" scenario 4 keeps istio-cni, played by a stand-in that writes Istio's rules, and guards it)");
    let mut leftovers = Vec::new();
    // Every node is torn down before this returns, on every path.
    let outcome = scenarios::run_all(&bins, &mut leftovers);
    let code = match outcome {
        Err(Stop::Interrupted) => {
            eprintln!("\ninterrupted: the nodes made so far were torn down");
            ExitCode::from(130)
        }
        Err(Stop::Failed(e)) => {
            eprintln!("\ninterlock-demo failed: {e}");
            ExitCode::FAILURE
        }
        Ok(scenarios) => {
            println!("\n━━ Verdict ━━");
            println!("{}", report::verdict(&scenarios));
            if report::passed(&scenarios) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    };
    if leftovers.is_empty() {
        println!(
            "cleanup: every containerd, sandbox, netns, bridge and directory the demo made is gone"
        );
        code
    } else {
        eprintln!("cleanup left {} thing(s):", leftovers.len());
        for l in &leftovers {
            eprintln!("  {l}");
        }
        ExitCode::FAILURE
    }
}

fn binaries() -> Result<Option<Binaries>, String> {
    let mut bin_dir: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bin-dir" => bin_dir = Some(args.next().ok_or("--bin-dir needs a directory")?.into()),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let dir = match bin_dir {
        Some(d) => d,
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    Ok(Some(Binaries {
        interlock: dir.join("interlock"),
        plugin: dir.join("interlock-cni"),
        mesh_standin: dir.join("mesh-standin"),
    }))
}

/// Says what is missing before anything is created.
fn preflight(bins: &Binaries) -> Result<(), String> {
    if !interlock_testkit::is_root() {
        return Err("the demo runs containerd and creates network namespaces: run it as root (sudo make demo)".into());
    }
    for b in [&bins.interlock, &bins.plugin, &bins.mesh_standin] {
        if !b.is_file() {
            return Err(format!(
                "{} not found: build it first (cargo build --release -p interlock -p interlock-cni -p interlock-mesh-standins)",
                b.display()
            ));
        }
    }
    let plugins = interlock_testkit::cni_plugins_dir();
    for p in interlock_testkit_node::containerd::PRIMARY_PLUGINS {
        if !plugins.join(p).is_file() {
            return Err(format!(
                "the reference CNI plugin {p} is missing in {} (make deps installs containernetworking-plugins)",
                plugins.display()
            ));
        }
    }
    for tool in ["containerd", "ctr", "runc", "setpriv", "gcc"] {
        if !on_path(tool) {
            return Err(format!(
                "{tool} is not on PATH (make deps installs what the demo needs)"
            ));
        }
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(tool).is_file()))
}
