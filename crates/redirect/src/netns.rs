//! Entering a pod's network namespace.
//!
//! `setns(2)` changes the namespace of the calling *thread*. Doing it on a thread that
//! also serves other work (a tokio worker, the plugin's main thread) would leak the pod's
//! namespace into that work, so [`in_netns`] always runs the closure on a dedicated,
//! short-lived thread that enters the namespace first and is discarded afterwards. Never
//! hold such a thread across an `.await`. Sockets created inside stay bound to the pod's
//! namespace wherever they are used later; processes spawned inside inherit it.
//!
//! Only a pod's namespace is ever entered ([`PodNetns::open`]): the path is opened
//! without blocking (`O_NONBLOCK`, so a FIFO cannot stall DEL) and must be a namespace
//! file (`nsfs`) of a network namespace that is neither the caller's own nor PID 1's.
//! A runtime that passes the host's namespace by mistake (`/proc/self/ns/net`, a path to
//! the node's netns) would otherwise get every outbound connection of the node redirected.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sched::CloneFlags;

/// The calling thread's own network namespace.
const OWN_NETNS: &str = "/proc/thread-self/ns/net";
/// PID 1's network namespace: the host's, when the caller runs in the host's PID namespace.
const INIT_NETNS: &str = "/proc/1/ns/net";

/// A network namespace's identity: the device and inode of its `nsfs` file, the same for
/// every path (bind mount, `/proc/<pid>/ns/net`) that names it while it exists. The kernel
/// may reuse the inode once the namespace is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NetnsId {
    /// `st_dev` of the namespace file.
    pub dev: u64,
    /// `st_ino` of the namespace file.
    pub ino: u64,
}

impl NetnsId {
    fn of(m: &std::fs::Metadata) -> NetnsId {
        NetnsId {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

impl std::fmt::Display for NetnsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.dev, self.ino)
    }
}

impl std::str::FromStr for NetnsId {
    type Err = String;
    /// Parses the [`Display`](std::fmt::Display) form, `<dev>-<ino>`.
    fn from_str(s: &str) -> Result<NetnsId, String> {
        let (dev, ino) = s
            .split_once('-')
            .ok_or_else(|| format!("{s:?} is not a netns id (<dev>-<ino>)"))?;
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|e| format!("{s:?} is not a netns id (<dev>-<ino>): {e}"))
        };
        Ok(NetnsId {
            dev: num(dev)?,
            ino: num(ino)?,
        })
    }
}

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
    /// The path is not a network namespace: not a namespace file at all (a FIFO, a
    /// directory, the empty file an unmounted netns leaves behind) or a namespace of
    /// another type.
    #[error("{path} is not a network namespace ({what}): the runtime must pass the pod's network namespace in CNI_NETNS")]
    NotNamespace {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        what: String,
    },
    /// The path names the caller's own network namespace, or PID 1's: the host's.
    #[error("{path} is {whose} network namespace, not a pod's: refusing to touch it (pod redirect rules there would capture every outbound connection of the node); the runtime must pass the pod's network namespace in CNI_NETNS")]
    NotAPod {
        /// The path.
        path: PathBuf,
        /// Whose namespace it is (`this process's own`, `PID 1's (the host's)`).
        whose: &'static str,
    },
    /// `setns` refused (missing CAP_SYS_ADMIN?).
    #[error("cannot enter network namespace {path} (do we have CAP_SYS_ADMIN?): {source}")]
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

    /// True when there is no network namespace behind the path (any more): the file is
    /// missing, or it is not a network namespace (the bind mount was removed, leaving an
    /// empty file; or it never was one). Nothing of interlock's can be there, so DEL is
    /// done. The caller's own (or the host's) namespace is not "gone": it is refused.
    pub fn is_gone(&self) -> bool {
        matches!(
            self,
            NetnsError::NotFound { .. } | NetnsError::NotNamespace { .. }
        )
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

/// A pod's network namespace, opened and checked ([`PodNetns::open`]): kept open so that
/// one caller can take its identity, lock its record and enter it without opening and
/// checking it again.
#[derive(Debug)]
pub struct PodNetns {
    path: PathBuf,
    file: File,
    own: File,
    id: NetnsId,
}

impl PodNetns {
    /// Opens `path` as a pod's network namespace: without blocking, a namespace file, not
    /// the caller's own nor PID 1's (the type is checked on entry).
    pub fn open(path: &Path) -> Result<PodNetns, NetnsError> {
        let (file, own, id) = open_pod_netns(path)?;
        Ok(PodNetns {
            path: path.to_path_buf(),
            file,
            own,
            id,
        })
    }

    /// Its identity.
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` inside it, as [`in_netns`] does.
    pub fn run<R, F>(&self, f: F) -> Result<R, NetnsError>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let path = self.path.as_path();
        if ON_CALLING_THREAD.load(Ordering::Relaxed) {
            return here(path, &self.file, &self.own, f);
        }
        let file = &self.file;
        std::thread::scope(|s| {
            let handle = std::thread::Builder::new()
                .name("il-netns".into())
                .spawn_scoped(s, move || -> Result<R, NetnsError> {
                    enter(path, file)?;
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
}

/// Runs `f` on a dedicated thread that has entered the network namespace at `path` (a
/// bind-mounted netns file such as `/var/run/netns/x` or `/proc/<pid>/ns/net`). The calling
/// thread's namespace is untouched. A panic in `f` is propagated. (After
/// [`enter_on_calling_thread`]: on the calling thread, which is back in its own namespace
/// when this returns.) Only a pod's namespace is entered ([`PodNetns::open`]).
pub fn in_netns<R, F>(path: &Path, f: F) -> Result<R, NetnsError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    PodNetns::open(path)?.run(f)
}

/// `setns` into the namespace `target` (already known to be a namespace file); a
/// namespace of another type is [`NetnsError::NotNamespace`].
fn enter(path: &Path, target: &File) -> Result<(), NetnsError> {
    nix::sched::setns(target, CloneFlags::CLONE_NEWNET).map_err(|source| match source {
        nix::Error::EINVAL => NetnsError::NotNamespace {
            path: path.to_path_buf(),
            what: "a namespace of another type".into(),
        },
        source => NetnsError::Enter {
            path: path.to_path_buf(),
            source,
        },
    })
}

/// [`in_netns`] on the calling thread: enter, run, go back to `home` (its own namespace).
fn here<R>(
    path: &Path,
    target: &File,
    home: &File,
    f: impl FnOnce() -> R,
) -> Result<R, NetnsError> {
    enter(path, target)?;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    // Going back to a namespace this thread was just in, with the privilege that entering
    // the pod's took, cannot fail short of a kernel bug; staying in the pod's namespace
    // would silently move everything after into it, so that is not survivable.
    if let Err(e) = nix::sched::setns(home, CloneFlags::CLONE_NEWNET) {
        panic!(
            "cannot return from network namespace {}: {e}",
            path.display()
        );
    }
    result.map_err(|panic| std::panic::resume_unwind(panic))
}

/// The identity of the pod network namespace at `path`, with the same checks as
/// [`in_netns`] (a namespace file, not the caller's own nor PID 1's); the type of the
/// namespace is only checked on entry.
pub fn pod_netns_id(path: &Path) -> Result<NetnsId, NetnsError> {
    open_pod_netns(path).map(|(_, _, id)| id)
}

/// The calling thread's netns, as `SIOCGSKNS` gives it for a fresh socket (sockets are
/// made in the creating thread's netns): what opening [`OWN_NETNS`] gives, without the
/// procfs walk, which in a new process first builds the process's `/proc` entries (the
/// plugin is a new process on every ADD). `None` where the kernel refuses it
/// (it wants `CAP_NET_ADMIN`; before Linux 4.10 it does not know it): open the file then.
fn own_netns_of_socket() -> Option<File> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    const SIOCGSKNS: libc::c_ulong = 0x894C;
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    // SAFETY: SIOCGSKNS takes no argument; on success it returns a new descriptor (opened
    // O_CLOEXEC by the kernel) that nothing else owns, and it is owned from here on.
    #[allow(unsafe_code)]
    unsafe {
        let fd = libc::ioctl(sock.as_raw_fd(), SIOCGSKNS as _);
        (fd >= 0).then(|| File::from(OwnedFd::from_raw_fd(fd)))
    }
}

/// Opens `path` as a pod's network namespace without blocking, and the caller's own
/// namespace file (to return to, and to compare with); and the pod namespace's identity.
/// Refuses what is not a namespace file, and the caller's own or PID 1's namespace.
fn open_pod_netns(path: &Path) -> Result<(File, File, NetnsId), NetnsError> {
    let open_err = |p: &Path, source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::NotFound {
            NetnsError::NotFound {
                path: p.to_path_buf(),
            }
        } else {
            NetnsError::Open {
                path: p.to_path_buf(),
                source,
            }
        }
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| open_err(path, e))?;
    let own = match own_netns_of_socket() {
        Some(own) => own,
        None => File::open(OWN_NETNS).map_err(|e| open_err(Path::new(OWN_NETNS), e))?,
    };
    let meta = |f: &File, p: &Path| f.metadata().map_err(|e| open_err(p, e));
    let (m, own_m) = (meta(&file, path)?, meta(&own, Path::new(OWN_NETNS))?);
    let ns_fs = nix::sys::statfs::fstatfs(&file)
        .map(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
        .unwrap_or(false);
    if !ns_fs {
        let t = m.file_type();
        let what = if t.is_fifo() {
            "a FIFO"
        } else if t.is_dir() {
            "a directory"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else if t.is_socket() {
            "a socket"
        } else if m.len() == 0 {
            "an empty file: a network namespace's bind mount that was removed leaves one"
        } else {
            "a regular file"
        };
        return Err(NetnsError::NotNamespace {
            path: path.to_path_buf(),
            what: what.into(),
        });
    }
    let id = NetnsId::of(&m);
    if id == NetnsId::of(&own_m) {
        return Err(NetnsError::NotAPod {
            path: path.to_path_buf(),
            whose: "this process's own",
        });
    }
    // Unreadable without root or in another PID namespace: the own-namespace check
    // above still holds.
    if std::fs::metadata(INIT_NETNS).is_ok_and(|init| NetnsId::of(&init) == id) {
        return Err(NetnsError::NotAPod {
            path: path.to_path_buf(),
            whose: "PID 1's (the host's)",
        });
    }
    Ok((file, own, id))
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

    /// The socket's view of the calling thread's netns is the procfs one, on the host and
    /// on a thread that entered another netns.
    #[test]
    fn the_own_netns_from_a_socket_is_the_threads() {
        require_root!();
        use std::os::unix::fs::MetadataExt;
        let via_socket = || {
            own_netns_of_socket()
                .expect("root may ask a socket for its netns")
                .metadata()
                .unwrap()
                .ino()
        };
        assert_eq!(via_socket(), own_netns_inode());
        let ns = Netns::new("nsown").unwrap();
        let target = std::fs::metadata(ns.path()).unwrap().ino();
        let inside = in_netns(&ns.path(), move || (via_socket(), own_netns_inode())).unwrap();
        assert_eq!(inside, (target, target));
        assert_eq!(via_socket(), own_netns_inode());
    }

    #[test]
    fn errors_name_the_path() {
        let e = in_netns(Path::new("/var/run/netns/il-does-not-exist"), || ()).unwrap_err();
        assert!(e.is_not_found());
        assert!(
            e.to_string().contains("/var/run/netns/il-does-not-exist"),
            "{e}"
        );
        // Files that are not namespaces: refused before anything is entered, and "gone"
        // for DEL (nothing of interlock's can be there). A FIFO does not block the open.
        let dir = interlock_testkit::tempdir().unwrap();
        let file = dir.path().join("notns");
        std::fs::write(&file, b"x").unwrap();
        let empty = dir.path().join("unmounted");
        std::fs::write(&empty, b"").unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for (p, what) in [
            (&file, "a regular file"),
            (&empty, "an empty file"),
            (&fifo, "a FIFO"),
            (&dir.path().to_path_buf(), "a directory"),
        ] {
            let e = in_netns(p, || ()).unwrap_err();
            assert!(matches!(e, NetnsError::NotNamespace { .. }), "{e}");
            assert!(e.is_gone() && !e.is_not_found());
            let text = e.to_string();
            assert!(
                text.contains(&p.display().to_string()) && text.contains(what),
                "{text}"
            );
        }
    }

    #[test]
    fn refuses_its_own_and_the_hosts_namespace() {
        // Whatever namespace this test runs in (never changed here): its own, by any name.
        for p in ["/proc/self/ns/net", "/proc/thread-self/ns/net"] {
            let e = in_netns(Path::new(p), || panic!("entered {p}")).unwrap_err();
            assert!(
                matches!(
                    e,
                    NetnsError::NotAPod {
                        whose: "this process's own",
                        ..
                    }
                ),
                "{e}"
            );
            assert!(!e.is_gone(), "refused, not gone");
            assert!(e.to_string().contains(p), "{e}");
            assert!(pod_netns_id(Path::new(p)).is_err());
        }
        require_root!();
        // PID 1's, from a thread inside a test netns (where it is not the own one). Some
        // sandboxes deny even root access to PID 1's namespace files; then the plugin
        // cannot compare with it either, and only the own-namespace check applies.
        let ns = Netns::new("nsinit").unwrap();
        if std::fs::metadata(INIT_NETNS).is_ok() {
            let e = ns
                .run(|| in_netns(Path::new(INIT_NETNS), || panic!("entered PID 1's")))
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    NetnsError::NotAPod {
                        whose: "PID 1's (the host's)",
                        ..
                    }
                ),
                "{e}"
            );
        } else {
            eprintln!("{INIT_NETNS} is not readable here: PID 1's namespace not compared");
        }
        // A namespace of another type.
        let e = in_netns(Path::new("/proc/self/ns/mnt"), || ()).unwrap_err();
        assert!(
            matches!(&e, NetnsError::NotNamespace { what, .. } if what.contains("another type")),
            "{e}"
        );
        // A pod's namespace: its identity is the file's, under every name.
        let id = pod_netns_id(&ns.path()).unwrap();
        let m = std::fs::metadata(ns.path()).unwrap();
        assert_eq!((id.dev, id.ino), (m.dev(), m.ino()));
        assert_eq!(id.to_string().parse::<NetnsId>(), Ok(id));
        assert!("12".parse::<NetnsId>().is_err() && "a-1".parse::<NetnsId>().is_err());
    }
}
