//! `netns::enter_on_calling_thread` (what the single-threaded plugin binary uses): the
//! closure runs on the calling thread inside the namespace, and the thread is back in its
//! own namespace afterwards, also after an error or a panic inside. Its own test binary,
//! because the switch is process-wide.

use interlock_redirect::netns::{enter_on_calling_thread, in_netns};
use interlock_testkit::{require_root, Netns};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn own_netns_inode() -> u64 {
    std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
}

#[test]
fn calling_thread_enters_and_returns() {
    require_root!();
    let ns = Netns::new("nshere").unwrap();
    let target = std::fs::metadata(ns.path()).unwrap().ino();
    let home = own_netns_inode();
    enter_on_calling_thread();
    let caller = std::thread::current().id();
    let (inside, thread) = in_netns(&ns.path(), || {
        (own_netns_inode(), std::thread::current().id())
    })
    .unwrap();
    assert_eq!((inside, thread), (target, caller));
    assert_eq!(own_netns_inode(), home);

    // A missing namespace is an error before anything moves.
    let e = in_netns(Path::new("/var/run/netns/il-does-not-exist"), || ()).unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert_eq!(own_netns_inode(), home);

    // A panic inside propagates, and the thread is home again when it is caught.
    let caught = std::panic::catch_unwind(|| {
        in_netns(&ns.path(), || panic!("inside the pod")).unwrap();
    });
    assert!(caught.is_err());
    assert_eq!(own_netns_inode(), home);
}
