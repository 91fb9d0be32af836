//! A createRuntime hook killed midway under a real containerd (1.7.24 and
//! 2.1.9: the suite runs under both). The hook is killed with SIGKILL right
//! after a step of the VF's attach (its state saved, its netdev moved into
//! the pod's netns, the netdev configured), so the container does not start;
//! runc then destroys it and runs its poststop. Kubelet creates the container
//! again (a new attempt, the failed one still listed) and that one must get
//! the VF as `net1`; the pod's removal brings the VF home with its name and
//! MAC and releases every claim.
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

const MAC: &str = "02:00:00:de:0c:02";

/// A hook that runs the real one, killed after the attach's step `point` at
/// its first createRuntime (its fault injection, `DEVGATE_HOOK_FAULT`),
/// whole after.
fn killed_once_hook(dir: &Path, point: &str) -> String {
    let mark = dir.join("killed");
    stand_in::wrapped_hook(dir, |real| {
        format!(
            "if [ \"$1\" = createRuntime ] && [ ! -e {mark} ]; then\n\
             : > {mark}\n\
             DEVGATE_HOOK_FAULT=abort-after:{point} exec {real} \"$@\"\n\
             fi\n\
             exec {real} \"$@\"\n",
            mark = mark.display(),
            real = real.display()
        )
    })
}

#[test]
fn a_hook_killed_midway_fails_the_start_and_the_next_attempt_gets_the_vf() {
    require_root();
    // Each its own names: a veth name is used once per test binary.
    for (point, tag) in [("save", "s"), ("move", "m"), ("configure", "c")] {
        killed_at(point, tag);
    }
}

fn killed_at(point: &str, tag: &str) {
    let dir = tempfile::tempdir().unwrap();
    let hook = killed_once_hook(dir.path(), point);
    let node = Node::start_full(
        HostRootBuilder::hgx().vf_netdev_prefix(&format!("dgk{tag}")),
        &format!("hook_path = \"{hook}\"\n"),
        &[],
    );
    let stand_in = StandIn::new(&node, &format!("dgk{tag}peer"), MAC);
    let host_name = &stand_in.host_name;
    let cri = node.cri();
    let pod = cri
        .run_pod(&stand_in.pod("vf-killed-hook"))
        .expect("RunPodSandbox");

    let first = cri
        .create_container(&pod, &ContainerSpec::shell("main", "sleep 300"))
        .expect("CreateContainer");
    let err = cri
        .start_container(&first)
        .expect_err("the container started with its hook killed");
    assert!(
        dir.path().join("killed").exists(),
        "the hook never ran: {err:?}"
    );
    // runc ran the poststop of the container it destroyed: the VF is home.
    let home = wait_for("the vf back on the host", SLOW, || {
        link(In::Host, host_name)
    });
    assert_eq!(home.address.as_deref(), Some(MAC));

    // Kubelet's next attempt, the failed container not yet removed.
    let retry = ContainerSpec::shell("main", "sleep 300").edit(|c| {
        if let Some(m) = c.metadata.as_mut() {
            m.attempt = 1;
        }
    });
    let second = cri
        .create_container(&pod, &retry)
        .expect("CreateContainer, second attempt");
    cri.start_container(&second)
        .expect("StartContainer, second attempt");
    let (code, show, err) = cri
        .exec(&second, &["ip", "-o", "link", "show", "net1"])
        .expect("exec");
    assert_eq!(code, 0, "net1 missing in the pod: {show} {err}");
    assert!(show.contains(MAC), "net1 in the pod: {show}");
    assert!(
        link(In::Host, host_name).is_none(),
        "the vf stayed on the host"
    );

    cri.stop_container(&second, 5).expect("StopContainer");
    for id in [&second, &first] {
        cri.remove_container(id).expect("RemoveContainer");
    }
    cri.stop_pod(&pod).expect("StopPodSandbox");
    cri.remove_pod(&pod).expect("RemovePodSandbox");
    let back = wait_for("the vf home again", SLOW, || link(In::Host, host_name));
    assert_eq!(back.address.as_deref(), Some(MAC), "{point}");
    wait_for("claims released", SLOW, || {
        node.ledger().pods.is_empty().then_some(())
    });
    drop(stand_in);
}
