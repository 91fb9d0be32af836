//! Hooks-only mode against a simulated HGX host root and a fake container
//! side: what is planned reaches the container, claims are taken and given
//! back, and every failure leaves nothing claimed.

use super::*;
use crate::allocation::DEVICE_ALLOCATED;
use crate::ledger::{Claim, DeviceId, Share};

#[path = "standalone_fake.rs"]
mod fake;
use fake::*;

#[test]
fn the_plan_reaches_the_container_and_poststop_gives_everything_back() {
    let w = world();
    let alloc = w.allocation();
    let ann = [(DEVICE_ALLOCATED, alloc.as_str())];
    let mut os = FakeOs::default();
    let out = w
        .run(
            Stage::CreateRuntime,
            &state("c1", "creating", Some(7), &ann),
            &mut os,
        )
        .unwrap();
    let inv = w.fixture.expected();
    let gpu_node = format!("/dev/nvidia{}", inv.gpus[0].minor);
    let paths: Vec<&str> = os.nodes.iter().map(|n| n.path.as_str()).collect();
    assert!(paths.contains(&gpu_node.as_str()), "{paths:?}");
    assert!(paths.contains(&"/dev/nvidiactl"), "{paths:?}");
    assert!(paths.contains(&"/dev/infiniband/rdma_cm"), "{paths:?}");
    assert!(!paths.contains(&"/dev/nvidia7"), "{paths:?}");
    assert_eq!(os.allowed, os.nodes);
    assert_eq!(os.attached.len(), 1);
    let vf = &inv.rdma[0].vfs[1];
    assert_eq!(os.attached[0].vf_bus_id, vf.bus_id);
    assert_eq!(Some(&os.attached[0].host_netdev), vf.netdev.as_ref());
    assert_eq!(os.attached[0].container_ifname, "net1");
    assert_eq!(
        out,
        Outcome::Applied {
            nodes: os.nodes.len(),
            networks: 1
        }
    );
    let held = w.ledger();
    let pod = &held.pods["c1"];
    assert_eq!(pod.claims.len(), 2);
    assert_eq!(pod.network_owner.as_deref(), Some("c1"));
    // prestart after createRuntime: the same claims, nothing new held.
    w.run(
        Stage::Prestart,
        &state("c1", "creating", Some(7), &ann),
        &mut os,
    )
    .unwrap();
    assert_eq!(w.ledger().pods.len(), 1);

    let out = w
        .run(Stage::Poststop, &state("c1", "stopped", None, &[]), &mut os)
        .unwrap();
    assert_eq!(
        out,
        Outcome::Released {
            networks: 2,
            pod_released: true
        }
    );
    assert!(w.ledger().pods.is_empty() && w.ledger().devices.is_empty());
    // Twice: nothing left to do.
    let out = w
        .run(Stage::Poststop, &state("c1", "stopped", None, &[]), &mut os)
        .unwrap();
    assert_eq!(out, Outcome::Nothing);
}

/// `denied_namespaces` and `allowed_namespaces` hold in hooks-only mode as in
/// the plugin: a pod they rule out gets nothing, and nothing is claimed.
#[test]
fn the_namespace_rules_refuse_before_anything_is_claimed() {
    let alloc = world().allocation();
    let in_ns = |ns: &'static str| {
        [
            (DEVICE_ALLOCATED, alloc.clone()),
            ("io.kubernetes.cri.sandbox-namespace", ns.to_string()),
            ("io.kubernetes.cri.sandbox-name", "train".to_string()),
        ]
    };
    let run = |w: &World, ns: &'static str| {
        let ann = in_ns(ns);
        let ann: Vec<(&str, &str)> = ann.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut os = FakeOs::default();
        let out = w.run(
            Stage::CreateRuntime,
            &state("c1", "creating", Some(7), &ann),
            &mut os,
        );
        (out, os)
    };
    let mut w = world();
    w.config.denied_namespaces = vec!["tenant-a".into()];
    let (out, os) = run(&w, "tenant-a");
    assert_eq!(
        out.unwrap_err().to_string(),
        "scheduling.koordinator.sh/device-allocated: pod tenant-a/train: namespace tenant-a is in denied_namespaces"
    );
    assert!(os.nodes.is_empty() && os.attached.is_empty());
    assert!(w.ledger().pods.is_empty() && w.ledger().devices.is_empty());

    let mut w = world();
    w.config.allowed_namespaces = vec!["ml".into()];
    let (out, _) = run(&w, "tenant-b");
    let e = out.unwrap_err().to_string();
    assert!(
        e.ends_with("namespace tenant-b is not in allowed_namespaces"),
        "{e}"
    );
    assert!(w.ledger().pods.is_empty());
    // A container no pod stands behind has no namespace: said so.
    let ann = [(DEVICE_ALLOCATED, alloc.as_str())];
    let e = w
        .run(
            Stage::CreateRuntime,
            &state("c1", "creating", Some(7), &ann),
            &mut FakeOs::default(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("namespace (none) is not in allowed_namespaces"),
        "{e}"
    );
    let (out, os) = run(&w, "ml");
    assert!(matches!(out, Ok(Outcome::Applied { .. })), "{out:?}");
    assert!(!os.nodes.is_empty());
}

#[test]
fn a_failure_after_the_claim_releases_it() {
    let w = world();
    let alloc = w.allocation();
    let ann = [(DEVICE_ALLOCATED, alloc.as_str())];
    for step in ["nodes", "allow", "attach"] {
        let mut os = FakeOs {
            fail: Some(step),
            ..FakeOs::default()
        };
        let e = w
            .run(
                Stage::CreateRuntime,
                &state("c2", "creating", Some(7), &ann),
                &mut os,
            )
            .unwrap_err();
        assert!(
            e.to_string().contains(&format!("fake {step} failure")),
            "{e}"
        );
        let l = w.ledger();
        assert!(l.pods.is_empty() && l.devices.is_empty(), "{step}: {l:?}");
    }
}

/// An attach whose rollback failed leaves the VF's record: the pod keeps its
/// claims, the VF quarantined, until a poststop or a reap restores it.
#[test]
fn a_failed_attach_that_left_a_vf_saved_keeps_the_claims() {
    let w = world();
    let alloc = w.allocation();
    let ann = [(DEVICE_ALLOCATED, alloc.as_str())];
    let vf = w.fixture.expected().rdma[0].vfs[1].bus_id;
    let left = crate::netdev::SavedVf::example("c2", &vf.to_string());
    crate::netdev::SavedStore::new(&w.env.state_dir)
        .save(&left)
        .unwrap();
    let mut os = FakeOs {
        fail: Some("attach"),
        ..FakeOs::default()
    };
    let creating = state("c2", "creating", Some(7), &ann);
    w.run(Stage::CreateRuntime, &creating, &mut os).unwrap_err();
    let l = w.ledger();
    assert!(l.pods["c2"].containers.contains_key("c2"), "{l:?}");
    let vf_record = &l.devices[&DeviceId::Vf(vf).to_string()];
    assert!(vf_record.quarantine.is_some(), "{vf_record:?}");
}

#[test]
fn devices_held_by_another_pod_are_refused_untouched() {
    let w = world();
    let alloc = w.allocation();
    let ann = [(DEVICE_ALLOCATED, alloc.as_str())];
    let mut os = FakeOs::default();
    w.run(
        Stage::CreateRuntime,
        &state("a", "creating", Some(7), &ann),
        &mut os,
    )
    .unwrap();
    let mut other = FakeOs::default();
    let e = w
        .run(
            Stage::CreateRuntime,
            &state("b", "creating", Some(8), &ann),
            &mut other,
        )
        .unwrap_err();
    assert!(e.to_string().contains("is held by pod"), "{e}");
    assert!(other.nodes.is_empty() && other.attached.is_empty());
    assert_eq!(w.ledger().pods.len(), 1);
}

#[test]
fn bad_input_claims_nothing() {
    let w = world();
    let alloc = w.allocation();
    type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, Option<u32>);
    let cases: Vec<Case<'_>> = vec![
        (vec![(DEVICE_ALLOCATED, "{not json")], "creating", Some(9)),
        (
            vec![(DEVICE_ALLOCATED, r#"{"gpu":[{"minor":99}]}"#)],
            "creating",
            Some(9),
        ),
        (vec![(DEVICE_ALLOCATED, &alloc)], "running", Some(9)),
        (vec![(DEVICE_ALLOCATED, &alloc)], "creating", None),
        (
            vec![
                (DEVICE_ALLOCATED, &alloc),
                ("io.kubernetes.cri.sandbox-id", "a b"),
            ],
            "creating",
            Some(9),
        ),
    ];
    for (ann, status, pid) in cases {
        let mut os = FakeOs::default();
        let e = w.run(
            Stage::CreateRuntime,
            &state("c", status, pid, &ann),
            &mut os,
        );
        assert!(e.is_err(), "{ann:?} {status}");
        assert!(os.nodes.is_empty() && os.attached.is_empty());
    }
    assert!(!w.env.state_dir.join("ledger.json").exists() || w.ledger().pods.is_empty());
}

#[test]
fn identity_comes_from_cri_keys_or_the_container_itself() {
    let s = state(
        "ctr",
        "creating",
        Some(1),
        &[
            ("io.kubernetes.cri.sandbox-id", "sb1"),
            ("io.kubernetes.cri.sandbox-namespace", "ns"),
            ("io.kubernetes.cri.sandbox-name", "pod"),
            ("io.kubernetes.cri.sandbox-uid", "uid-1"),
            ("io.kubernetes.cri.container-name", "main"),
        ],
    );
    let who = identity(&s).unwrap();
    assert_eq!(
        (
            who.pod.sandbox_id.as_str(),
            who.pod.to_string(),
            who.pod.uid.as_str(),
            who.container.as_str()
        ),
        ("sb1", "ns/pod".to_string(), "uid-1", "main")
    );
    // CRI-O's spec carries the pod's own annotations too: containerd's keys
    // there are the pod's word, never taken.
    let crio = state(
        "ctr",
        "creating",
        Some(1),
        &[
            ("io.kubernetes.cri-o.SandboxID", "sb2"),
            ("io.kubernetes.pod.uid", "uid-2"),
            ("io.kubernetes.container.name", "app"),
            ("io.kubernetes.cri.sandbox-id", "victim"),
            ("io.kubernetes.cri.sandbox-uid", "uid-victim"),
        ],
    );
    let who = identity(&crio).unwrap();
    assert_eq!(
        (
            who.pod.sandbox_id.as_str(),
            who.pod.uid.as_str(),
            who.container.as_str()
        ),
        ("sb2", "uid-2", "app")
    );
    let who = identity(&state("solo", "creating", Some(1), &[])).unwrap();
    assert_eq!(
        (
            who.pod.sandbox_id.as_str(),
            who.pod.name.as_str(),
            who.pod.uid.as_str()
        ),
        ("solo", "solo", "solo")
    );
    let long = "x".repeat(MAX_IDENTITY + 1);
    let bad = state(
        "c",
        "creating",
        Some(1),
        &[
            ("io.kubernetes.cri-o.SandboxID", "sb3"),
            ("io.kubernetes.pod.name", &long),
        ],
    );
    assert!(matches!(
        identity(&bad),
        Err(HooksOnlyError::Identity { .. })
    ));
}

#[path = "release_tests.rs"]
mod release;

#[path = "quarantine_retry_tests.rs"]
mod quarantine_retry;

#[path = "reap_budget_tests.rs"]
mod reap_budget;

#[path = "plugin_admitted_tests.rs"]
mod plugin_admitted;

#[path = "network_owner_tests.rs"]
mod network_owner;

#[path = "kept_network_tests.rs"]
mod kept_network;

/// A PF used whole on a kernel in exclusive RDMA netns mode: refused for a
/// container whose spec gives it a network namespace of its own, with nothing
/// made or claimed; given to one on the host's network.
#[test]
fn a_whole_pf_on_an_exclusive_kernel_needs_the_host_network() {
    let exclusive = Some(crate::config::RdmaNetnsMode::Exclusive);
    let w = world_on(crate::fixture::HostRootBuilder::hgx().rdma_netns_mode(exclusive));
    let pf = w.fixture.expected().rdma[0].bus_id;
    let alloc = format!(r#"{{"rdma":[{{"minor":0,"id":"{pf}"}}]}}"#);
    let ann = [(DEVICE_ALLOCATED, alloc.as_str())];
    let mut os = FakeOs {
        network: crate::plan::PodNetwork::Own,
        ..FakeOs::default()
    };
    let err = w
        .run(
            Stage::CreateRuntime,
            &state("c1", "creating", Some(7), &ann),
            &mut os,
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("stays in the host network namespace"),
        "{err}"
    );
    assert!(os.nodes.is_empty());
    assert!(!w.env.state_dir.join("ledger.json").exists() || w.ledger().pods.is_empty());

    os.network = crate::plan::PodNetwork::Host;
    w.run(
        Stage::CreateRuntime,
        &state("c1", "creating", Some(7), &ann),
        &mut os,
    )
    .unwrap();
    let paths: Vec<&str> = os.nodes.iter().map(|n| n.path.as_str()).collect();
    assert!(paths.contains(&"/dev/infiniband/rdma_cm"), "{paths:?}");
    assert_eq!(w.ledger().pods["c1"].claims[0].device, DeviceId::Pf(pf));
}
