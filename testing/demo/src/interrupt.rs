//! Ctrl-C and SIGTERM: a thread turns either into a flag that the demo checks between
//! steps and in every wait, so it stops at the next step and tears its nodes down in
//! order instead of dying with containerd, sandboxes and netns left behind.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The demo was interrupted (Ctrl-C or SIGTERM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted;

/// Starts listening for SIGINT and SIGTERM; from then on they set the flag instead of
/// ending the process.
pub fn listen() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Registered here, before returning, so no signal falls between the cracks.
    let (mut int, mut term) = runtime.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            runtime.block_on(async {
                loop {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                    INTERRUPTED.store(true, Ordering::SeqCst);
                }
            })
        })?;
    Ok(())
}

/// `Err` once a signal came.
pub fn check() -> Result<(), Interrupted> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err(Interrupted)
    } else {
        Ok(())
    }
}
