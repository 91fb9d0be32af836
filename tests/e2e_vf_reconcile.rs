//! The plugin's own VF restore, against a real containerd (1.7.24 and 2.1.9: the
//! suite runs under both), for a VF whose poststop never restored it: the plugin
//! was killed, the container stopped with a poststop that did nothing (a runtime
//! crash, a hook killed), and the pod's netns died, which returns a physical VF
//! to the host as `dev<ifindex>` (done here by hand: a veth stand-in would die
//! with the netns). When the plugin is back, Synchronize finds the pod gone and
//! the release restores the VF's name and MAC before dropping the claims.
mod support;

#[path = "hook_netns/net.rs"]
mod net;
#[path = "hook_netns/stand_in.rs"]
mod stand_in;

use std::path::Path;

use devgate::fixture::HostRootBuilder;
use net::{link, In};
use stand_in::StandIn;
use support::node::Node;
use support::{require_root, wait_for, ContainerSpec, SLOW};

const MAC: &str = "02:00:00:de:0c:01";

/// A hook that runs the real one at createRuntime and does nothing at poststop.
fn createruntime_only_hook(dir: &Path) -> String {
    stand_in::wrapped_hook(dir, |real| {
        format!(
            "[ \"$1\" = poststop ] && exit 0\nexec {} \"$@\"\n",
            real.display()
        )
    })
}

#[test]
fn a_vf_poststop_never_restored_comes_back_when_the_plugin_reconciles() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let hook = createruntime_only_hook(dir.path());
    let mut node = Node::start_full(
        HostRootBuilder::hgx().vf_netdev_prefix("dgrc"),
        &format!("hook_path = \"{hook}\"\n"),
        &[],
    );
    let stand_in = StandIn::new(&node, "dgrcpeer", MAC);
    let host_name = &stand_in.host_name;
    let cri = node.cri();
    let pod = cri
        .run_pod(&stand_in.pod("vf-reconcile"))
        .expect("RunPodSandbox");
    let id = cri
        .create_container(&pod, &ContainerSpec::shell("main", "sleep 300"))
        .expect("CreateContainer");
    cri.start_container(&id).expect("StartContainer");
    let netns = cri.netns_path(&id).expect("spec");
    let net_arg = format!("--net={netns}");
    let in_pod = |args: &[&str]| {
        let mut cmd = vec!["nsenter", net_arg.as_str()];
        cmd.extend_from_slice(args);
        net::sh(&cmd)
    };
    assert!(in_pod(&["ip", "-o", "link", "show", "net1"]).contains(MAC));
    assert!(link(In::Host, host_name).is_none());

    node.plugin.kill();
    cri.stop_container(&id, 5).expect("StopContainer");
    cri.remove_container(&id).expect("RemoveContainer");
    // poststop did nothing: the VF is still the pod's net1.
    let show = in_pod(&["ip", "-o", "link", "show", "net1"]);
    let ifindex = show.split(':').next().unwrap().trim().to_string();
    let fallback = format!("dev{ifindex}");
    in_pod(&["ip", "link", "set", "net1", "netns", "1", "name", &fallback]);
    cri.stop_pod(&pod).expect("StopPodSandbox");
    cri.remove_pod(&pod).expect("RemovePodSandbox");
    assert!(link(In::Host, &fallback).is_some());
    assert_eq!(
        node.ledger().pods.len(),
        1,
        "claims kept while devgate is down"
    );

    node.plugin.respawn(&node.ctrd);
    node.plugin.wait_registered(&node.ctrd, SLOW);
    let back = wait_for("the plugin to restore the vf", SLOW, || {
        link(In::Host, host_name)
    });
    assert_eq!(back.address.as_deref(), Some(MAC));
    assert!(link(In::Host, &fallback).is_none());
    wait_for("claims released", SLOW, || {
        node.ledger().pods.is_empty().then_some(())
    });
    let saved = node.state_dir().join("vf");
    // The per-VF lock files stay (they are reused); the records go.
    let left: Vec<_> = std::fs::read_dir(&saved)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        !left.iter().any(|n| n.to_string_lossy().ends_with(".json")),
        "saved VF state left: {left:?}"
    );
    drop(stand_in);
}
