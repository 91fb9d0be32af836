//! Releases retried after a failed teardown, a runtime-sent `[gpu]`, and
//! the hook path a plugin names.
use super::*;
use crate::ledger::Failed;

/// Pod "sb" and the VF claim it makes.
fn pod_holding_a_vf() -> (crate::ledger::PodRef, crate::ledger::Claim) {
    use crate::ledger::{Claim, DeviceId, PodRef, Share};
    let pod = PodRef {
        sandbox_id: "sb".into(),
        namespace: "team".into(),
        name: "web".into(),
        uid: "u".into(),
    };
    let vf = Claim {
        device: DeviceId::Vf("0000:19:00.2".parse().unwrap()),
        share: Share::Exclusive,
        pf: None,
    };
    (pod, vf)
}

/// A pod whose release failed and that admitted a container since (taken
/// for gone, it was not: a containerd 1.7 sandbox reported with pid 0) is
/// live: the retry round neither tears it down nor forgets its GPU cgroup
/// paths, and leaves it to its stop's release.
#[test]
fn a_retry_leaves_a_failed_pod_that_admitted_a_container_since() {
    /// Fails its first teardown; counts them all.
    #[derive(Default)]
    struct FailsFirst(std::sync::atomic::AtomicU32);
    impl crate::ledger::Teardown for FailsFirst {
        fn teardown(&self, _pod: &crate::ledger::PodRecord) -> Result<(), crate::ledger::Unclean> {
            match self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 => Err("vf restore failed".into()),
                _ => Ok(()),
            }
        }
    }
    let (mut plugin, _state) = plugin(Config::default(), false);
    let teardowns = Arc::new(FailsFirst::default());
    plugin.teardown = teardowns.clone();
    let (pod, vf) = pod_holding_a_vf();
    let ledger = plugin.devices().ledger().clone();
    let claims = std::slice::from_ref(&vf);
    ledger
        .admit(
            &pod,
            claims,
            "c1",
            crate::ledger::tests::record("c1"),
            false,
        )
        .unwrap();
    plugin.gpu().set_pod_cgroups("sb", &["/kubepods/sb"]);
    plugin.release_in_background(lifecycle::Release::Pod("sb".into()));
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(plugin.unreleased.pending().contains("sb"));
    ledger
        .admit(
            &pod,
            claims,
            "c3",
            crate::ledger::tests::record("c3"),
            false,
        )
        .unwrap();
    plugin.retry_round();
    let torn = teardowns.0.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(torn, 1, "the retry tore nothing down");
    let snap = ledger.snapshot().unwrap();
    assert!(snap.pods["sb"].containers.contains_key("c3"), "{snap:?}");
    assert!(plugin.gpu().pod_cgroups("sb").is_some(), "live: kept");
    assert!(plugin.unreleased.pending().is_empty(), "left to its stop");
}

/// A pod whose teardown failed at its last event (RemovePodSandbox) is not
/// left holding quarantined devices until the next restart: the retry round
/// runs its teardown again and releases it once that succeeds. Its GPU
/// cgroup paths stay for the retries and go with the release, which names
/// many pods.
#[test]
fn a_failed_release_is_retried_without_a_further_event() {
    use crate::ledger::PodRef;
    let (mut plugin, _state) = plugin(Config::default(), false);
    let flaky = Arc::new(Flaky(false.into()));
    plugin.teardown = flaky.clone();
    let (pod, vf) = pod_holding_a_vf();
    let ledger = plugin.devices().ledger().clone();
    ledger.claim(&pod, std::slice::from_ref(&vf)).unwrap();
    plugin.gpu().set_pod_cgroups("sb", &["/kubepods/sb"]);
    plugin.release_in_background(lifecycle::Release::Pod("sb".into()));
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(ledger.snapshot().unwrap().pods.contains_key("sb"));
    plugin.retry_round();
    assert!(
        ledger.snapshot().unwrap().pods.contains_key("sb"),
        "still failing: kept"
    );
    assert!(plugin.gpu().pod_cgroups("sb").is_some(), "failing: kept");
    flaky.0.store(true, std::sync::atomic::Ordering::SeqCst);
    plugin.retry_round();
    let snap = ledger.snapshot().unwrap();
    assert!(snap.pods.is_empty() && snap.devices.is_empty(), "{snap:?}");
    assert!(plugin.unreleased.pending().is_empty());
    assert!(
        plugin.gpu().pod_cgroups("sb").is_none(),
        "released: forgotten"
    );
    // The VF is free for the next pod.
    ledger
        .claim(
            &PodRef {
                sandbox_id: "sb2".into(),
                ..pod
            },
            &[vf],
        )
        .unwrap();
}

/// A pod the ledger holds nothing of needs no release: its stop and its
/// removal start no worker, and its GPU cgroup paths are forgotten at once.
/// A pod it holds is released on a worker at its stop.
#[test]
fn only_a_pod_the_ledger_holds_is_released_on_a_worker() {
    use nri::stub::Plugin as _;
    let (plugin, _state) = plugin(Config::default(), false);
    let sandbox = |id: &str| nri::api::PodSandbox {
        id: id.into(),
        ..Default::default()
    };
    plugin.gpu().set_pod_cgroups("plain", &["/kubepods/plain"]);
    plugin.stop_pod_sandbox(&sandbox("plain")).unwrap();
    assert!(plugin.gpu().pod_cgroups("plain").is_none());
    plugin.remove_pod_sandbox(&sandbox("plain")).unwrap();
    assert_eq!(plugin.release_workers.threads(), 0);

    let ledger = plugin.devices().ledger().clone();
    let (pod, vf) = pod_holding_a_vf();
    ledger.claim(&pod, &[vf]).unwrap();
    plugin.stop_pod_sandbox(&sandbox("sb")).unwrap();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(!ledger.holds("sb").unwrap());
    assert_eq!(plugin.release_workers.threads(), 1);
    plugin.remove_pod_sandbox(&sandbox("sb")).unwrap();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(ledger.snapshot().unwrap().pods.is_empty());
}

/// The hook beside the plugin when it is there; the installed one for a
/// plugin the runtime started from its plugin directory.
#[test]
fn the_hook_is_found_beside_the_plugin_or_where_bootstrap_installs_it() {
    let beside = |exe: &str, present: &'static [&'static str]| {
        hook_beside(std::path::Path::new(exe), |p| {
            present.iter().any(|f| p == std::path::Path::new(f))
        })
    };
    assert_eq!(
        beside(
            "/opt/devgate/bin/devgate",
            &["/opt/devgate/bin/devgate-hook"]
        ),
        std::path::PathBuf::from("/opt/devgate/bin/devgate-hook")
    );
    assert_eq!(
        beside("/opt/nri/plugins/10-devgate", &[]),
        std::path::PathBuf::from(INSTALLED_HOOK)
    );
}

/// A runtime-started plugin learns `[gpu]` at Configure: GPU health is read
/// from the runtime's `health_dir`, teardown follows its settings.
#[tokio::test]
async fn runtime_sent_gpu_config_is_in_force() {
    let state = tempfile::tempdir().unwrap();
    let fixture = crate::fixture::HostRootBuilder::hgx()
        .build(&state.path().join("host"))
        .unwrap();
    let options = PluginOptions {
        host_root: fixture.root().to_path_buf(),
        state_dir: state.path().join("state"),
        config_from_runtime: true,
    };
    let plugin = DevgatePlugin::new(Config::default(), options).unwrap();
    let health_dir = state.path().join("runtime-health");
    let gpu = &fixture.expected().gpus[0];
    crate::gpu::HealthStore::new(&health_dir)
        .mark(&gpu.uuid, &[crate::gpu::health::Fault::DoubleBitEcc], 1)
        .unwrap();
    let runtime = FakeConfig {
        config: format!(
            "[gpu]\nhealth_dir = \"{}\"\nnvml = false\nkill_grace_ms = 1234\n",
            health_dir.display()
        ),
        ..FakeConfig::containerd_1_7()
    };
    let (p, conn, _dir) = connect(plugin, runtime).await;
    let conn = conn.unwrap();
    let gpu_config = p.gpu().config().clone();
    assert_eq!(
        (
            gpu_config.health_dir.as_path(),
            gpu_config.nvml,
            gpu_config.kill_grace_ms
        ),
        (health_dir.as_path(), false, 1234)
    );
    let pod = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    let status = rpc_status(conn.create_container(&pod, &ctr()).await.unwrap_err());
    assert!(
        status.message().contains(gpu.uuid.as_str()) && status.message().contains("unhealthy"),
        "{}",
        status.message()
    );
}

/// GPUs the plugin did not see at start (their driver loaded later): the
/// container gets them after a re-read, and teardown knows them at release,
/// rather than quarantining them as unknown.
#[test]
fn gpus_that_appear_after_start_up_are_torn_down_and_released() {
    let state = tempfile::tempdir().unwrap();
    let host = state.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let plugin = plugin_on(&host, state.path(), "");
    assert!(plugin.gpu().inventory().gpus.is_empty());
    let fixture = crate::fixture::HostRootBuilder::hgx().build(&host).unwrap();
    let gpu = &fixture.expected().gpus[2];
    let pod = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    let adjust = plugin.adjustment(&pod, &ctr()).unwrap();
    assert!(!adjust.linux.is_none(), "{adjust:?}");
    assert!(plugin
        .gpu()
        .inventory()
        .gpus
        .iter()
        .any(|g| g.uuid == gpu.uuid));
    plugin.release_in_background(lifecycle::Release::Pod(pod.id.clone()));
    assert!(plugin.wait_for_releases(LIMIT));
    let snap = plugin.devices().ledger().snapshot().unwrap();
    assert!(snap.pods.is_empty() && snap.devices.is_empty(), "{snap:?}");
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
    let both: std::collections::HashSet<String> =
        ["a".to_string(), "b".to_string()].into_iter().collect();
    u.update(&Release::Pods(both.clone()), Some(&outcome));
    assert_eq!(u.pending(), ["b".to_string()].into_iter().collect());
    // The retry releases b only while no container was admitted since its
    // failure, when it had admitted 3; a pod the ledger could not read is
    // retried whatever it admitted.
    u.update(&Release::Pod("c".into()), None);
    let Some(Release::Retry(retry)) = u.retry() else {
        panic!("no retry")
    };
    assert_eq!(
        retry,
        [("b".to_string(), Some(3)), ("c".to_string(), None)]
            .into_iter()
            .collect()
    );
    u.update(&Release::Retry(retry), Some(&Released::default()));
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
