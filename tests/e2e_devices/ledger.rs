//! The claim ledger against a real containerd: claims across a plugin's
//! `kill -9` and Synchronize, the journal folded at exit, 50 pods created
//! concurrently against 8 GPUs, and an unhealthy GPU refused until it recovers.

use std::collections::HashMap;

use devgate::ledger::LedgerState;

use crate::support::node::{gpu_entry, gpus, Node, DEVICE_ALLOCATED};
use crate::support::{require_root, wait_for, ContainerSpec, PodSpec, SLOW};

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
