//! GpuTeardown against a fake host and a recording NVML, through the real ledger.

use std::collections::HashSet;
use std::sync::Arc;

use super::fake_host::{FakeHost, FakeProc};
use super::{gpu_inventory, pod};
use crate::config::GpuConfig;
use crate::gpu::health::Fault;
use crate::gpu::host::Signal;
use crate::gpu::nvml::fake::{Call, FakeNvml};
use crate::gpu::nvml::{ComputeMode, MemoryHealth};
use crate::gpu::{check_claims, GpuTeardown, Retried};
use crate::ledger::{Claim, DeviceId, Ledger, Share};

pub(super) struct Node {
    pub dir: tempfile::TempDir,
    pub ledger: Ledger,
    pub host: Arc<FakeHost>,
    pub nvml: Arc<FakeNvml>,
    pub teardown: GpuTeardown,
}

pub(super) fn node(config: impl FnOnce(&mut GpuConfig)) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger")).unwrap();
    let mut cfg = GpuConfig {
        health_dir: dir.path().join("health"),
        kill_grace_ms: 100,
        kill_wait_ms: 50,
        ..GpuConfig::default()
    };
    config(&mut cfg);
    let (host, nvml) = (Arc::new(FakeHost::default()), Arc::new(FakeNvml::default()));
    let teardown = GpuTeardown::new(
        gpu_inventory(195, &[0, 1, 2]),
        cfg,
        host.clone(),
        nvml.clone(),
        Arc::new(ledger.clone()),
    );
    Node {
        dir,
        ledger,
        host,
        nvml,
        teardown,
    }
}

pub(super) fn dev(minor: u32) -> u64 {
    libc::makedev(195, minor)
}

pub(super) fn claim(uuid: &str, share: Share) -> Claim {
    Claim {
        device: DeviceId::Gpu(uuid.to_string()),
        share,
        pf: None,
    }
}

pub(super) const HALF: Share = Share::Shared {
    core: 50,
    memory_ratio: 50,
};

pub(super) fn resets(nvml: &FakeNvml, uuid: &str) -> usize {
    let want = Call::SetComputeMode(uuid.to_string(), ComputeMode::Default);
    nvml.calls().iter().filter(|c| **c == want).count()
}

#[test]
fn pod_users_end_and_an_outside_user_quarantines_until_it_is_gone() {
    let n = node(|_| {});
    let a = pod("a");
    n.ledger
        .claim(&a, &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    n.host
        .add(100, &[dev(0)], "/kubepods/besteffort/poduid-a/c1");
    n.host.add_proc(
        101,
        FakeProc {
            devs: vec![dev(0)],
            cgroup: "0::/kubepods/besteffort/poduid-a/c2\n".into(),
            start: 7,
            ignores_term: true,
            ..FakeProc::default()
        },
    );
    n.host.add(200, &[dev(0)], "/system.slice/ssh.service");
    n.host.add(
        300,
        &[dev(0), dev(1)],
        "/system.slice/nvidia-persistenced.service",
    );
    n.host.add(
        400,
        &[libc::makedev(1, 3)],
        "/kubepods/besteffort/poduid-a/c1",
    );
    // A pod process in a cgroup named like a node daemon: still the pod's.
    n.host.add(
        102,
        &[dev(0)],
        "/kubepods/besteffort/poduid-a/c1/nvidia-dcgm.service",
    );

    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.pods, vec![]);
    let reason = &out.failed[0].reason;
    assert!(
        reason.contains("gpu GPU-0 is still open in pids [200]"),
        "{reason}"
    );
    let sigs = n.host.signals();
    assert_eq!(
        sigs,
        vec![
            (100, Signal::Term),
            (101, Signal::Term),
            (102, Signal::Term),
            (101, Signal::Kill)
        ]
    );
    assert!(n.host.slept().as_millis() >= 100, "grace period honoured");
    assert!(n.host.alive(200) && n.host.alive(300) && n.host.alive(400));
    assert_eq!(resets(&n.nvml, "GPU-0"), 0, "a gpu in use is not reset");
    let state = n.ledger.snapshot().unwrap();
    assert!(state.devices["gpu GPU-0"].quarantine.is_some());
    assert!(state.pods.contains_key("sb-a"));

    n.host.procs.lock().unwrap().remove(&200);
    let gone = n.ledger.stale_pods(&HashSet::new()).unwrap();
    let out = n.ledger.release_pods(&gone, &n.teardown).unwrap();
    assert_eq!(out.pods.len(), 1);
    assert!(n.ledger.snapshot().unwrap().devices["gpu GPU-0"]
        .quarantine
        .is_some());
    assert_eq!(
        n.teardown.retry_quarantined(&n.ledger).unwrap(),
        vec!["GPU-0"]
    );
    assert!(n.ledger.snapshot().unwrap().devices.is_empty());
    assert!(resets(&n.nvml, "GPU-0") >= 1);
}

#[test]
fn a_retry_of_some_gpus_leaves_the_others_quarantined() {
    let n = node(|_| {});
    for uuid in ["GPU-0", "GPU-1"] {
        let gpu = DeviceId::Gpu(uuid.into());
        n.ledger.quarantine(&gpu, "was open elsewhere").unwrap();
    }
    let cleared = n.teardown.retry_quarantined_of(&n.ledger, |u| u == "GPU-1");
    assert_eq!(cleared.unwrap(), vec!["GPU-1"]);
    let devices = n.ledger.snapshot().unwrap().devices;
    assert_eq!(devices.keys().collect::<Vec<_>>(), ["gpu GPU-0"]);
    assert_eq!((resets(&n.nvml, "GPU-0"), resets(&n.nvml, "GPU-1")), (0, 1));
}

/// Picked from an old snapshot: another retry cleaned it meanwhile and a
/// new pod took it. Looked at again once the GPU's turn is taken: not reset.
#[test]
fn a_retry_of_a_gpu_cleaned_and_taken_since_resets_nothing() {
    let n = node(|_| {});
    let gpu = DeviceId::Gpu("GPU-1".into());
    n.ledger.quarantine(&gpu, "was open elsewhere").unwrap();
    n.ledger.clear_quarantine(&gpu).unwrap();
    n.ledger
        .claim(&pod("b"), &[claim("GPU-1", Share::Exclusive)])
        .unwrap();
    let retried = n.teardown.retry_one(&n.ledger, "GPU-1").unwrap();
    assert_eq!(retried, Retried::Skipped);
    assert_eq!(resets(&n.nvml, "GPU-1"), 0);
    // While a release or another retry has its turn, this one waits.
    let turn = n.ledger.lock_device(&gpu).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| tx.send(n.teardown.retry_one(&n.ledger, "GPU-1").unwrap()));
        let waited = rx.recv_timeout(std::time::Duration::from_millis(200));
        assert!(waited.is_err(), "retried while another had the turn");
        drop(turn);
        assert_eq!(rx.recv().unwrap(), Retried::Skipped);
    });
}

#[test]
fn a_clean_whole_gpu_is_reset_mig_first() {
    let n = node(|_| {});
    n.nvml.mig.lock().unwrap().insert("GPU-1".into());
    n.ledger
        .claim(&pod("a"), &[claim("GPU-1", Share::Exclusive)])
        .unwrap();
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert_eq!(
        n.nvml.calls(),
        vec![
            Call::DestroyMig("GPU-1".into()),
            Call::ResetApplicationClocks("GPU-1".into()),
            Call::ResetLockedClocks("GPU-1".into()),
            Call::SetComputeMode("GPU-1".into(), ComputeMode::Default),
        ]
    );
    assert!(n.host.signals().is_empty());
}

/// A GPU whose NVML cannot list processes is released on what /proc shows.
#[test]
fn a_gpu_that_cannot_list_processes_is_released_on_the_proc_scan() {
    let n = node(|_| {});
    n.nvml
        .processes_unsupported
        .store(true, std::sync::atomic::Ordering::Relaxed);
    n.ledger
        .claim(&pod("a"), &[claim("GPU-1", Share::Exclusive)])
        .unwrap();
    n.host.add(10, &[dev(1)], "/kubepods/poduid-a");
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert!(
        !n.host.alive(10),
        "the pod's process found in /proc is ended"
    );
    assert!(n.ledger.snapshot().unwrap().pods.is_empty());
}

#[test]
fn nvml_contexts_count_as_users() {
    let n = node(|_| {});
    n.ledger
        .claim(&pod("a"), &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    n.host.add(40, &[], "/kubepods/poduid-a/c");
    n.host.add(41, &[], "/user.slice");
    n.nvml
        .processes
        .lock()
        .unwrap()
        .insert("GPU-0".into(), vec![40, 41]);
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert!(!n.host.alive(40) && n.host.alive(41));
    assert!(
        out.failed[0].reason.contains("pids [41]"),
        "{:?}",
        out.failed
    );
}

#[test]
fn nvml_failure_and_survivors_fail_the_teardown() {
    let n = node(|_| {});
    n.nvml.failing.lock().unwrap().insert("GPU-0".into());
    n.ledger
        .claim(&pod("a"), &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert!(
        out.failed[0].reason.contains("no permission"),
        "{:?}",
        out.failed
    );

    let n = node(|_| {});
    n.ledger
        .claim(&pod("a"), &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    let stuck = FakeProc {
        unkillable: true,
        ..super::fake_host::in_pod(vec![dev(0)])
    };
    n.host.add_proc(50, stuck);
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert!(out.failed[0]
        .reason
        .contains("pids [50] of the released pod outlived SIGKILL"));
    assert!(n.nvml.calls().is_empty());
}

#[test]
fn nri_cgroup_paths_place_processes_without_a_uid() {
    let n = node(|_| {});
    let mut p = pod("a");
    p.uid.clear();
    n.ledger
        .claim(&p, &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    n.teardown
        .set_pod_cgroups("sb-a", &["kubepods-burstable-podA.slice"]);
    n.host.add(
        60,
        &[dev(0)],
        "/kubepods.slice/kubepods-burstable-podA.slice/x.scope",
    );
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert!(!n.host.alive(60));
}

#[test]
fn unknown_gpus_fail_rather_than_pass_unchecked() {
    let n = node(|_| {});
    n.ledger
        .claim(&pod("a"), &[claim("GPU-9", Share::Exclusive)])
        .unwrap();
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert!(out.failed[0]
        .reason
        .contains("gpu GPU-9 is not in the inventory"));
}

#[test]
fn full_reset_runs_only_when_every_gpu_is_idle() {
    let n = node(|c| c.full_reset = true);
    n.ledger
        .claim(&pod("a"), &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    n.ledger
        .claim(&pod("b"), &[claim("GPU-1", Share::Exclusive)])
        .unwrap();
    n.host.add(70, &[dev(1)], "/kubepods/poduid-b");
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert!(n.host.commands.lock().unwrap().is_empty(), "gpu 1 busy");

    n.host.procs.lock().unwrap().remove(&70);
    n.ledger
        .claim(&pod("c"), &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    let out = n.ledger.release_pod("sb-c", &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    let commands = n.host.commands.lock().unwrap().clone();
    assert_eq!(
        commands,
        vec![["nvidia-smi", "--gpu-reset", "-i", "0000:18:00.0"]]
    );
}

#[test]
fn pending_retired_pages_take_a_released_gpu_out_of_service() {
    let n = node(|_| {});
    let pending = MemoryHealth {
        retired_pages_pending: Some(true),
        ..MemoryHealth::default()
    };
    n.nvml.set_health("GPU-0", pending);
    let claims = [claim("GPU-0", Share::Exclusive)];
    check_claims(n.teardown.health(), &claims).unwrap();
    n.ledger.claim(&pod("a"), &claims).unwrap();
    n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    let err = check_claims(n.teardown.health(), &claims).unwrap_err();
    assert_eq!(
        err.to_string(),
        "gpu GPU-0 is unhealthy: retired pages pending"
    );
    let state = n.teardown.health().snapshot().unwrap();
    assert_eq!(
        state.unhealthy("GPU-0").unwrap().faults,
        vec![Fault::RetiredPagesPending]
    );
}
