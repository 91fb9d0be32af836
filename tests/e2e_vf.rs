//! A pod with its own network namespace gets its SR-IOV VF through the hook
//! devgate injects, against a real containerd (1.7.24 and 2.1.9: the suite
//! runs under both): the VF netdev (a veth
//! stand-in named like the simulated host root's VF) is `net1` inside the pod
//! and absent from the host; after removal it is back on the host with its
//! name and MAC.
mod support;

#[path = "hook_netns/net.rs"]
mod net;

use devgate::fixture::HostRootBuilder;
use net::{link, In, Veth};
use support::node::{allocation, vf_entry, Node, DEVICE_ALLOCATED};
use support::{require_root, wait_for, ContainerSpec, PodSpec, SLOW};

#[test]
fn vf_moves_into_the_pod_as_net1_and_comes_back() {
    require_root();
    let node = Node::start_with(HostRootBuilder::hgx().vf_netdev_prefix("dgev"), &[]);
    let inv = node.fixture.expected();
    let (pf, vf) = (&inv.rdma[0], &inv.rdma[0].vfs[1]);
    let host_name = vf.netdev.clone().expect("fixture vf netdev");
    let stand_in = Veth::new(&host_name, "dgevpeer", "02:00:00:de:0a:01");
    let alloc = allocation(&[], &[vf_entry(0, pf.bus_id, vf.bus_id)]);
    let cri = node.cri();
    let pod = cri
        .run_pod(
            &PodSpec::new("vf")
                .own_netns()
                .annotation(DEVICE_ALLOCATED, &alloc),
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
    let (_, devs, _) = cri.exec(&id, &["ls", "/dev/infiniband"]).expect("exec");
    let uverbs = vf.rdma.as_ref().expect("vf rdma").char_devs[0].name.clone();
    assert!(devs.contains(&uverbs), "{devs}");
    assert!(
        link(In::Host, &host_name).is_none(),
        "the VF is still on the host"
    );

    cri.delete_pod(&pod, &[&id]);
    let back = wait_for("vf back on the host", SLOW, || link(In::Host, &host_name));
    assert_eq!(back.address.as_deref(), Some("02:00:00:de:0a:01"));
    wait_for("claims released", SLOW, || {
        node.ledger().pods.is_empty().then_some(())
    });
    drop(stand_in);
}
