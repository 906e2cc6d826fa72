//! `interlock-cni`: reads the CNI environment and stdin, runs the verb, prints the result.

use std::io::{Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    // Even a bug must answer in the protocol: an error object on stdout, details on stderr.
    std::panic::set_hook(Box::new(|info| {
        let _ = writeln!(std::io::stderr(), "interlock-cni: {info}");
        // With panic=abort (release) nothing else will answer; otherwise `run` catches
        // the unwind and answers itself.
        if cfg!(panic = "abort") {
            let _ =
                std::io::stdout().write_all(interlock_cni::internal_error().to_json().as_bytes());
        }
    }));
    let env = interlock_cni::CniEnv::from_process();
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let outcome = interlock_cni::run(&env, &stdin);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&outcome.stdout);
    let _ = out.flush();
    ExitCode::from(u8::try_from(outcome.exit_code).unwrap_or(1))
}
