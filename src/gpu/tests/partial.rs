//! A pod whose teardown fails on one GPU gives its other GPUs back, cleaned;
//! the failing one stays the pod's, quarantined, until a retry cleans it
//! (fake host and NVML, real ledger).

use super::fake_host::{in_pod, FakeProc};
use super::pod;
use super::teardown::{claim, dev, node, resets, Node, HALF};
use crate::gpu::host::Signal;
use crate::ledger::{DeviceId, Share};

const WHOLE: Share = Share::Exclusive;

fn claimed_gpus(n: &Node, sandbox: &str) -> Vec<String> {
    let state = n.ledger.snapshot().unwrap();
    let Some(pod) = state.pods.get(sandbox) else {
        return Vec::new();
    };
    pod.claims.iter().map(|c| c.device.to_string()).collect()
}

fn quarantined(n: &Node, uuid: &str) -> bool {
    let state = n.ledger.snapshot().unwrap();
    let rec = state.devices.get(&DeviceId::Gpu(uuid.into()).to_string());
    rec.is_some_and(|r| r.quarantine.is_some())
}

fn pod_of_three(n: &Node) {
    let gpus = [
        claim("GPU-0", WHOLE),
        claim("GPU-1", WHOLE),
        claim("GPU-2", WHOLE),
    ];
    n.ledger.claim(&pod("a"), &gpus).unwrap();
}

/// Pod a holding GPU-0 and GPU-1 whole, with one container recorded: its id.
fn pod_of_two_recorded(n: &Node) -> &'static str {
    let gpus = [claim("GPU-0", WHOLE), claim("GPU-1", WHOLE)];
    let recorded = "0123456789abcdef";
    let record = crate::ledger::tests::record("main");
    n.ledger
        .admit(&pod("a"), &gpus, recorded, record, true)
        .unwrap();
    recorded
}

/// A node whose releases end with `gpu.full_reset`.
fn full_reset_node() -> Node {
    node(|c| {
        c.full_reset = true;
        c.reset_command = vec!["reset-gpu".into()];
    })
}

/// A process running devgate's own executable, holding `devs`, in `cgroup`.
fn devgate_proc(devs: Vec<u64>, cgroup: &str) -> FakeProc {
    FakeProc {
        devs,
        cgroup: format!("0::{cgroup}\n"),
        start: 1,
        devgate: true,
        ..FakeProc::default()
    }
}

/// Asserts that the release failed, its reason saying `text`.
fn failed_with(out: &crate::ledger::Released, text: &str) {
    let reason = out.failed.first().map(|f| f.reason.as_str());
    assert!(reason.is_some_and(|r| r.contains(text)), "{:?}", out.failed);
}
#[test]
fn a_gpu_whose_reset_fails_is_kept_and_the_others_go_back_reset() {
    let n = node(|_| {});
    pod_of_three(&n);
    n.nvml.failing.lock().unwrap().insert("GPU-1".into());
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    failed_with(&out, "GPU-1");
    assert_eq!(claimed_gpus(&n, "sb-a"), ["gpu GPU-1"]);
    assert!(quarantined(&n, "GPU-1"));
    assert!(!quarantined(&n, "GPU-0") && !quarantined(&n, "GPU-2"));
    assert_eq!((resets(&n.nvml, "GPU-0"), resets(&n.nvml, "GPU-2")), (1, 1));
    n.ledger
        .claim(&pod("b"), &[claim("GPU-0", WHOLE), claim("GPU-2", WHOLE)])
        .unwrap();
    assert!(n.ledger.claim(&pod("c"), &[claim("GPU-1", WHOLE)]).is_err());

    // Once the GPU can be reset, the retry ends the pod; the GPU retry then
    // returns it to service.
    n.nvml.failing.lock().unwrap().clear();
    let again = crate::ledger::gone(&["sb-a"]);
    let out = n.ledger.release_pods(&again, &n.teardown).unwrap();
    assert_eq!(out.pods, vec![pod("a")]);
    assert_eq!(resets(&n.nvml, "GPU-1"), 1);
    assert_eq!(n.teardown.retry_quarantined(&n.ledger).unwrap(), ["GPU-1"]);
    assert!(!quarantined(&n, "GPU-1"));
}

/// Pod a holds GPU-0 and GPU-1: process 50 holds GPU-0 and ends, 51 holds
/// GPU-1 and outlives SIGKILL; 51, as added.
fn survivor_beside_a_sibling(n: &Node) -> FakeProc {
    let gpus = [claim("GPU-0", WHOLE), claim("GPU-1", WHOLE)];
    n.ledger.claim(&pod("a"), &gpus).unwrap();
    n.host.add(50, &[dev(0)], "/kubepods/poduid-a/c1");
    let stuck = FakeProc {
        unkillable: true,
        ..in_pod(vec![dev(1)])
    };
    n.host.add_proc(51, stuck.clone());
    stuck
}

/// A process of the pod that outlives SIGKILL keeps the GPU it holds, not
/// the one its ended sibling held, which is reset and handed back.
#[test]
fn a_survivor_keeps_only_the_gpu_it_holds() {
    let n = node(|_| {});
    let stuck = survivor_beside_a_sibling(&n);
    let gpus = [claim("GPU-0", WHOLE), claim("GPU-1", WHOLE)];
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    failed_with(&out, "pids [51] of the released pod outlived SIGKILL");
    assert_eq!(claimed_gpus(&n, "sb-a"), ["gpu GPU-1"]);
    assert_eq!((resets(&n.nvml, "GPU-0"), resets(&n.nvml, "GPU-1")), (1, 0));
    assert!(!n.host.alive(50));

    // Holding both, it keeps both: none is reset.
    let n = node(|_| {});
    n.ledger.claim(&pod("a"), &gpus).unwrap();
    n.host.add_proc(
        51,
        FakeProc {
            devs: vec![dev(0), dev(1)],
            ..stuck
        },
    );
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.failed.len(), 1);
    assert_eq!(claimed_gpus(&n, "sb-a"), ["gpu GPU-0", "gpu GPU-1"]);
    assert_eq!((resets(&n.nvml, "GPU-0"), resets(&n.nvml, "GPU-1")), (0, 0));
}

/// A survivor on one GPU and a failed reset of another in the same release:
/// the survivor's GPU is quarantined in the pod's name (its only fault the
/// pod's own process, so the pod's later clean release lifts it for the
/// GPU's other holders), the other in no one's.
#[test]
fn a_survivors_gpu_stays_the_pods_own_beside_another_gpus_failed_reset() {
    let n = node(|_| {});
    survivor_beside_a_sibling(&n);
    n.nvml.failing.lock().unwrap().insert("GPU-0".into());
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.failed.len(), 1);
    let state = n.ledger.snapshot().unwrap();
    let set_by = |id: &str| state.devices[id].quarantine.clone().unwrap().set_by;
    assert_eq!(set_by("gpu GPU-1").as_deref(), Some("sb-a"));
    assert_eq!(set_by("gpu GPU-0"), None);
}

/// Pods a and b share GPU-0 and are released together; a's other GPU fails.
/// a gave GPU-0 up clean, so b is its last holder and resets it, once.
#[test]
fn a_shared_gpu_given_up_clean_is_reset_by_its_last_holder() {
    let n = node(|_| {});
    n.ledger
        .claim(&pod("a"), &[claim("GPU-0", HALF), claim("GPU-1", WHOLE)])
        .unwrap();
    n.ledger.claim(&pod("b"), &[claim("GPU-0", HALF)]).unwrap();
    n.nvml.failing.lock().unwrap().insert("GPU-1".into());
    let both = crate::ledger::gone(&["sb-a", "sb-b"]);
    let out = n.ledger.release_pods(&both, &n.teardown).unwrap();
    assert_eq!(out.pods, vec![pod("b")]);
    assert_eq!(out.failed.len(), 1);
    assert_eq!(resets(&n.nvml, "GPU-0"), 1);
    assert_eq!(claimed_gpus(&n, "sb-a"), ["gpu GPU-1"]);
    let state = n.ledger.snapshot().unwrap();
    assert!(!state.devices.contains_key("gpu GPU-0"), "{state:?}");
}

/// A process of the pod that still runs (here: it forks each time it is
/// ended) could open any GPU of the pod later: none goes back, not even one
/// it does not hold now.
#[test]
fn a_pod_process_still_running_keeps_every_gpu() {
    let n = node(|_| {});
    let gpus = [claim("GPU-0", WHOLE), claim("GPU-1", WHOLE)];
    n.ledger.claim(&pod("a"), &gpus).unwrap();
    let forking = FakeProc {
        forks_on_term: u32::MAX,
        ..in_pod(vec![dev(1)])
    };
    n.host.add_proc(50, forking);
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    failed_with(&out, "still hold it after 3 rounds");
    assert_eq!(claimed_gpus(&n, "sb-a"), ["gpu GPU-0", "gpu GPU-1"]);
    assert_eq!((resets(&n.nvml, "GPU-0"), resets(&n.nvml, "GPU-1")), (0, 0));
}

/// With `gpu.full_reset`, a GPU that failed keeps the others too: they go
/// back only with the full reset, which needs every one of them clean.
#[test]
fn with_full_reset_one_failed_gpu_keeps_them_all() {
    let n = full_reset_node();
    pod_of_three(&n);
    n.nvml.failing.lock().unwrap().insert("GPU-1".into());
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.failed.len(), 1);
    assert_eq!(claimed_gpus(&n, "sb-a").len(), 3);
    assert!(n.host.commands.lock().unwrap().is_empty(), "no full reset");
}

/// A claimed GPU the inventory no longer has: its holders were never
/// looked for, so none of the pod's GPUs goes back.
#[test]
fn a_gpu_gone_from_the_inventory_keeps_every_gpu() {
    let n = node(|_| {});
    let gpus = [claim("GPU-0", WHOLE), claim("GPU-gone", WHOLE)];
    n.ledger.claim(&pod("a"), &gpus).unwrap();
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    failed_with(&out, "GPU-gone is not in the inventory");
    assert_eq!(claimed_gpus(&n, "sb-a"), ["gpu GPU-0", "gpu GPU-gone"]);
}

/// A survivor of SIGKILL beside a process of the pod that holds no GPU (it
/// was never signalled, and its container's rules let it open any): every
/// GPU stays.
#[test]
fn a_survivor_beside_a_process_holding_no_gpu_keeps_every_gpu() {
    let n = node(|_| {});
    pod_of_three(&n);
    let stuck = FakeProc {
        unkillable: true,
        ..in_pod(vec![dev(1)])
    };
    n.host.add_proc(51, stuck);
    n.host.add(60, &[], "/kubepods/poduid-a/c2");
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    failed_with(&out, "outlived SIGKILL");
    assert!(n.host.alive(60));
    assert_eq!(claimed_gpus(&n, "sb-a").len(), 3);
}

/// A process of a container the pod recorded still runs at the release,
/// holding no GPU (a container the runtime lost, its cgroup and device rules
/// alive): it could open any of them later, so it is ended as a holder is,
/// and the GPUs go back reset. A process of the pod in no recorded container
/// (the sandbox's) has no rule for them and is left.
#[test]
fn a_recorded_containers_process_holding_no_gpu_is_ended() {
    let n = node(|_| {});
    let recorded = pod_of_two_recorded(&n);
    n.host.add(70, &[], "/kubepods/poduid-a/fedcba9876543210");
    n.host
        .add(60, &[], &format!("/kubepods/poduid-a/{recorded}"));
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert!(!n.host.alive(60));
    assert_eq!(n.host.signals(), [(60, Signal::Term)]);
    assert!(
        n.host.alive(70),
        "the sandbox's process is not the release's"
    );
    assert!(claimed_gpus(&n, "sb-a").is_empty());
    assert_eq!(resets(&n.nvml, "GPU-0"), 1);
}

/// Such a process that outlives SIGKILL keeps every GPU: it holds none,
/// so none can be told apart as the one it would open.
#[test]
fn a_recorded_containers_survivor_holding_no_gpu_keeps_every_gpu() {
    let n = node(|_| {});
    let recorded = pod_of_two_recorded(&n);
    let stuck = FakeProc {
        unkillable: true,
        cgroup: format!("0::/kubepods/poduid-a/{recorded}\n"),
        ..in_pod(Vec::new())
    };
    n.host.add_proc(60, stuck);
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    failed_with(&out, "outlived SIGKILL");
    assert_eq!(claimed_gpus(&n, "sb-a").len(), 2);
    assert_eq!(resets(&n.nvml, "GPU-0") + resets(&n.nvml, "GPU-1"), 0);
}

/// A survivor of SIGKILL beside a child another process forked as it was
/// ended: the child was never signalled and runs, so every GPU stays.
#[test]
fn a_survivor_beside_a_running_child_keeps_every_gpu() {
    let n = node(|_| {});
    pod_of_three(&n);
    n.host.add_proc(
        50,
        FakeProc {
            forks_on_term: 1,
            ..in_pod(vec![dev(0)])
        },
    );
    n.host.add_proc(
        51,
        FakeProc {
            unkillable: true,
            ..in_pod(vec![dev(1)])
        },
    );
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    failed_with(&out, "outlived SIGKILL");
    assert!(n.host.alive(1050), "the child runs");
    assert_eq!(claimed_gpus(&n, "sb-a").len(), 3);
    assert_eq!(resets(&n.nvml, "GPU-2"), 0);
}

/// NVML cannot list the processes of a GPU that fell off the bus (XID 79,
/// `GPU_IS_LOST`): that GPU stays the pod's, quarantined; the pod's process
/// on its healthy GPU is still ended, and that GPU reset and handed back.
#[test]
fn a_lost_gpu_keeps_only_itself() {
    let n = node(|_| {});
    let gpus = [claim("GPU-0", WHOLE), claim("GPU-1", WHOLE)];
    n.ledger.claim(&pod("a"), &gpus).unwrap();
    n.host.add(50, &[dev(0)], "/kubepods/poduid-a/c1");
    n.nvml.lost.lock().unwrap().insert("GPU-1".into());
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    failed_with(&out, "on gpu GPU-1 failed: gpu is lost");
    assert!(!n.host.alive(50), "the pod's process was ended");
    assert_eq!(claimed_gpus(&n, "sb-a"), ["gpu GPU-1"]);
    assert!(quarantined(&n, "GPU-1") && !quarantined(&n, "GPU-0"));
    assert_eq!((resets(&n.nvml, "GPU-0"), resets(&n.nvml, "GPU-1")), (1, 0));
}

/// With `gpu.full_reset`, a lost GPU elsewhere on the node leaves its users
/// unknown: no full reset runs, as when a GPU is in use.
#[test]
fn a_lost_gpu_elsewhere_means_no_full_reset() {
    let n = full_reset_node();
    n.ledger.claim(&pod("a"), &[claim("GPU-0", WHOLE)]).unwrap();
    n.nvml.lost.lock().unwrap().insert("GPU-1".into());
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert_eq!(resets(&n.nvml, "GPU-0"), 1);
    assert!(n.host.commands.lock().unwrap().is_empty(), "no full reset");
}

/// A process of the released pod running devgate's own executable (a
/// hostPath of it, or a copy exec'd by the pod) is the pod's like any other,
/// and ended; another devgate process outside the pod is no user.
#[test]
fn devgates_executable_in_the_pod_is_ended_and_outside_no_user() {
    let n = node(|_| {});
    n.ledger.claim(&pod("a"), &[claim("GPU-0", WHOLE)]).unwrap();
    n.host
        .add_proc(50, devgate_proc(vec![dev(0)], "/kubepods/poduid-a/c1"));
    let outside = devgate_proc(vec![dev(0)], "/system.slice/containerd.service");
    n.host.add_proc(60, outside);
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert!(!n.host.alive(50), "the pod's copy was ended");
    assert!(n.host.alive(60), "another devgate is never signalled");
    assert_eq!(resets(&n.nvml, "GPU-0"), 1);
}

/// Another devgate process is no user of a released GPU, but it holds it:
/// the full reset, which needs every GPU of the node idle, is not run.
#[test]
fn another_devgate_holding_a_gpu_means_no_full_reset() {
    let n = full_reset_node();
    n.ledger.claim(&pod("a"), &[claim("GPU-0", WHOLE)]).unwrap();
    let other = devgate_proc(vec![dev(0), dev(1)], "/system.slice/containerd.service");
    n.host.add_proc(60, other);
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert_eq!(resets(&n.nvml, "GPU-0"), 1, "the light cleaning ran");
    assert!(n.host.commands.lock().unwrap().is_empty(), "no full reset");
}

/// A GPU the inventory finds unusable (excluded from the driver), which NVML
/// does not list, is no unknown user elsewhere: the full reset runs.
#[test]
fn an_excluded_gpu_elsewhere_does_not_stop_the_full_reset() {
    let n = full_reset_node();
    let mut inv = super::gpu_inventory(195, &[0, 1, 2]);
    let excluded = inv.gpus[2].uuid.clone();
    inv.gpus[2].health = crate::inventory::Health::Unhealthy {
        reason: "excluded by NVreg_ExcludedGpus".into(),
    };
    n.teardown.set_inventory(std::sync::Arc::new(inv));
    // NVML fails for it, as for a GPU it does not enumerate.
    n.nvml.lost.lock().unwrap().insert(excluded);
    n.ledger.claim(&pod("a"), &[claim("GPU-0", WHOLE)]).unwrap();
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert_eq!(resets(&n.nvml, "GPU-0"), 1);
    assert!(
        !n.host.commands.lock().unwrap().is_empty(),
        "the full reset ran"
    );
}
