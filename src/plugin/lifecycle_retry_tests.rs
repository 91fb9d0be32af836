//! Releases the ledger could not make, Synchronize's retries, a sandbox
//! whose start failed, and the cgroups kept for a pod's teardown.
use super::lifecycle_tests::pod_holding_a_vf;
use super::*;
use crate::ledger::Failed;

/// A pod taken for gone whose release failed is retried with its count; its
/// stop's release failing too (the ledger unreadable) drops the count: the
/// pod is gone whatever it admitted since, and the retry must not skip it.
#[test]
fn a_stop_that_fails_after_a_counted_failure_is_retried_uncounted() {
    use lifecycle::{Release, Unreleased};
    let u = Unreleased::default();
    let counted = std::collections::HashMap::from([("p".to_string(), Some(1))]);
    u.update(&Release::Pods(counted), None);
    u.update(&Release::Pod("p".into()), None);
    let Some(Release::Pods(retry)) = u.retry() else {
        panic!("no retry")
    };
    assert_eq!(retry["p"], None);
    // A count coming after leaves the uncounted entry as it is.
    let again = std::collections::HashMap::from([("p".to_string(), Some(4))]);
    u.update(&Release::Pods(again), None);
    let Some(Release::Pods(retry)) = u.retry() else {
        panic!("no retry")
    };
    assert_eq!(retry["p"], None);
}

/// What the retry round takes up: pods whose teardown failed, and every pod
/// of a release the ledger could not carry out; a pod released is dropped.
#[test]
fn unreleased_keeps_failures_and_releases_the_ledger_could_not_make() {
    use crate::ledger::{PodRef, Released};
    use lifecycle::{Release, Unreleased};
    let u = Unreleased::default();
    u.update(&Release::Pod("a".into()), None);
    assert_eq!(u.pending(), ["a".to_string()].into_iter().collect());
    let b = PodRef {
        sandbox_id: "b".into(),
        namespace: "ns".into(),
        name: "b".into(),
        uid: "u".into(),
    };
    let outcome = Released {
        failed: vec![Failed {
            pod: b,
            reason: "vf restore failed".into(),
            kept: Vec::new(),
            admitted: 3,
        }],
        ..Released::default()
    };
    let both = crate::ledger::gone(&["a", "b"]);
    u.update(&Release::Pods(both.clone()), Some(&outcome));
    assert_eq!(u.pending(), ["b".to_string()].into_iter().collect());
    // The retry releases b only while no container was admitted since its
    // failure, when it had admitted 3; a pod the ledger could not read is
    // retried whatever it admitted, one taken for gone with a count keeps
    // it.
    u.update(&Release::Pod("c".into()), None);
    let counted = std::collections::HashMap::from([("d".to_string(), Some(2))]);
    u.update(&Release::Pods(counted), None);
    let Some(Release::Pods(retry)) = u.retry() else {
        panic!("no retry")
    };
    assert_eq!(
        retry,
        [
            ("b".to_string(), Some(3)),
            ("c".to_string(), None),
            ("d".to_string(), Some(2))
        ]
        .into_iter()
        .collect()
    );
    u.update(&Release::Pods(retry), Some(&Released::default()));
    u.update(&Release::Pods(both.clone()), Some(&outcome));
    // A container joined b while its teardown failed: b is live, and left
    // to its stop's release, never to a retry that would drop it.
    let joined = crate::ledger::PodRecord {
        pod: outcome.failed[0].pod.clone(),
        claims: Vec::new(),
        claimed_unix: 1,
        containers: Default::default(),
        network_owner: None,
        admitted: 0,
    };
    let outcome = Released {
        joined: vec![joined],
        ..outcome
    };
    u.update(&Release::Pods(both), Some(&outcome));
    assert!(u.pending().is_empty(), "{:?}", u.pending());
}

/// A Synchronize that cannot read the ledger does not leave the pods gone
/// while the plugin was away holding their devices until the next
/// connection: the retry round looks again and releases them, but never a
/// pod run since.
#[test]
fn a_synchronize_that_cannot_read_the_ledger_is_retried() {
    use crate::ledger::PodRef;
    use nri::stub::Plugin as _;
    let (plugin, _state) = plugin(Config::default(), false);
    let ledger = plugin.devices().ledger().clone();
    let (gone, vf) = pod_holding_a_vf();
    ledger.claim(&gone, std::slice::from_ref(&vf)).unwrap();
    let other_vf = crate::ledger::Claim {
        device: crate::ledger::DeviceId::Vf("0000:19:00.3".parse().unwrap()),
        ..vf.clone()
    };
    let later = PodRef {
        sandbox_id: "later".into(),
        ..gone.clone()
    };
    ledger.fold_journal().unwrap();
    let document = plugin.options.state_dir.join("ledger.json");
    let good = std::fs::read(&document).unwrap();
    std::fs::write(&document, b"{not json").unwrap();
    plugin.synchronize(Vec::new(), Vec::new()).unwrap();
    assert!(plugin.wait_for_releases(LIMIT));
    plugin.retry_round();
    assert!(plugin.wait_for_releases(LIMIT));

    std::fs::write(&document, good).unwrap();
    assert!(ledger.holds("sb").unwrap(), "kept while unreadable");
    let run = nri::api::PodSandbox {
        id: "later".into(),
        ..Default::default()
    };
    plugin.run_pod_sandbox(&run).unwrap();
    ledger.claim(&later, &[other_vf]).unwrap();
    plugin.retry_round();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(!ledger.holds("sb").unwrap(), "released once readable");
    assert!(
        ledger.snapshot().unwrap().pods.contains_key("later"),
        "run since: live"
    );
    // Owed once: later rounds release nothing more.
    ledger.claim(&gone, &[vf]).unwrap();
    plugin.retry_round();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(ledger.snapshot().unwrap().pods.contains_key("sb"));
}

/// A pod the runtime did not list at a Synchronize whose ledger read failed
/// (a containerd 1.7 sandbox reported with pid 0, its only container
/// exited) that creates a container once the ledger reads again exists: the
/// retry round's read counts it live and releases nothing of it.
#[test]
fn a_pod_that_creates_a_container_after_a_failed_synchronize_is_live() {
    use nri::stub::Plugin as _;
    let (plugin, fixture, _state) = hgx_plugin("");
    let gpu = &fixture.expected().gpus[1];
    let pod = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    let named = |id: &str| Container {
        id: id.into(),
        ..ctr()
    };
    plugin.create_container(&pod, &named("c1")).unwrap();
    let ledger = plugin.devices().ledger().clone();
    ledger.fold_journal().unwrap();
    let document = plugin.options.state_dir.join("ledger.json");
    let good = std::fs::read(&document).unwrap();
    std::fs::write(&document, b"{not json").unwrap();
    plugin.synchronize(Vec::new(), Vec::new()).unwrap();
    std::fs::write(&document, good).unwrap();
    plugin.create_container(&pod, &named("c2")).unwrap();
    plugin.retry_round();
    assert!(plugin.wait_for_releases(LIMIT));
    let snap = ledger.snapshot().unwrap();
    assert!(snap.pods[&pod.id].containers.contains_key("c2"), "{snap:?}");
}

/// A sandbox start that an NRI plugin called after devgate refused gets no
/// RemovePodSandbox: the claim made for it goes when kubelet starts the pod's
/// next sandbox, so that the pod does not find its devices held by itself.
/// Another pod's claim, and a sandbox of the pod that holds a container
/// (left to its stop or the next Synchronize), stay.
#[test]
fn a_sandbox_whose_start_failed_is_released_when_its_pod_starts_again() {
    use crate::ledger::{Claim, DeviceId, PodRef};
    use nri::stub::Plugin as _;
    let (plugin, _state) = plugin(Config::default(), false);
    let ledger = plugin.devices().ledger().clone();
    let (failed, vf) = pod_holding_a_vf();
    ledger.claim(&failed, std::slice::from_ref(&vf)).unwrap();
    let vf_n = |n: u8| Claim {
        device: DeviceId::Vf(format!("0000:19:00.{n}").parse().unwrap()),
        ..vf.clone()
    };
    let other = PodRef {
        sandbox_id: "other".into(),
        uid: "u2".into(),
        ..failed.clone()
    };
    ledger.claim(&other, &[vf_n(3)]).unwrap();
    let with_container = PodRef {
        sandbox_id: "ran".into(),
        ..failed.clone()
    };
    ledger.claim(&with_container, &[vf_n(4)]).unwrap();
    let record = crate::ledger::tests::record("main");
    ledger.record_container("ran", "c1", record).unwrap();

    let next = nri::api::PodSandbox {
        id: "sb-next".into(),
        uid: "u".into(),
        namespace: "team".into(),
        name: "web".into(),
        ..Default::default()
    };
    plugin.run_pod_sandbox(&next).unwrap();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(
        !ledger.holds("sb").unwrap(),
        "the failed start's claim goes"
    );
    assert!(ledger.holds("other").unwrap() && ledger.holds("ran").unwrap());
    // The VF is free for the pod's new sandbox.
    ledger
        .claim(
            &PodRef {
                sandbox_id: "sb-next".into(),
                ..failed
            },
            &[vf],
        )
        .unwrap();
    // A sandbox never supersedes itself.
    plugin.run_pod_sandbox(&next).unwrap();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(ledger.holds("sb-next").unwrap());
}

/// The cgroups GPU teardown keeps for a pod stay the pod's own however many
/// containers it ran: each removed container's own cgroup is forgotten at
/// its RemoveContainer, whether the runtime placed it beside the sandbox (a
/// CRI client without `cgroup_parent`) or beneath kubelet's pod cgroup.
#[test]
fn a_pods_kept_cgroups_do_not_grow_with_its_containers() {
    use crate::gpu::PodCgroups;
    use nri::api::{LinuxContainer, LinuxPodSandbox};
    use nri::stub::Plugin as _;
    let (plugin, fixture, _state) = hgx_plugin("");
    let gpu = &fixture.expected().gpus[0];
    for (parent, sandbox, beneath) in [
        ("", "/k8s.io/5a4d", false),
        (
            "/kubepods/besteffort/podA",
            "/kubepods/besteffort/podA/5a4d",
            true,
        ),
    ] {
        let mut pod = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
        pod.linux = Some(LinuxPodSandbox {
            cgroup_parent: parent.into(),
            cgroups_path: sandbox.into(),
            ..Default::default()
        })
        .into();
        let own = PodCgroups::from_paths(&[parent, sandbox]);
        for n in 0..20 {
            let id = format!("{n:064x}");
            let dir = if beneath { parent } else { "/k8s.io" };
            let mut c = ctr();
            c.id = id.clone();
            c.linux = Some(LinuxContainer {
                cgroups_path: format!("{dir}/{id}"),
                ..Default::default()
            })
            .into();
            plugin.adjustment(&pod, &c).unwrap();
            let kept = plugin.gpu().pod_cgroups(&pod.id).unwrap();
            assert!(kept.contains(&format!("0::{dir}/{id}\n")), "{kept:?}");
            plugin.remove_container(&pod, &c).unwrap();
            assert_eq!(plugin.gpu().pod_cgroups(&pod.id), Some(own.clone()));
        }
        plugin.remove_pod_sandbox(&pod).unwrap();
        assert!(plugin.wait_for_releases(LIMIT));
    }
}
