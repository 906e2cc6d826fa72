//! `mesh-standin`: installed as `istio-cni`, `linkerd-cni`, `consul-cni` or `kuma-cni` it
//! is that mesh's CNI plugin stand-in (see `interlock_mesh_standins::plugin`);
//! `mesh-standin install <mesh> …` is that mesh's installer stand-in
//! (`interlock_mesh_standins::install`).

fn main() -> std::process::ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let code = if argv.first().map(String::as_str) == Some("install") {
        let source = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
        match interlock_mesh_standins::install::parse(&argv[1..], source) {
            Ok(o) => interlock_mesh_standins::install::run(o),
            Err(e) => {
                eprintln!("{e}");
                2
            }
        }
    } else {
        interlock_mesh_standins::plugin::main()
    };
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
