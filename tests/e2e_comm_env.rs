//! Communication-library variables inside a container created through a real
//! containerd (1.7.24 or 2.1.9: the suite runs under both): a GPU, an RDMA VF moved into the pod as `net1` and a whole
//! RoCE PF give NCCL and UCX exactly those devices (no RoCE v2 GID index: the
//! VF's addresses are the pod's), a pod with the whole PF alone gets the index
//! from the simulated host's sysfs (and follows it when the host's addresses
//! move between pods), a variable the pod spec sets stays the pod's,
//! and the node config's templated variable is filled in. A reply larger than
//! the runtime's 4 KiB read buffer (many templated variables) reaches the
//! container whole.
mod support;

#[path = "hook_netns/net.rs"]
mod net;

use devgate::fixture::HostRootBuilder;
use net::{link, In, Veth};
use support::node::{allocation, gpu_entry, vf_entry, Node, DEVICE_ALLOCATED};
use support::{require_root, wait_for, ContainerSpec, Pod, PodSpec, SLOW};

const CONFIG: &str = r#"
[comm_env]
NCCL_SOCKET_IFNAME = "DG_SOCKET_IFNAME"
[comm_env.extra]
GLOO_SOCKET_IFNAME = "{netdevs}"
DG_NUMA = "numa {numa_nodes}"
"#;

const PRINT: &str = r#"
for v in NCCL_IB_HCA UCX_NET_DEVICES NCCL_SOCKET_IFNAME DG_SOCKET_IFNAME NCCL_IB_GID_INDEX \
         CUDA_DEVICE_ORDER GLOO_SOCKET_IFNAME DG_NUMA; do
  eval "echo $v=\${$v-unset}"
done
ip -o link show net1 >/dev/null && echo has-net1
"#;

#[test]
fn nccl_and_ucx_variables_name_the_allocated_devices() {
    require_root();
    let builder = HostRootBuilder::hgx()
        .roce_ipv4(true)
        .vf_netdev_prefix("dgce");
    let node = Node::start_full(builder, CONFIG, &[]);
    let inv = node.fixture.expected();
    // Slot 1 (NUMA 0): its GPU and a VF of its RoCE NIC; slot 3's RoCE PF whole.
    let (gpu, nic, whole) = (&inv.gpus[1], &inv.rdma[1], &inv.rdma[3]);
    let vf = &nic.vfs[1];
    let host_name = vf.netdev.clone().expect("fixture vf netdev");
    let stand_in = Veth::new(&host_name, "dgcepeer", "02:00:00:de:0c:01");
    let whole_entry = format!(
        r#"{{"minor":3,"id":"{}","resources":{{"koordinator.sh/rdma":"100"}}}}"#,
        whole.bus_id
    );
    let alloc = allocation(
        &[gpu_entry(gpu.minor, &gpu.uuid)],
        &[vf_entry(1, nic.bus_id, vf.bus_id), whole_entry.clone()],
    );
    let whole_only = allocation(&[], &[whole_entry]);
    let cri = node.cri();
    let spec = ContainerSpec::shell("main", PRINT).env("UCX_NET_DEVICES", "mine");
    // A pod `name` with the allocation `alloc`, and its container run.
    let run_with = |name: &str, alloc: &str| {
        let pod = cri
            .run_pod(
                &PodSpec::new(name)
                    .own_netns()
                    .annotation(DEVICE_ALLOCATED, alloc),
            )
            .expect("RunPodSandbox");
        let run = cri.run_container(&pod, &spec).expect("container");
        (pod, run)
    };
    // Removes the container and its pod, and waits for the VF to come back.
    let end_nccl = |pod: &Pod, container_id: &str| {
        cri.delete_pod(pod, &[container_id]);
        wait_for("vf back on the host", SLOW, || link(In::Host, &host_name));
    };
    let run_nccl = |name: &str| run_with(name, &alloc);
    let (pod, run) = run_nccl("nccl");
    let log = run.log;
    let vf_dev = &vf.rdma.as_ref().expect("vf rdma").name;
    let hca = format!("{vf_dev}:1,{}:1", whole.rdma.name);
    for want in [
        format!("NCCL_IB_HCA=={hca}"),
        "UCX_NET_DEVICES=mine".to_string(),
        "NCCL_SOCKET_IFNAME=unset".to_string(),
        "DG_SOCKET_IFNAME=net1".to_string(),
        "NCCL_IB_GID_INDEX=unset".to_string(),
        "CUDA_DEVICE_ORDER=PCI_BUS_ID".to_string(),
        "GLOO_SOCKET_IFNAME=net1".to_string(),
        "DG_NUMA=numa 0".to_string(),
        "has-net1".to_string(),
    ] {
        assert!(log.lines().any(|l| l == want), "{want} in:\n{log}");
    }
    assert_eq!(run.exit_code, 0, "{log}");

    // `devgate status` pairs the pod's GPU with its NICs: the VF's NIC shares the
    // GPU's switch (PIX), slot 3's NIC is on another root complex of NUMA node 0.
    // Without `--host-root`, status reads the plugin's, from its runtime record.
    let root = node.fixture.root().to_string_lossy().into_owned();
    for text in [node.status(&[]), node.status(&["--host-root", &root])] {
        assert!(text.contains("\nPOD default/nccl\n"), "{text}");
        assert!(text.contains("\nGPU0   PIX    NODE\n"), "{text}");
        assert!(
            text.contains(&format!("\nNIC0: {vf_dev} (vf {})\n", vf.bus_id)),
            "{text}"
        );
    }

    end_nccl(&pod, &run.id);
    wait_for("claims released", SLOW, || {
        node.ledger().pods.is_empty().then_some(())
    });

    // The whole PF alone: its netdev stays on the host, whose table holds.
    let (pod, run) = run_with("whole", &whole_only);
    assert!(
        run.log.lines().any(|l| l == "NCCL_IB_GID_INDEX=3"),
        "{}",
        run.log
    );
    cri.delete_pod(&pod, &[&run.id]);
    wait_for("claims released", SLOW, || {
        node.ledger().pods.is_empty().then_some(())
    });

    // The host's addresses move: the IPv4 GIDs leave slots 2 and 3 for 4 and
    // 5. The next pod's index follows, although the plugin keeps the tables
    // it read open.
    let port = node
        .fixture
        .root()
        .join(format!("sys/class/infiniband/{}/ports/1", whole.rdma.name));
    for dir in ["gid_attrs/types", "gids", "gid_attrs/ndevs"] {
        for (from, to) in [(2, 4), (3, 5)] {
            let (from, to) = (
                port.join(dir).join(from.to_string()),
                port.join(dir).join(to.to_string()),
            );
            std::fs::rename(&from, &to).expect("move gid slot");
        }
    }
    let (pod, run) = run_with("whole-again", &whole_only);
    assert!(
        run.log.lines().any(|l| l == "NCCL_IB_GID_INDEX=5"),
        "{}",
        run.log
    );
    cri.delete_pod(&pod, &[&run.id]);
    drop(stand_in);
}

/// Twelve templated variables of about 1000 bytes each make a CreateContainer
/// reply of over 12 KB: a first mux frame of 4096 bytes and the rest in one
/// frame, which the runtime's Go reader must take whole.
#[test]
fn a_reply_larger_than_the_runtimes_read_buffer_arrives_whole() {
    require_root();
    let filler = "x".repeat(960);
    let mut config = String::from("[comm_env.extra]\n");
    for i in 0..12 {
        config.push_str(&format!("DG_BIG_{i} = \"{filler}{{gpu_uuids}}\"\n"));
    }
    let node = Node::start_full(HostRootBuilder::hgx(), &config, &[]);
    let gpu = node.gpu(0).clone();
    let alloc = allocation(&[gpu_entry(gpu.minor, &gpu.uuid)], &[]);
    let cri = node.cri();
    let pod = cri
        .run_pod(&PodSpec::new("big-reply").annotation(DEVICE_ALLOCATED, &alloc))
        .expect("RunPodSandbox");
    let print =
        "for i in 0 1 2 3 4 5 6 7 8 9 10 11; do eval \"echo DG_BIG_$i=\\${#DG_BIG_$i}\"; done";
    let run = cri
        .run_container(&pod, &ContainerSpec::shell("main", print))
        .expect("container");
    let want_len = filler.len() + gpu.uuid.len();
    for i in 0..12 {
        let want = format!("DG_BIG_{i}={want_len}");
        assert!(
            run.log.lines().any(|l| l == want),
            "{want} in:\n{}",
            run.log
        );
    }
    cri.delete_pod(&pod, &[&run.id]);
}
