//! The one runtime fault the soak clears instead of counting it against interlock: a
//! libcni result cache that containerd left empty (killed while writing it) makes every
//! DEL of the sandbox fail before any plugin runs. Shown on a real containerd: after the
//! cache is cleared the sandbox is removed, and interlock's state and the pod's address
//! are released like any other pod's.

use std::time::Duration;

use interlock_soak::run::default_bin_dir;
use interlock_soak::workload::clear_unreadable_cni_cache;
use interlock_testkit::require_root;
use interlock_testkit_node::node::{AgentArgs, Node, NodeOptions};

#[test]
fn an_empty_libcni_cache_blocks_the_del_until_cleared_and_then_nothing_leaks() {
    let _turn = crate::one_at_a_time();
    require_root!();
    let bin = default_bin_dir().expect("interlock and interlock-cni built next to the tests");
    let node = Node::start(NodeOptions::new(
        bin.join("interlock"),
        bin.join("interlock-cni"),
    ))
    .expect("start the node in a box");
    node.write_primary().unwrap();
    node.start_agent(AgentArgs::default()).unwrap();
    node.wait_agent_ready(Duration::from_secs(15)).unwrap();
    let pod = node.run_pod("cachefault", true).unwrap();
    assert_eq!(node.state_files().len(), 1);

    // What containerd killed between create and write leaves behind.
    let cache: Vec<_> = std::fs::read_dir("/var/lib/cni/results")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.contains(&format!("-{}-", pod.id)) && name.ends_with("-eth0")
        })
        .collect();
    assert_eq!(cache.len(), 1, "{cache:?}");
    std::fs::write(&cache[0], b"").unwrap();

    let err = node.stop_pod(&pod.id).unwrap_err();
    assert!(err.contains("cached result"), "{err}");
    assert!(
        clear_unreadable_cni_cache(&pod.id, "transport error").is_empty(),
        "only the decode failure clears anything"
    );
    let cleared = clear_unreadable_cni_cache(&pod.id, &err);
    assert_eq!(cleared, [cache[0].display().to_string()]);

    node.remove_pod(&pod).unwrap();
    assert!(node.state_files().is_empty(), "{:?}", node.state_files());
    assert!(
        node.ipam_addresses().is_empty(),
        "{:?}",
        node.ipam_addresses()
    );
}
