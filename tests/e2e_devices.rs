//! Applying Koordinator's allocation at container creation against a real
//! containerd (1.7.24 and 2.1.9: the suite runs under both), on a simulated
//! HGX host root: exact device nodes and
//! cgroup rules, fail-closed refusals, and the claim ledger across pods,
//! plugin crashes and concurrent creation.
mod support;

/// The ledger across plugin crashes, its journal, concurrent creation and GPU
/// health.
#[path = "e2e_devices/ledger.rs"]
mod ledger;

use devgate::fixture::HostRootBuilder;
use support::node::{
    allocation, gpu_entry, gpu_share_entry, gpus, vf_entry, Node, DEVICE_ALLOCATED, GPU2_NODES,
};
use support::{require_root, ContainerSpec, PodSpec};

/// Prints each /dev/nvidia* node with its numbers, what opening the granted GPU
/// gives, what opening an ungranted GPU number gives, and the env.
const GPU_CHECK: &str = r#"
for d in /dev/nvidia*; do echo "node $d $(stat -c '%t:%T' $d)"; done
echo "open-granted: $(cat /dev/nvidia2 2>&1)"
mknod /tmp/other c 195 3 && echo "open-ungranted: $(cat /tmp/other 2>&1)"
echo "VIS=$NVIDIA_VISIBLE_DEVICES"
"#;

#[test]
fn gpu_pod_gets_exactly_its_gpu_and_unannotated_pod_nothing() {
    require_root();
    let node = Node::start(&[]);
    // Every GPU of the node is linked when the plugin starts, before any pod.
    let link = std::fs::read_link(node.fixture.root().join("dev/char/195:5"));
    assert_eq!(
        link.ok(),
        Some("../nvidia5".into()),
        "/dev/char/195:5 at start"
    );
    let cri = node.cri();
    let gpu = node.gpu(2).clone();
    let pod = cri
        .run_pod(
            &PodSpec::new("gpu").annotation(DEVICE_ALLOCATED, &gpus(&[gpu_entry(2, &gpu.uuid)])),
        )
        .expect("RunPodSandbox");
    let run = cri
        .run_container(&pod, &ContainerSpec::shell("main", GPU_CHECK))
        .expect("gpu container");
    let log = run.log;
    let nodes: Vec<&str> = log.lines().filter(|l| l.starts_with("node ")).collect();
    assert_eq!(nodes, GPU2_NODES, "log: {log}");
    assert!(
        log.contains("open-granted: cat: can't open '/dev/nvidia2': No such device or address"),
        "{log}"
    );
    assert!(
        log.contains("open-ungranted: cat: can't open '/tmp/other': Operation not permitted"),
        "{log}"
    );
    assert!(log.contains(&format!("VIS={}", gpu.uuid)), "{log}");
    // Made before runc registered the rules with systemd (the systemd
    // cgroup driver keeps only rules whose /dev/char/M:m exists).
    let dev_char = node.fixture.root().join("dev/char");
    for (link, target) in [("195:2", "../nvidia2"), ("195:255", "../nvidiactl")] {
        let read = std::fs::read_link(dev_char.join(link));
        assert_eq!(read.ok(), Some(target.into()), "{link}");
    }
    let state = node.ledger();
    assert_eq!(state.pods.len(), 1);
    assert!(state.devices.contains_key(&format!("gpu {}", gpu.uuid)));

    let plain = cri.run_pod(&PodSpec::new("plain")).expect("RunPodSandbox");
    let run = cri
        .run_container(
            &plain,
            &ContainerSpec::shell("main", "ls /dev; echo VIS=${NVIDIA_VISIBLE_DEVICES-unset}"),
        )
        .expect("plain container");
    assert!(!run.log.contains("nvidia"), "{}", run.log);
    assert!(run.log.contains("VIS=unset"), "{}", run.log);
    assert_eq!(
        node.ledger().pods.len(),
        1,
        "an unannotated pod claims nothing"
    );
}

#[test]
fn rdma_pf_gets_its_verbs_nodes_and_rdma_cm() {
    require_root();
    let node = Node::start(&[]);
    let cri = node.cri();
    let nic = &node.fixture.expected().rdma[1];
    let alloc = format!(
        r#"{{"rdma":[{{"minor":1,"id":"{}","resources":{{"koordinator.sh/rdma":"100"}}}}]}}"#,
        nic.bus_id
    );
    let pod = cri
        .run_pod(&PodSpec::new("rdma").annotation(DEVICE_ALLOCATED, &alloc))
        .expect("RunPodSandbox");
    let script = "for d in /dev/infiniband/*; do echo \"node $d $(stat -c '%t:%T' $d)\"; done";
    let run = cri
        .run_container(&pod, &ContainerSpec::shell("main", script))
        .expect("rdma container");
    let mut want: Vec<String> = nic
        .rdma
        .char_devs
        .iter()
        .filter(|c| c.kind != devgate::inventory::RdmaCharKind::Issm)
        .map(|c| {
            format!(
                "node /dev/infiniband/{} {:x}:{:x}",
                c.name, c.dev.major, c.dev.minor
            )
        })
        .collect();
    let cm = node.fixture.expected().rdma_cm.expect("fixture rdma_cm");
    want.push(format!(
        "node /dev/infiniband/rdma_cm {:x}:{:x}",
        cm.major, cm.minor
    ));
    want.sort();
    let mut got: Vec<String> = run
        .log
        .lines()
        .filter(|l| l.starts_with("node "))
        .map(str::to_string)
        .collect();
    got.sort();
    assert_eq!(got, want, "log: {}", run.log);
}

/// On a kernel in exclusive RDMA netns mode a whole PF's RDMA device stays in
/// the host's network namespace, where a pod with a namespace of its own
/// cannot open it: such a pod is refused with nothing claimed (containerd
/// tells the plugin the sandbox's network namespace), and a host-network pod
/// gets the PF.
#[test]
fn a_whole_pf_on_an_exclusive_kernel_goes_only_to_host_network_pods() {
    require_root();
    let exclusive = Some(devgate::config::RdmaNetnsMode::Exclusive);
    let node = Node::start_with(HostRootBuilder::hgx().rdma_netns_mode(exclusive), &[]);
    let cri = node.cri();
    let nic = &node.fixture.expected().rdma[1];
    let alloc = format!(r#"{{"rdma":[{{"minor":1,"id":"{}"}}]}}"#, nic.bus_id);
    let own = cri
        .run_pod(
            &PodSpec::new("own")
                .own_netns()
                .annotation(DEVICE_ALLOCATED, &alloc),
        )
        .expect("RunPodSandbox");
    let err = cri
        .create_container(&own, &ContainerSpec::shell("main", "true"))
        .expect_err("a whole pf for a pod with its own network namespace");
    let want = format!(
        "{DEVICE_ALLOCATED}: rdma[0]: pf {} is used without vfs, so its rdma device stays in the host network namespace",
        nic.bus_id
    );
    assert!(err.message().contains(&want), "{}", err.message());
    assert!(node.ledger().pods.is_empty(), "{:?}", node.ledger());
    cri.delete_pod(&own, &[]);

    let host = cri
        .run_pod(&PodSpec::new("host").annotation(DEVICE_ALLOCATED, &alloc))
        .expect("RunPodSandbox");
    let run = cri
        .run_container(&host, &ContainerSpec::shell("main", "ls /dev/infiniband"))
        .expect("a host-network pod gets the pf");
    let uverbs = &nic.rdma.char_devs[0].name;
    assert!(run.log.contains(uverbs.as_str()), "{uverbs}: {}", run.log);
    assert!(node.ledger().pods.values().any(|p| p.pod.name == "host"));
    // Known to be on the host's network, not admitted as a pod whose
    // namespaces went unreported (those get the plan's warning).
    let log = node.plugin.output();
    assert!(!log.contains("stays in the host netns"), "{log}");
}

/// Each class of bad input fails creation with a message naming the
/// annotation, the entry and the reason, and leaves no claim.
#[test]
fn bad_allocations_fail_closed_with_their_reason() {
    require_root();
    let node = Node::start(&[]);
    let cri = node.cri();
    let g2 = node.gpu(2).uuid.clone();
    let g3 = node.gpu(3).uuid.clone();
    let inv = node.fixture.expected();
    let pf0 = inv.rdma[0].bus_id;
    let vf_of_pf1 = inv.rdma[1].vfs[0].bus_id;
    let huge = format!(r#"{{"gpu":[{}]}}"#, vec![gpu_entry(2, &g2); 2000].join(","));
    // (case, annotation, entry, reason): the message names all three.
    #[rustfmt::skip]
    let cases: Vec<(&str, String, &str, &str)> = vec![
        ("malformed", "{\"gpu\":[".to_string(), "-", "malformed"),
        ("unknown-minor", gpus(&[gpu_entry(9, &g2)]), "gpu[0]", "no gpu with minor 9"),
        ("other-uuid", gpus(&[gpu_entry(2, &g3)]), "gpu[0]", "is the uuid of gpu minor 3"),
        ("vf-of-other-pf", allocation(&[], &[vf_entry(0, pf0, vf_of_pf1)]), "rdma[0].vfs[0]", "not to pf"),
        ("bus-not-vf", allocation(&[], &[vf_entry(0, pf0, pf0)]), "rdma[0].vfs[0]", "is a pf, not a vf"),
        ("path-like", gpus(&[gpu_entry(2, "../../dev/sda")]), "gpu[0]", "has characters not allowed there"),
        ("duplicate", gpus(&[gpu_entry(2, &g2), gpu_entry(2, &g2)]), "gpu[1]", "duplicate"),
        ("over-100", gpus(&[gpu_share_entry(2, &g2, 150)]), "gpu[0]", "150 is out of range"),
        ("negative", r#"{"gpu":[{"minor":-2}]}"#.to_string(), "gpu[0]", "minor -2 is negative"),
        ("oversized", huge, "-", "over the limit"),
    ];
    for (name, alloc, entry, reason) in cases {
        let pod = cri
            .run_pod(&PodSpec::new(name).annotation(DEVICE_ALLOCATED, &alloc))
            .expect("RunPodSandbox");
        let err = cri
            .create_container(&pod, &ContainerSpec::shell("main", "true"))
            .expect_err(name);
        let msg = err.message();
        let named = format!("{DEVICE_ALLOCATED}: {entry}: ");
        assert!(msg.contains(&named), "{name}: want {named:?} in {msg}");
        assert!(msg.contains(reason), "{name}: want {reason:?} in {msg}");
        assert!(node.ledger().pods.is_empty(), "{name} left a claim");
    }
}

#[test]
fn exclusive_gpu_has_one_holder_until_released_and_shares_stop_at_100() {
    require_root();
    let node = Node::start(&[]);
    let cri = node.cri();
    let g = node.gpu(4).uuid.clone();
    let whole = gpus(&[gpu_entry(4, &g)]);
    let first = cri
        .run_pod(&PodSpec::new("first").annotation(DEVICE_ALLOCATED, &whole))
        .unwrap();
    cri.create_container(&first, &ContainerSpec::shell("main", "true"))
        .expect("first holder");
    let second = cri
        .run_pod(&PodSpec::new("second").annotation(DEVICE_ALLOCATED, &whole))
        .unwrap();
    let err = cri
        .create_container(&second, &ContainerSpec::shell("main", "true"))
        .expect_err("held gpu");
    let reason = format!("{DEVICE_ALLOCATED}: gpu[0]: gpu {g} is held by pod default/first");
    assert!(err.message().contains(&reason), "{}", err.message());
    // The reason once: not repeated as its own cause.
    assert_eq!(
        err.message().matches("is held by pod").count(),
        1,
        "{}",
        err.message()
    );
    cri.stop_pod(&first).unwrap();
    cri.remove_pod(&first).unwrap();
    // The release runs on a worker from StopPodSandbox; a creation that
    // meets it running waits for it.
    cri.create_container(&second, &ContainerSpec::shell("main", "true"))
        .expect("the gpu is the second pod's once the first is removed");

    let s = node.gpu(5).uuid.clone();
    let half = gpus(&[gpu_share_entry(5, &s, 50)]);
    for name in ["half-a", "half-b"] {
        let pod = cri
            .run_pod(&PodSpec::new(name).annotation(DEVICE_ALLOCATED, &half))
            .unwrap();
        let run = cri
            .run_container(&pod, &ContainerSpec::shell("main", "echo ok"))
            .expect(name);
        assert_eq!(run.exit_code, 0);
    }
    let third = cri
        .run_pod(&PodSpec::new("half-c").annotation(DEVICE_ALLOCATED, &half))
        .unwrap();
    let err = cri
        .create_container(&third, &ContainerSpec::shell("main", "true"))
        .expect_err("third share");
    assert!(
        err.message().contains(&format!(
            "{DEVICE_ALLOCATED}: gpu[0]: gpu {s} share over 100%"
        )),
        "{}",
        err.message()
    );
}
