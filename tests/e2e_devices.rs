//! Applying Koordinator's allocation at container creation against a real
//! containerd (1.7.24 and 2.1.9: the suite runs under both), on a simulated
//! HGX host root: exact device nodes and
//! cgroup rules, fail-closed refusals, and the claim ledger across pods,
//! plugin crashes and concurrent creation.
mod support;

use std::collections::HashMap;

use devgate::ledger::LedgerState;
use support::node::{
    allocation, gpu_entry, gpu_share_entry, gpus, vf_entry, Node, DEVICE_ALLOCATED, GPU2_NODES,
};
use support::{require_root, wait_for, ContainerSpec, PodSpec, SLOW};

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
    let cases: Vec<(&str, String, &str)> = vec![
        ("malformed", "{\"gpu\":[".to_string(), "malformed"),
        (
            "unknown-minor",
            gpus(&[gpu_entry(9, &g2)]),
            "no gpu with minor 9",
        ),
        (
            "other-uuid",
            gpus(&[gpu_entry(2, &g3)]),
            "is the uuid of gpu minor 3",
        ),
        (
            "vf-of-other-pf",
            allocation(&[], &[vf_entry(0, pf0, vf_of_pf1)]),
            "not to pf",
        ),
        (
            "bus-not-vf",
            allocation(&[], &[vf_entry(0, pf0, pf0)]),
            "is a pf, not a vf",
        ),
        (
            "path-like",
            gpus(&[gpu_entry(2, "../../dev/sda")]),
            "gpu[0]",
        ),
        (
            "duplicate",
            gpus(&[gpu_entry(2, &g2), gpu_entry(2, &g2)]),
            "duplicate",
        ),
        ("over-100", gpus(&[gpu_share_entry(2, &g2, 150)]), "gpu[0]"),
        (
            "negative",
            r#"{"gpu":[{"minor":-2}]}"#.to_string(),
            "negative",
        ),
        ("oversized", huge, "over the limit"),
    ];
    for (name, alloc, reason) in cases {
        let pod = cri
            .run_pod(&PodSpec::new(name).annotation(DEVICE_ALLOCATED, &alloc))
            .expect("RunPodSandbox");
        let err = cri
            .create_container(&pod, &ContainerSpec::shell("main", "true"))
            .expect_err(name);
        let msg = err.message();
        assert!(msg.contains(DEVICE_ALLOCATED), "{name}: {msg}");
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

#[test]
fn claims_survive_plugin_crash_and_vanished_pods_are_released_at_sync() {
    require_root();
    let mut node = Node::start(&[]);
    let cri = node.cri();
    let (a, b) = (node.gpu(0).uuid.clone(), node.gpu(1).uuid.clone());
    let keep = cri
        .run_pod(&PodSpec::new("keep").annotation(DEVICE_ALLOCATED, &gpus(&[gpu_entry(0, &a)])))
        .unwrap();
    cri.create_container(&keep, &ContainerSpec::shell("main", "true"))
        .unwrap();
    let gone = cri
        .run_pod(&PodSpec::new("gone").annotation(DEVICE_ALLOCATED, &gpus(&[gpu_entry(1, &b)])))
        .unwrap();
    cri.create_container(&gone, &ContainerSpec::shell("main", "true"))
        .unwrap();
    // Stopped while the plugin is down and never removed, as the kubelet
    // keeps a finished Job's pod until the pod object is deleted.
    let c = node.gpu(2).uuid.clone();
    let stopped = cri
        .run_pod(&PodSpec::new("stopped").annotation(DEVICE_ALLOCATED, &gpus(&[gpu_entry(2, &c)])))
        .unwrap();
    cri.run_container(&stopped, &ContainerSpec::shell("main", "true"))
        .unwrap();

    // A further container of a pod is recorded by a journal line.
    let side = cri
        .create_container(&keep, &ContainerSpec::shell("side", "true"))
        .unwrap();

    node.plugin.kill();
    let held = node.ledger();
    assert_eq!(held.pods.len(), 3, "kill -9 keeps every claim");
    assert!(
        held.container(&side).is_some(),
        "kill -9 keeps the journal's records"
    );
    cri.stop_pod(&gone).unwrap();
    cri.remove_pod(&gone).unwrap();
    cri.stop_pod(&stopped).unwrap();
    assert_eq!(
        node.ledger().pods.len(),
        3,
        "nobody released while the plugin was down"
    );
    // Created with no plugin connected: it has none of its pod's devices.
    let late = cri
        .create_container(&keep, &ContainerSpec::shell("late", "true"))
        .unwrap();

    node.plugin.respawn(&node.ctrd);
    node.plugin.wait_registered(&node.ctrd, SLOW);
    wait_for(
        "vanished and stopped pods released at synchronize",
        SLOW,
        || {
            let s = node.ledger();
            (s.pods.len() == 1 && s.pods.contains_key(&keep.id)).then_some(())
        },
    );
    let state = node.ledger();
    assert!(state.devices.contains_key(&format!("gpu {a}")));
    assert!(!state.devices.contains_key(&format!("gpu {b}")));
    assert!(!state.devices.contains_key(&format!("gpu {c}")));
    cri.remove_pod(&stopped).unwrap();

    // `devgate status` lists the container Synchronize found without its
    // allocation, until the runtime removes it.
    let unapplied = || -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(&node.status(&["-o", "json"])).unwrap();
        let listed = v["unapplied_containers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        listed
            .iter()
            .map(|u| u["id"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(unapplied(), std::slice::from_ref(&late));
    cri.remove_container(&late).unwrap();
    wait_for("the removed container unlisted", SLOW, || {
        unapplied().is_empty().then_some(())
    });
}

/// A pod's containers, and a claim once the ledger has a document, are
/// recorded by appending to the ledger's journal; SIGTERM folds it into the
/// document, which then holds them alone. The sandbox's start claims.
#[test]
fn containers_and_claims_are_journaled_and_folded_in_at_exit() {
    require_root();
    let mut node = Node::start(&[]);
    let cri = node.cri();
    let uuid = node.gpu(3).uuid.clone();
    let pod = cri
        .run_pod(&PodSpec::new("two").annotation(DEVICE_ALLOCATED, &gpus(&[gpu_entry(3, &uuid)])))
        .unwrap();
    let (document, journal) = (
        node.state_dir().join("ledger.json"),
        node.state_dir().join("ledger.journal"),
    );
    let alone =
        || -> LedgerState { serde_json::from_slice(&std::fs::read(&document).unwrap()).unwrap() };
    let claimed = alone();
    assert!(
        claimed.pods[&pod.id].containers.is_empty(),
        "the sandbox's start claims, and the first claim writes the document"
    );
    assert_eq!(
        claimed.devices[&format!("gpu {uuid}")].holders[0].sandbox_id,
        pod.id
    );
    let main = cri
        .create_container(&pod, &ContainerSpec::shell("main", "true"))
        .unwrap();
    let side = cri
        .create_container(&pod, &ContainerSpec::shell("side", "true"))
        .unwrap();
    assert!(
        alone().container(&main).is_none() && alone().container(&side).is_none(),
        "the containers are lines"
    );
    let uuid2 = node.gpu(4).uuid.clone();
    let pod2 = cri
        .run_pod(&PodSpec::new("next").annotation(DEVICE_ALLOCATED, &gpus(&[gpu_entry(4, &uuid2)])))
        .unwrap();
    let other = cri
        .create_container(&pod2, &ContainerSpec::shell("main", "true"))
        .unwrap();
    assert!(
        !alone().pods.contains_key(&pod2.id),
        "the next pod's claim is a line"
    );
    assert!(std::fs::metadata(&journal).unwrap().len() > 0);
    let seen = node.ledger();
    assert!(seen.container(&main).is_some() && seen.container(&side).is_some());
    assert!(seen.container(&other).is_some());
    assert_eq!(
        seen.devices[&format!("gpu {uuid2}")].holders[0].sandbox_id,
        pod2.id
    );

    let status = node
        .plugin
        .signal_and_wait(nix::sys::signal::Signal::SIGTERM, SLOW)
        .expect("devgate nri ends on SIGTERM");
    assert!(status.success(), "exit status {status}");
    assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
    let folded = alone();
    assert!(folded.container(&main).is_some() && folded.container(&side).is_some());
    assert!(folded.container(&other).is_some() && folded.pods.contains_key(&pod2.id));
    assert_eq!(folded, node.ledger());
}

#[test]
fn concurrent_creation_never_gives_one_gpu_two_holders() {
    require_root();
    let node = Node::start(&[]);
    let minors: Vec<u32> = (0..8).collect();
    let uuids: HashMap<u32, String> = minors
        .iter()
        .map(|m| (*m, node.gpu(*m).uuid.clone()))
        .collect();
    let wins: Vec<(u32, bool)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50u32)
            .map(|i| {
                let minor = i % 8;
                let alloc = gpus(&[gpu_entry(minor, &uuids[&minor])]);
                let node = &node;
                s.spawn(move || {
                    let cri = node.cri();
                    let pod = cri
                        .run_pod(
                            &PodSpec::new(&format!("race{i}")).annotation(DEVICE_ALLOCATED, &alloc),
                        )
                        .expect("RunPodSandbox");
                    match cri.create_container(&pod, &ContainerSpec::shell("main", "true")) {
                        Ok(_) => (minor, true),
                        // A loser lost the race for its GPU, not for any other reason.
                        Err(status) => {
                            assert!(
                                status.message().contains("is held by pod"),
                                "race{i} refused for another reason: {}",
                                status.message()
                            );
                            (minor, false)
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    for minor in minors {
        let n = wins.iter().filter(|(m, won)| *m == minor && *won).count();
        assert_eq!(n, 1, "gpu minor {minor} got {n} holders");
    }
    let state = node.ledger();
    assert_eq!(state.pods.len(), 8);
    assert!(state.devices.values().all(|d| d.holders.len() == 1));
}

/// A GPU marked unhealthy in the persistent health state (as an XID would)
/// is refused; once its condition clears it is handed out again.
#[test]
fn unhealthy_gpu_is_refused_until_it_recovers() {
    require_root();
    let health = tempfile::tempdir().expect("health dir");
    let config = format!("[gpu]\nhealth_dir = {:?}\nnvml = false\n", health.path());
    let node = Node::start_full(devgate::fixture::HostRootBuilder::hgx(), &config, &[]);
    let cri = node.cri();
    let uuid = node.gpu(6).uuid.clone();
    let store = devgate::gpu::HealthStore::new(health.path());
    store
        .mark(&uuid, &[devgate::gpu::health::Fault::Xid { code: 79 }], 1)
        .expect("mark unhealthy");
    let pod = cri
        .run_pod(&PodSpec::new("sick").annotation(DEVICE_ALLOCATED, &gpus(&[gpu_entry(6, &uuid)])))
        .unwrap();
    let err = cri
        .create_container(&pod, &ContainerSpec::shell("main", "true"))
        .expect_err("unhealthy gpu");
    assert!(err.message().contains(&uuid), "{}", err.message());
    assert!(err.message().contains("xid 79"), "{}", err.message());
    assert!(node.ledger().pods.is_empty());
    // `devgate status`, with the node's config, shows the GPU as the plugin
    // judged it.
    let unhealthy = || {
        let v: serde_json::Value =
            serde_json::from_str(&node.status(&["-o", "json"])).expect("status json");
        assert_eq!(v["gpu_health_dir"].as_str(), health.path().to_str(), "{v}");
        v["gpu_health"]["gpus"][uuid.as_str()]["unhealthy"].clone()
    };
    let shown = unhealthy();
    assert_eq!(
        shown["faults"],
        serde_json::json!([{"kind": "xid", "code": 79}]),
        "{shown}"
    );
    store.clear(&uuid).expect("clear");
    assert!(unhealthy().is_null(), "cleared");
    cri.create_container(&pod, &ContainerSpec::shell("main", "true"))
        .expect("recovered gpu is handed out");
}
