//! A pod with its own network namespace gets its SR-IOV VF through the hook
//! devgate injects, against a real containerd (1.7.24 and 2.1.9: the suite
//! runs under both): the VF netdev (a veth
//! stand-in named like the simulated host root's VF) is `net1` inside the pod
//! and absent from the host; after removal it is back on the host with its
//! name, MAC and MTU. The pod sets its VF's MTU (`devgate.io/vf-settings`),
//! which the node's config allows, and no other setting.
mod support;

#[path = "hook_netns/net.rs"]
mod net;
#[path = "hook_netns/stand_in.rs"]
mod stand_in;

use devgate::allocation::VF_SETTINGS;
use devgate::fixture::HostRootBuilder;
use net::{link, In, IpLink};
use stand_in::StandIn;
use support::node::Node;
use support::{require_root, wait_for, ContainerSpec, Pod, SLOW};

#[test]
fn vf_moves_into_the_pod_as_net1_and_comes_back() {
    require_root();
    let node = Node::start_full(
        HostRootBuilder::hgx().vf_netdev_prefix("dgev"),
        "[vf]\npod_settings = [\"mtu\"]\n",
        &[],
    );
    let stand_in = StandIn::new(&node, "dgevpeer", "02:00:00:de:0a:01");
    let (vf, host_name) = (&stand_in.vf, &stand_in.host_name);
    let host_mtu = link(In::Host, host_name).expect("stand-in").mtu;
    let cri = node.cri();

    // A setting the node does not let pods set: refused, nothing claimed or moved.
    let vlan = cri
        .run_pod(
            &stand_in
                .pod("vlan")
                .annotation(VF_SETTINGS, r#"{"vlan":5,"mtu":9000}"#),
        )
        .expect("RunPodSandbox");
    let err = cri
        .create_container(&vlan, &ContainerSpec::shell("main", "sleep 300"))
        .expect_err("a vlan the node does not allow");
    assert!(
        err.message().contains(
            "devgate.io/vf-settings: vlan: not among the settings this node lets pods set"
        ),
        "{}",
        err.message()
    );
    assert!(node.ledger().pods.is_empty());
    assert!(link(In::Host, host_name).is_some());
    cri.delete_pod(&vlan, &[]);

    let pod = cri
        .run_pod(
            &stand_in
                .pod("vf")
                .annotation(VF_SETTINGS, r#"{"mtu":9000}"#),
        )
        .expect("RunPodSandbox");
    let id = cri
        .create_container(&pod, &ContainerSpec::shell("main", "sleep 300"))
        .expect("CreateContainer");
    cri.start_container(&id).expect("StartContainer");
    let (code, out, err) = cri
        .exec(&id, &["ip", "-o", "link", "show", "net1"])
        .expect("exec");
    assert_eq!(code, 0, "net1 missing in the pod: {out} {err}");
    assert!(out.contains("02:00:00:de:0a:01"), "{out}");
    assert!(out.contains(" mtu 9000 "), "{out}");
    let (_, devs, _) = cri.exec(&id, &["ls", "/dev/infiniband"]).expect("exec");
    let uverbs = vf.rdma.as_ref().expect("vf rdma").char_devs[0].name.clone();
    assert!(devs.contains(&uverbs), "{devs}");
    assert!(
        link(In::Host, host_name).is_none(),
        "the VF is still on the host"
    );
    // The node runs in the shared RDMA netns mode (the default): the VF's RDMA
    // device stays where it is, and status says so.
    let status = node.status(&[]);
    let rdma = &vf.rdma.as_ref().expect("vf rdma").name;
    let line = status
        .lines()
        .find(|l| l.starts_with(&vf.bus_id.to_string()) && l.contains(" -> net1"))
        .unwrap_or_else(|| panic!("no vf line: {status}"));
    assert!(
        line.ends_with(&format!(
            "{rdma} not moved: shared with the host (rdma netns mode shared)"
        )),
        "{line}"
    );

    let back = delete_and_wait(&node, &pod, &[&id], host_name);
    assert_eq!(back.address.as_deref(), Some("02:00:00:de:0a:01"));
    assert_eq!(back.mtu, host_mtu, "mtu restored");
    drop(stand_in);
}

/// Waits until the hook's poststop for container `id` has run: containerd
/// runs it once the task is deleted after its exit.
fn poststop_ran(node: &Node, id: &str) {
    let log = node.state_dir().join("hook.log");
    wait_for("the container's poststop", SLOW, || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .any(|l| l.contains("hook done") && l.contains("poststop") && l.contains(id))
            .then_some(())
    });
}

/// Deletes the pod as kubelet does and waits until devgate gave everything
/// back: the VF on the host (its link, returned) and every claim released.
fn delete_and_wait(node: &Node, pod: &Pod, containers: &[&str], host_name: &str) -> IpLink {
    node.cri().delete_pod(pod, containers);
    let back = wait_for("vf back on the host", SLOW, || link(In::Host, host_name));
    wait_for("claims released", SLOW, || {
        node.ledger().pods.is_empty().then_some(())
    });
    back
}

/// A createRuntime that cannot apply the plan fails the container and changes
/// nothing: `net1` is already taken in the pod's netns, so the VF stays on the
/// host as it was, StartContainer fails with the hook's reason, and the claims
/// of the pod, which has no other container, are released. The kubelet's
/// retry of the container claims again and gets the VF.
#[test]
fn a_failed_attach_fails_the_container_and_leaves_the_vf_on_the_host() {
    require_root();
    let node = Node::start_with(HostRootBuilder::hgx().vf_netdev_prefix("dgef"), &[]);
    let stand_in = StandIn::new(&node, "dgefpeer", "02:00:00:de:0b:01");
    let host_name = &stand_in.host_name;
    let cri = node.cri();
    let pod = cri.run_pod(&stand_in.pod("taken")).expect("RunPodSandbox");
    let id = cri
        .create_container(&pod, &ContainerSpec::shell("main", "sleep 300"))
        .expect("CreateContainer");
    let netns = cri.netns_path(&id).expect("spec");
    net::sh(&[
        "nsenter",
        &format!("--net={netns}"),
        "ip",
        "link",
        "add",
        "net1",
        "type",
        "veth",
        "peer",
        "name",
        "dgefinner",
    ]);
    let err = cri
        .start_container(&id)
        .expect_err("net1 is taken in the pod");
    assert!(
        err.message()
            .contains("net1 already exists in the pod netns"),
        "{}",
        err.message()
    );
    let home = link(In::Host, host_name).expect("the VF stays on the host");
    assert_eq!(home.address.as_deref(), Some("02:00:00:de:0b:01"));
    assert!(
        node.ledger().pods.is_empty(),
        "nothing claimed for a container that never ran"
    );

    // The retry, once the name is free again.
    net::sh(&[
        "nsenter",
        &format!("--net={netns}"),
        "ip",
        "link",
        "del",
        "net1",
    ]);
    cri.remove_container(&id).expect("RemoveContainer");
    let retry = cri
        .create_container(&pod, &ContainerSpec::shell("main", "sleep 300"))
        .expect("CreateContainer again");
    cri.start_container(&retry).expect("the retry starts");
    assert_eq!(node.ledger().pods.len(), 1, "claimed again");
    assert!(
        link(In::Host, host_name).is_none(),
        "the VF moved to the pod"
    );

    delete_and_wait(&node, &pod, &[&retry], host_name);
    drop(stand_in);
}

/// `net1` is in the netns of container `id`.
fn has_net1(cri: &support::Cri, id: &str) {
    let (code, out, err) = cri
        .exec(id, &["ip", "-o", "link", "show", "net1"])
        .expect("exec");
    assert_eq!(code, 0, "net1 missing in {id}: {out} {err}");
}

/// A container `name` running `sleep 300`, created and started in `pod`;
/// `attempt` 1 is the kubelet's restart of it (the same name, the next attempt).
fn sleeper(cri: &support::Cri, pod: &Pod, name: &str, attempt: u32) -> String {
    let log = format!("{name}-{attempt}.log");
    let spec = ContainerSpec::shell(name, "sleep 300").edit(move |c| {
        if let Some(m) = c.metadata.as_mut() {
            m.attempt = attempt;
        }
        c.log_path = log.clone();
    });
    let id = cri.create_container(pod, &spec).expect("CreateContainer");
    cri.start_container(&id).expect("StartContainer");
    id
}

/// A container that stops gives its VF back to the host at poststop; the one
/// the kubelet starts in its place (a new container, the exited one still
/// recorded until garbage collection) moves it into the pod again.
#[test]
fn a_restarted_container_gets_its_vf_again() {
    require_root();
    let node = Node::start_with(HostRootBuilder::hgx().vf_netdev_prefix("dger"), &[]);
    let stand_in = StandIn::new(&node, "dgerpeer", "02:00:00:de:0d:01");
    let host_name = &stand_in.host_name;
    let cri = node.cri();
    let pod = cri
        .run_pod(&stand_in.pod("restart"))
        .expect("RunPodSandbox");
    let first = sleeper(&cri, &pod, "main", 0);
    has_net1(&cri, &first);

    cri.stop_container(&first, 0).expect("StopContainer");
    wait_for("vf back on the host", SLOW, || link(In::Host, host_name));
    let again = sleeper(&cri, &pod, "main", 1);
    has_net1(&cri, &again);
    assert!(link(In::Host, host_name).is_none(), "the VF is in the pod");

    delete_and_wait(&node, &pod, &[&first, &again], host_name);
    drop(stand_in);
}

/// The VF is the pod's, in the namespace all its containers share: when the
/// container that owns it (moved it in) stops while another container of the
/// pod runs on (a sidecar, a second app container), the VF stays in the pod
/// for that one, and a container created in the stopped one's place finds it
/// there; the pod's stop brings it home before the runtime removes the
/// namespace.
#[test]
fn a_stopped_owner_leaves_the_vf_to_the_containers_still_running() {
    require_root();
    let node = Node::start_with(HostRootBuilder::hgx().vf_netdev_prefix("dgsb"), &[]);
    let stand_in = StandIn::new(&node, "dgsbpeer", "02:00:00:de:0e:01");
    let host_name = &stand_in.host_name;
    let cri = node.cri();
    let pod = cri
        .run_pod(&stand_in.pod("siblings"))
        .expect("RunPodSandbox");
    let mut ids = Vec::new();
    for name in ["main", "side"] {
        let id = sleeper(&cri, &pod, name, 0);
        has_net1(&cri, &id);
        ids.push(id);
    }
    // Which one moved the VF in: the first on a real NIC, the second here,
    // since the simulated sysfs still lists the moved netdev under its VF,
    // which reads as an owner that moved nothing.
    let owner = || {
        node.ledger().pods[&pod.id]
            .network_owner
            .clone()
            .expect("a network owner")
    };
    let first_owner = owner();
    let (stopped, running) = match ids.iter().position(|id| *id == first_owner) {
        Some(0) => (0, 1),
        Some(_) => (1, 0),
        None => panic!("owner {first_owner} is neither container"),
    };

    cri.stop_container(&ids[stopped], 0).expect("StopContainer");
    poststop_ran(&node, &ids[stopped]);
    has_net1(&cri, &ids[running]);
    assert!(link(In::Host, host_name).is_none(), "the VF left the pod");

    let again = sleeper(&cri, &pod, ["main", "side"][stopped], 1);
    has_net1(&cri, &again);

    // The pod deleted as kubelet does: its containers stopped together, the
    // owner's poststop while the other still runs. The VF is in the pod
    // until StopPodSandbox, whose reply comes only once it is home: the
    // runtime removes the namespace after it.
    let owner = owner();
    let mut live = vec![ids[running].clone(), again];
    live.sort_by_key(|id| *id != owner);
    for id in &live {
        cri.stop_container(id, 0).expect("StopContainer");
        poststop_ran(&node, id);
    }
    assert!(
        link(In::Host, host_name).is_none(),
        "restored before the pod's stop"
    );
    cri.stop_pod(&pod).expect("StopPodSandbox");
    assert!(
        link(In::Host, host_name).is_some(),
        "the VF is not home when StopPodSandbox returns"
    );

    let ids: Vec<&str> = ids.iter().chain(&live).map(String::as_str).collect();
    delete_and_wait(&node, &pod, &ids, host_name);
    drop(stand_in);
}
