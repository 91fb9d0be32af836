//! A GPU shared by pods: reset by its last holder only, once when its holders
//! are released together or at once by two processes, and an outside user
//! found by whichever release comes last.

use std::collections::HashSet;
use std::sync::Arc;

use super::teardown::{claim, dev, node, resets, Node, HALF};
use super::{gpu_inventory, pod};
use crate::config::GpuConfig;
use crate::gpu::nvml::fake::Call;
use crate::gpu::GpuTeardown;
use crate::ledger::Ledger;

#[test]
fn a_shared_gpu_is_reset_by_its_last_holder_only() {
    let n = node(|_| {});
    n.nvml.mig.lock().unwrap().insert("GPU-1".into());
    n.ledger.claim(&pod("a"), &[claim("GPU-1", HALF)]).unwrap();
    n.ledger.claim(&pod("b"), &[claim("GPU-1", HALF)]).unwrap();
    n.host.add(10, &[dev(1)], "/kubepods/poduid-a");
    n.host.add(20, &[dev(1)], "/kubepods/poduid-b");
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert!(!n.host.alive(10) && n.host.alive(20));
    assert!(n.nvml.calls().is_empty(), "b still uses it");

    let out = n.ledger.release_pod("sb-b", &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert!(!n.host.alive(20));
    assert_eq!(resets(&n.nvml, "GPU-1"), 1);
    assert!(!n.nvml.calls().contains(&Call::DestroyMig("GPU-1".into())));
}

#[test]
fn pods_sharing_a_gpu_released_together_reset_it_once() {
    let n = node(|_| {});
    n.ledger.claim(&pod("a"), &[claim("GPU-2", HALF)]).unwrap();
    n.ledger.claim(&pod("b"), &[claim("GPU-2", HALF)]).unwrap();
    let gone = n.ledger.stale_pods(&HashSet::new()).unwrap();
    let out = n.ledger.release_pods(&gone, &n.teardown).unwrap();
    assert_eq!((out.pods.len(), out.failed.len()), (2, 0));
    assert_eq!(resets(&n.nvml, "GPU-2"), 1);
}

/// Runs a teardown, then waits before the ledger commits the release: the
/// window in which a concurrent release of a pod sharing the GPU would still
/// see this pod as a holder.
struct CommitsLate<'a>(&'a GpuTeardown);

impl crate::ledger::Teardown for CommitsLate<'_> {
    fn teardown(&self, pod: &crate::ledger::PodRecord) -> Result<(), crate::ledger::Unclean> {
        let out = crate::ledger::Teardown::teardown(self.0, pod);
        std::thread::sleep(std::time::Duration::from_millis(150));
        out
    }
}

/// Pods a and b share GPU-1 and are released at once, each by its own
/// process (two poststop hooks), each with its own memory of what it released.
fn release_both_at_once(n: &Node) -> Vec<String> {
    n.ledger.claim(&pod("a"), &[claim("GPU-1", HALF)]).unwrap();
    n.ledger.claim(&pod("b"), &[claim("GPU-1", HALF)]).unwrap();
    let dir = n.dir.path().join("ledger");
    let other = GpuTeardown::new(
        gpu_inventory(195, &[0, 1, 2]),
        GpuConfig {
            health_dir: n.dir.path().join("health"),
            ..GpuConfig::default()
        },
        n.host.clone(),
        n.nvml.clone(),
        Arc::new(Ledger::open(&dir).unwrap()),
    );
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| n.ledger.release_pod("sb-a", &CommitsLate(&n.teardown)));
        let b = s.spawn(|| {
            let ledger = Ledger::open(&dir).unwrap();
            ledger.release_pod("sb-b", &CommitsLate(&other))
        });
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    a.failed
        .into_iter()
        .chain(b.failed)
        .map(|f| f.reason)
        .collect()
}

#[test]
fn pods_sharing_a_gpu_released_at_once_reset_it_once() {
    let n = node(|_| {});
    assert_eq!(release_both_at_once(&n), Vec::<String>::new());
    assert_eq!(resets(&n.nvml, "GPU-1"), 1, "the last holder resets it");
    assert!(n.ledger.snapshot().unwrap().pods.is_empty());
}

#[test]
fn pods_sharing_a_gpu_released_at_once_find_an_outside_user() {
    let n = node(|_| {});
    n.host.add(30, &[dev(1)], "/user.slice");
    let failed = release_both_at_once(&n);
    assert_eq!(failed.len(), 1, "the last holder checks: {failed:?}");
    assert!(failed[0].contains("pids [30]"), "{failed:?}");
    let quarantined = n.ledger.snapshot().unwrap().devices["gpu GPU-1"]
        .quarantine
        .clone();
    assert!(quarantined.is_some());
}

/// Runs the GPU teardown, then admits a container into the pod before the
/// ledger decides: a guarded release then keeps the pod whole.
struct JoinedMeanwhile<'a>(&'a Node);

impl crate::ledger::Teardown for JoinedMeanwhile<'_> {
    fn teardown(&self, pod: &crate::ledger::PodRecord) -> Result<(), crate::ledger::Unclean> {
        let out = crate::ledger::Teardown::teardown(&self.0.teardown, pod);
        let record = crate::ledger::tests::record("main");
        let claims = [claim("GPU-1", HALF)];
        self.0
            .ledger
            .admit(&pod.pod, &claims, "c-new", record, false)
            .unwrap();
        out
    }

    fn kept(&self, pod: &crate::ledger::PodRecord) {
        crate::ledger::Teardown::kept(&self.0.teardown, pod);
    }
}

/// A pod whose release is called off (a container joined it while its
/// teardown ran) holds its share still: the release of the other pod on the
/// GPU is not its last holder's, so it neither resets the GPU nor takes the
/// kept pod's process for an outsider.
#[test]
fn a_pod_kept_by_its_release_still_holds_its_share() {
    let n = node(|_| {});
    n.ledger.claim(&pod("a"), &[claim("GPU-1", HALF)]).unwrap();
    n.ledger.claim(&pod("b"), &[claim("GPU-1", HALF)]).unwrap();
    n.teardown.set_pod_cgroups("sb-a", &["/kubepods/poduid-a"]);
    let kept = n
        .ledger
        .release_pod_unjoined("sb-a", 0, &JoinedMeanwhile(&n));
    assert_eq!(kept.unwrap(), crate::ledger::GuardedRelease::Changed);
    assert!(n.ledger.holds("sb-a").unwrap());
    assert!(n.teardown.pod_cgroups("sb-a").is_some(), "a's paths kept");

    n.host.add(10, &[dev(1)], "/kubepods/poduid-a");
    let out = n.ledger.release_pod("sb-b", &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert!(n.host.alive(10), "a's process is a's");
    assert_eq!(resets(&n.nvml, "GPU-1"), 0, "a still holds GPU-1");
}

/// A GPU two pods share, quarantined by one pod's failed release alone (a
/// process of it that survived being ended): once that pod's retry
/// succeeds, the GPU is as a first successful release would have left it,
/// and takes new shares beside the other pod, without a reset (its last
/// holder's release resets it). A quarantine another cause joined stays.
#[test]
fn a_shared_gpu_quarantined_by_one_pods_leftover_returns_once_that_pod_is_released() {
    use super::fake_host::{in_pod, FakeProc};
    for other_cause in [false, true] {
        let n = node(|_| {});
        n.ledger.claim(&pod("a"), &[claim("GPU-1", HALF)]).unwrap();
        n.ledger.claim(&pod("b"), &[claim("GPU-1", HALF)]).unwrap();
        let stuck = FakeProc {
            unkillable: true,
            ..in_pod(vec![dev(1)])
        };
        n.host.add_proc(10, stuck);
        let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
        assert_eq!(out.failed.len(), 1, "{out:?}");
        if other_cause {
            let gpu = crate::ledger::DeviceId::Gpu("GPU-1".into());
            n.ledger.quarantine(&gpu, "xid 79").unwrap();
        }
        let refused = n.ledger.claim(&pod("c"), &[claim("GPU-1", HALF)]);
        assert!(refused.is_err(), "quarantined while a's process runs");

        n.host.procs.lock().unwrap().remove(&10);
        let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
        assert_eq!((out.pods.len(), out.failed.len()), (1, 0), "{out:?}");
        let quarantine = n.ledger.snapshot().unwrap().devices["gpu GPU-1"]
            .quarantine
            .clone();
        assert_eq!(quarantine.is_some(), other_cause, "{quarantine:?}");
        let claimed = n.ledger.claim(&pod("c"), &[claim("GPU-1", HALF)]);
        assert_eq!(claimed.is_ok(), !other_cause, "{claimed:?}");
        assert_eq!(resets(&n.nvml, "GPU-1"), 0, "b still holds GPU-1");
    }
}
