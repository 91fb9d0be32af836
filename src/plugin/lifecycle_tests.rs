//! Releases retried after a failed teardown, GPUs that appear after start-up,
//! a runtime-sent `[gpu]`, and the hook path a plugin names.
use super::*;

/// Pod "sb" and the VF claim it makes.
pub(super) fn pod_holding_a_vf() -> (crate::ledger::PodRef, crate::ledger::Claim) {
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

/// A process that can start no thread (a pids limit reached) does not tear a
/// stopped pod down on the stub's thread, which must answer the runtime
/// within its deadline: the release is left to the retry round, which runs
/// it on its own thread.
#[test]
fn without_a_thread_to_release_on_the_retry_round_releases() {
    use nri::stub::Plugin as _;
    let (mut plugin, _state) = plugin(Config::default(), false);
    plugin.release_workers = super::workers::Workers::without_threads();
    let ledger = plugin.devices().ledger().clone();
    let (pod, vf) = pod_holding_a_vf();
    ledger.claim(&pod, &[vf]).unwrap();
    let sandbox = nri::api::PodSandbox {
        id: "sb".into(),
        ..Default::default()
    };
    plugin.stop_pod_sandbox(&sandbox).unwrap();
    assert!(
        ledger.holds("sb").unwrap(),
        "not released on the stub's thread"
    );
    assert!(plugin.unreleased.pending().contains("sb"));
    // The retry thread's wait ends at once, not an interval later.
    assert!(plugin.round_wake.wait(std::time::Duration::from_secs(60)));
    plugin.retry_round();
    assert!(!ledger.holds("sb").unwrap());
    assert!(plugin.unreleased.pending().is_empty());
}

/// A claim made ahead of a refused container, with no thread to release it
/// on (a pids limit reached), goes on the stub's thread only where no other
/// release holds a turn of its devices: another pod's teardown may hold one
/// for seconds, past the runtime's deadline. While one is held the claim
/// stays and the stub goes on; once free, the next refusal releases it.
#[test]
fn without_a_thread_a_refused_containers_claim_waits_for_no_other_release() {
    let (mut plugin, _state) = plugin(Config::default(), false);
    plugin.release_workers = super::workers::Workers::without_threads();
    let ledger = plugin.devices().ledger().clone();
    let (pod, vf) = pod_holding_a_vf();
    ledger.claim(&pod, std::slice::from_ref(&vf)).unwrap();
    // Another release's turn, held until the refusal is through (or, where
    // the refusal waits for it, 5 s).
    let (through, held_until) = std::sync::mpsc::channel::<()>();
    let (taken, turn_taken) = std::sync::mpsc::channel();
    let other = {
        let ledger = ledger.clone();
        std::thread::spawn(move || {
            let _turn = ledger.lock_device(&vf.device).unwrap();
            taken.send(()).unwrap();
            let _ = held_until.recv_timeout(std::time::Duration::from_secs(5));
        })
    };
    turn_taken.recv().unwrap();
    plugin.release_refused("sb");
    let kept = ledger.holds("sb").unwrap();
    let _ = through.send(());
    other.join().unwrap();
    assert!(kept, "released only after waiting for the other release");
    plugin.release_refused("sb");
    assert!(!ledger.holds("sb").unwrap());
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
