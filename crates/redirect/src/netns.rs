//! Entering a pod's network namespace.
//!
//! `setns(2)` changes the namespace of the calling *thread*. Doing it on a thread that
//! also serves other work (a tokio worker, the plugin's main thread) would leak the pod's
//! namespace into that work, so [`in_netns`] always runs the closure on a dedicated,
//! short-lived thread that enters the namespace first and is discarded afterwards. Never
//! hold such a thread across an `.await`. Sockets created inside stay bound to the pod's
//! namespace wherever they are used later; processes spawned inside inherit it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sched::CloneFlags;

/// Entering a namespace failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace file does not exist (the pod is gone, or the path is wrong).
    #[error("network namespace {path} does not exist")]
    NotFound {
        /// The namespace file.
        path: PathBuf,
    },
    /// The namespace file exists but cannot be opened.
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        /// The namespace file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `setns` refused (not a network namespace, or missing CAP_SYS_ADMIN).
    #[error("cannot enter network namespace {path} (is it a netns file, and do we have CAP_SYS_ADMIN?): {source}")]
    Enter {
        /// The namespace file.
        path: PathBuf,
        /// Why.
        source: nix::Error,
    },
    /// The worker thread could not be started.
    #[error("cannot start a thread to enter network namespace {path}: {source}")]
    Thread {
        /// The namespace file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl NetnsError {
    /// True when the namespace does not exist (DEL callers treat that as done).
    pub fn is_not_found(&self) -> bool {
        matches!(self, NetnsError::NotFound { .. })
    }

    /// True when there is no namespace behind the path any more: the file is missing, or
    /// it is no longer a namespace (the bind mount was removed, leaving an empty file).
    pub fn is_gone(&self) -> bool {
        match self {
            NetnsError::NotFound { .. } => true,
            NetnsError::Enter { source, .. } => *source == nix::Error::EINVAL,
            _ => false,
        }
    }
}

static ON_CALLING_THREAD: AtomicBool = AtomicBool::new(false);

/// Makes every later [`in_netns`] in this process enter the namespace on the calling
/// thread and return to the thread's own namespace afterwards, instead of starting a
/// thread. Only for a process that is single-threaded while it enters namespaces: the
/// `interlock-cni` binary calls it first thing, which saves a thread start (stack mapping,
/// clone, join) on every pod's ADD. Never call it in the agent.
pub fn enter_on_calling_thread() {
    ON_CALLING_THREAD.store(true, Ordering::Relaxed);
}

/// Runs `f` on a dedicated thread that has entered the network namespace at `path` (a
/// bind-mounted netns file such as `/var/run/netns/x` or `/proc/<pid>/ns/net`). The calling
/// thread's namespace is untouched. A panic in `f` is propagated. (After
/// [`enter_on_calling_thread`]: on the calling thread, which is back in its own namespace
/// when this returns.)
pub fn in_netns<R, F>(path: &Path, f: F) -> Result<R, NetnsError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let file = open_netns(path)?;
    if ON_CALLING_THREAD.load(Ordering::Relaxed) {
        return here(path, &file, f);
    }
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("il-netns".into())
            .spawn_scoped(s, move || -> Result<R, NetnsError> {
                nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| {
                    NetnsError::Enter {
                        path: path.to_path_buf(),
                        source,
                    }
                })?;
                Ok(f())
            })
            .map_err(|source| NetnsError::Thread {
                path: path.to_path_buf(),
                source,
            })?;
        handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// [`in_netns`] on the calling thread: remember its namespace, enter, run, go back.
fn here<R>(path: &Path, target: &File, f: impl FnOnce() -> R) -> Result<R, NetnsError> {
    let home = File::open("/proc/thread-self/ns/net").map_err(|source| NetnsError::Open {
        path: PathBuf::from("/proc/thread-self/ns/net"),
        source,
    })?;
    nix::sched::setns(target, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
        path: path.to_path_buf(),
        source,
    })?;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    // Going back to a namespace this thread was just in, with the privilege that entering
    // the pod's took, cannot fail short of a kernel bug; staying in the pod's namespace
    // would silently move everything after into it, so that is not survivable.
    if let Err(e) = nix::sched::setns(&home, CloneFlags::CLONE_NEWNET) {
        panic!(
            "cannot return from network namespace {}: {e}",
            path.display()
        );
    }
    result.map_err(|panic| std::panic::resume_unwind(panic))
}

fn open_netns(path: &Path) -> Result<File, NetnsError> {
    File::open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            NetnsError::NotFound {
                path: path.to_path_buf(),
            }
        } else {
            NetnsError::Open {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_testkit::{require_root, Netns};

    fn own_netns_inode() -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
    }

    #[test]
    fn runs_inside_and_leaves_caller_alone() {
        require_root!();
        use std::os::unix::fs::MetadataExt;
        let ns = Netns::new("nsent").unwrap();
        let target = std::fs::metadata(ns.path()).unwrap().ino();
        let before = own_netns_inode();
        let inside = in_netns(&ns.path(), own_netns_inode).unwrap();
        assert_eq!(inside, target);
        assert_ne!(inside, before);
        assert_eq!(own_netns_inode(), before);
    }

    #[test]
    fn errors_name_the_path() {
        let e = in_netns(Path::new("/var/run/netns/il-does-not-exist"), || ()).unwrap_err();
        assert!(e.is_not_found());
        assert!(
            e.to_string().contains("/var/run/netns/il-does-not-exist"),
            "{e}"
        );
        // A file that is not a namespace.
        require_root!();
        let dir = interlock_testkit::tempdir().unwrap();
        let p = dir.path().join("notns");
        std::fs::write(&p, b"x").unwrap();
        let e = in_netns(&p, || ()).unwrap_err();
        assert!(matches!(e, NetnsError::Enter { .. }), "{e}");
        assert!(e.is_gone() && !e.is_not_found());
        assert!(e.to_string().contains("notns"), "{e}");
    }
}
