//! Releasing a pod: a failed teardown keeps its record and quarantines its
//! devices, two releases of one pod at once tear down once, a retried teardown
//! returns what it can, an unknown pod changes nothing.
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::time::Duration;

use super::tests::{gpu, ledger, pod};
use super::*;

struct Failing;
impl Teardown for Failing {
    fn teardown(&self, _pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
        Err("vf restore failed".into())
    }
}

#[test]
fn failed_teardown_keeps_record_and_quarantines() {
    let (_d, l) = ledger();
    let vf = Claim {
        device: DeviceId::Vf("0000:19:00.2".parse().unwrap()),
        share: Share::Exclusive,
        pf: None,
    };
    l.claim(&pod("a"), std::slice::from_ref(&vf)).unwrap();
    let rel = l.release_pod("a", &Failing).unwrap();
    assert_eq!(rel.failed.len(), 1);
    let snap = l.snapshot().unwrap();
    assert!(snap.pods.contains_key("a"));
    let err = l.claim(&pod("b"), std::slice::from_ref(&vf)).unwrap_err();
    assert!(matches!(
        err,
        LedgerError::Held { .. } | LedgerError::Quarantined { .. }
    ));
    let err = l.release_pod("a", &Failing).map(|r| r.failed.len());
    assert_eq!(err.unwrap(), 1, "a second failure keeps it");
    let err = l.claim(&pod("b"), std::slice::from_ref(&vf)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "vf 0000:19:00.2 is quarantined: vf restore failed"
    );
    // A later reconcile whose teardown works releases it and returns the VF.
    l.release_pod("a", &NoTeardown).unwrap();
    let snap = l.snapshot().unwrap();
    assert!(snap.pods.is_empty() && snap.devices.is_empty(), "{snap:?}");
    l.claim(&pod("b"), &[vf]).unwrap();
}

/// A teardown that lets a second release start (`go`), then gives it a while
/// to run a teardown of its own (`entered`) before finishing: the window in
/// which two releases of one pod would both tear it down.
pub(super) struct LetsAnotherTry {
    go: mpsc::Sender<()>,
    entered: mpsc::Receiver<()>,
    pub seen: std::cell::RefCell<Vec<String>>,
}

impl LetsAnotherTry {
    /// The teardown, and the two ends the second release uses.
    pub fn new() -> (LetsAnotherTry, mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (go, started) = mpsc::channel();
        let (enters, entered) = mpsc::channel();
        let t = LetsAnotherTry {
            go,
            entered,
            seen: Default::default(),
        };
        (t, started, enters)
    }
}

impl Teardown for LetsAnotherTry {
    fn teardown(&self, pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
        self.seen.borrow_mut().push(pod.pod.sandbox_id.clone());
        let _ = self.go.send(());
        match self.entered.recv_timeout(Duration::from_millis(300)) {
            Ok(()) => Err("torn down by two releases at once".into()),
            Err(_) => Ok(()),
        }
    }
}

/// The second release's teardown: says it ran.
pub(super) struct Enters(pub mpsc::Sender<()>);

impl Teardown for Enters {
    fn teardown(&self, _pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
        let _ = self.0.send(());
        Ok(())
    }
}

/// Two releases of one pod at once (StopPodSandbox's and RemovePodSandbox's,
/// a Synchronize's, the retry's), here of pods with exclusive GPUs: the
/// second waits for the first to commit and finds the pod gone, so the GPU
/// is never torn down (reset) again after a new pod may have taken it.
#[test]
fn a_second_release_of_a_pod_waits_for_the_first_and_tears_down_nothing() {
    let (d, l) = ledger();
    l.claim(&pod("a"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap();
    l.claim(&pod("b"), &[gpu("GPU-2", Share::Exclusive)])
        .unwrap();
    let (first, started, enters) = LetsAnotherTry::new();
    let dir = d.path().to_path_buf();
    let second = std::thread::scope(|s| {
        let second = s.spawn(move || {
            started.recv().unwrap();
            let other = Ledger::open(&dir).unwrap();
            other.release_pod("b", &Enters(enters)).unwrap()
        });
        let gone = l.stale_pods(&HashSet::new()).unwrap();
        let rel = l.release_pods(&gone, &first).unwrap();
        assert_eq!(rel.failed, Vec::new());
        assert_eq!(rel.pods, vec![pod("a"), pod("b")]);
        second.join().unwrap()
    });
    assert_eq!(*first.seen.borrow(), ["a", "b"]);
    assert!(
        second.pods.is_empty() && second.failed.is_empty(),
        "{second:?}"
    );
    assert!(l.snapshot().unwrap().pods.is_empty());
}

/// A GPU of a pod whose teardown failed stays quarantined after the retry
/// succeeds: only the GPU retry, which cleans it first, returns it.
#[test]
fn a_retried_teardown_returns_nics_but_not_gpus() {
    let (_d, l) = ledger();
    let gpu = Claim {
        device: DeviceId::Gpu("GPU-1".into()),
        share: Share::Exclusive,
        pf: None,
    };
    let pf = Claim {
        device: DeviceId::Pf("0000:19:00.0".parse().unwrap()),
        share: Share::Exclusive,
        pf: None,
    };
    l.claim(&pod("a"), &[gpu.clone(), pf.clone()]).unwrap();
    l.release_pod("a", &Failing).unwrap();
    l.release_pod("a", &NoTeardown).unwrap();
    l.claim(&pod("b"), std::slice::from_ref(&pf)).unwrap();
    let err = l.claim(&pod("c"), std::slice::from_ref(&gpu)).unwrap_err();
    assert!(matches!(err, LedgerError::Quarantined { .. }), "{err}");
}

#[test]
fn release_of_unknown_pod_changes_nothing() {
    let (d, l) = ledger();
    assert_eq!(
        l.release_pod("nope", &NoTeardown).unwrap(),
        Released::default()
    );
    assert!(!d.path().join("ledger.json").exists());
}

/// A release tears down only pods its first read chose, whose devices it
/// locked: a pod of a chosen id claimed while it waited for those locks
/// keeps its claims.
#[test]
fn a_release_leaves_a_pod_claimed_while_it_waited() {
    let (d, l) = ledger();
    l.claim(&pod("a"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap();
    let device = DeviceId::Gpu("GPU-1".to_string());
    let turn = l.lock_device(&device).unwrap();
    let lock_file =
        &super::release_lock::lock_paths(d.path(), std::iter::once(&device)).unwrap()[0];
    let lock = std::fs::metadata(lock_file).unwrap();
    let ids = super::gone(&["a", "x"]);
    std::thread::scope(|s| {
        let released = s.spawn(|| l.release_pods(&ids, &NoTeardown).unwrap());
        // Its first read made: it waits for the device's turn.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !super::tests::lock_waited_for(&lock) {
            assert!(
                std::time::Instant::now() < deadline,
                "never waited for the device's turn"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(!released.is_finished(), "waits for the device's turn");
        l.claim(&pod("x"), &[gpu("GPU-2", Share::Exclusive)])
            .unwrap();
        drop(turn);
        assert_eq!(released.join().unwrap().pods, vec![pod("a")]);
    });
    assert!(!l.holds("a").unwrap());
    assert!(l.holds("x").unwrap(), "not locked, not released");
}

/// A container admitted into a pod while the pod's release tears it down (a
/// pod the runtime reported gone that was not) keeps the pod's claims: the
/// commit drops no pod that holds a container it did not hold when read.
#[test]
fn a_container_admitted_during_the_teardown_keeps_the_pods_claims() {
    let (d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    l.admit(&pod("a"), &claims, "c1", super::tests::record("c1"), false)
        .unwrap();
    struct Joins<'a>(&'a Ledger);
    impl Teardown for Joins<'_> {
        fn teardown(&self, _pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
            let claims = [gpu("GPU-1", Share::Exclusive)];
            self.0
                .admit(&pod("a"), &claims, "c2", super::tests::record("c2"), false)
                .unwrap();
            Ok(())
        }
    }
    let other = Ledger::open(d.path()).unwrap();
    let released = l
        .release_pods(&super::gone(&["a"]), &Joins(&other))
        .unwrap();
    assert!(released.pods.is_empty(), "{released:?}");
    assert_eq!(released.joined.len(), 1);
    let snap = l.snapshot().unwrap();
    assert!(snap.pods["a"].containers.contains_key("c2"));
    let e = l.claim(&pod("b"), &claims).unwrap_err();
    assert!(matches!(e, LedgerError::Held { .. }), "{e}");
}

/// A container admitted and removed again while the teardown ran (a
/// creation that failed after the plugins answered) proved the pod live
/// too: it keeps its claims, though it holds no container it did not hold.
#[test]
fn a_container_in_and_out_during_the_teardown_keeps_the_pods_claims() {
    let (d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    l.admit(&pod("a"), &claims, "c1", super::tests::record("c1"), false)
        .unwrap();
    let gone = l.stale_pods(&HashSet::new()).unwrap();
    assert_eq!(gone.get("a"), Some(&Some(1)));
    struct InAndOut<'a>(&'a Ledger);
    impl Teardown for InAndOut<'_> {
        fn teardown(&self, _pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
            let claims = [gpu("GPU-1", Share::Exclusive)];
            self.0
                .admit(&pod("a"), &claims, "c2", super::tests::record("c2"), false)
                .unwrap();
            self.0.remove_container("a", "c2", &|_| false).unwrap();
            Ok(())
        }
    }
    let other = Ledger::open(d.path()).unwrap();
    let released = l.release_pods(&gone, &InAndOut(&other)).unwrap();
    assert!(released.pods.is_empty(), "{released:?}");
    assert_eq!(released.joined.len(), 1);
    let e = l.claim(&pod("b"), &claims).unwrap_err();
    assert!(matches!(e, LedgerError::Held { .. }), "{e}");
}

/// The same with a teardown that cleaned one device and not the other: the
/// unclean one is quarantined, and the clean one stays the pod's too, since
/// the container admitted meanwhile was given it (as a guarded release keeps
/// a pod that changed).
#[test]
fn a_container_admitted_during_a_failed_teardown_keeps_the_clean_claims() {
    let (d, l) = ledger();
    let claims = [
        gpu("GPU-1", Share::Exclusive),
        gpu("GPU-2", Share::Exclusive),
    ];
    l.admit(&pod("a"), &claims, "c1", super::tests::record("c1"), false)
        .unwrap();
    struct JoinsAndFails<'a>(&'a Ledger, DeviceId);
    impl Teardown for JoinsAndFails<'_> {
        fn teardown(&self, pod_now: &PodRecord) -> Result<(), crate::ledger::Unclean> {
            self.0
                .admit(
                    &pod("a"),
                    &pod_now.claims,
                    "c2",
                    super::tests::record("c2"),
                    false,
                )
                .unwrap();
            Err(crate::ledger::Unclean::of([self.1.clone()], "reset failed"))
        }
    }
    let other = Ledger::open(d.path()).unwrap();
    let td = JoinsAndFails(&other, claims[0].device.clone());
    let released = l.release_pods(&super::gone(&["a"]), &td).unwrap();
    assert_eq!((released.failed.len(), released.joined.len()), (1, 1));
    let snap = l.snapshot().unwrap();
    let held: Vec<&DeviceId> = snap.pods["a"].claims.iter().map(|c| &c.device).collect();
    assert_eq!(held, [&claims[0].device, &claims[1].device]);
    let e = l.claim(&pod("b"), &claims[1..]).unwrap_err();
    assert!(matches!(e, LedgerError::Held { .. }), "{e}");
}

/// A container admitted into a pod while an earlier pod's teardown of the
/// same release ran: that pod is not torn down (its processes are the new
/// container's) and keeps its claims.
#[test]
fn a_pod_a_container_joined_before_its_teardown_is_not_torn_down() {
    let (d, l) = ledger();
    for (id, uuid) in [("a", "GPU-1"), ("b", "GPU-2")] {
        let claims = [gpu(uuid, Share::Exclusive)];
        l.admit(
            &pod(id),
            &claims,
            &format!("{id}1"),
            super::tests::record("c"),
            false,
        )
        .unwrap();
    }
    struct JoinsB<'a>(&'a Ledger, std::sync::Mutex<Vec<String>>);
    impl Teardown for JoinsB<'_> {
        fn teardown(&self, torn: &PodRecord) -> Result<(), crate::ledger::Unclean> {
            let claims = [gpu("GPU-2", Share::Exclusive)];
            self.0
                .admit(&pod("b"), &claims, "b2", super::tests::record("b2"), false)
                .unwrap();
            self.1.lock().unwrap().push(torn.pod.sandbox_id.clone());
            Ok(())
        }
    }
    let other = Ledger::open(d.path()).unwrap();
    let td = JoinsB(&other, Default::default());
    let released = l.release_pods(&super::gone(&["a", "b"]), &td).unwrap();
    assert_eq!(*td.1.lock().unwrap(), ["a"], "b never torn down");
    let ids = |pods: Vec<&PodRef>| {
        pods.into_iter()
            .map(|p| p.sandbox_id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(released.pods.iter().collect()), ["a"]);
    assert_eq!(ids(released.joined.iter().map(|p| &p.pod).collect()), ["b"]);
    let snap = l.snapshot().unwrap();
    assert!(snap.pods["b"].containers.contains_key("b2"));
    assert!(!snap.pods.contains_key("a"));
}

/// A pod whose release failed is retried only while no container was
/// admitted into it since: one that admitted a container (taken for gone,
/// it was not) keeps its claims and is not torn down; its stop releases it.
#[test]
fn a_retry_leaves_a_pod_that_admitted_a_container_since_its_failure() {
    let (_d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    l.admit(&pod("a"), &claims, "c1", super::tests::record("c1"), false)
        .unwrap();
    let failed = l.release_pods(&super::gone(&["a"]), &Failing).unwrap();
    assert_eq!(failed.failed.len(), 1);
    let then = failed.failed[0].admitted;
    assert_eq!(then, 1);
    l.admit(&pod("a"), &claims, "c3", super::tests::record("c3"), false)
        .unwrap();
    struct Counts(std::sync::atomic::AtomicU32);
    impl Teardown for Counts {
        fn teardown(&self, _pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }
    let td = Counts(Default::default());
    let retry = std::collections::HashMap::from([("a".to_string(), Some(then))]);
    let released = l.release_pods(&retry, &td).unwrap();
    assert_eq!(released, Released::default());
    assert_eq!(td.0.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(l.snapshot().unwrap().pods["a"]
        .containers
        .contains_key("c3"));

    // Without a count (the ledger could not tell), or with the pod as it
    // was, the retry releases it.
    for admitted in [None, Some(2)] {
        let (_d, l) = ledger();
        for c in ["c1", "c3"] {
            l.admit(&pod("a"), &claims, c, super::tests::record(c), false)
                .unwrap();
        }
        let retry = std::collections::HashMap::from([("a".to_string(), admitted)]);
        let released = l.release_pods(&retry, &td).unwrap();
        assert_eq!(released.pods.len(), 1, "{admitted:?}");
        assert!(!l.holds("a").unwrap());
    }
}

/// A VF's turn tried without waiting: refused while another holds it (a hook
/// moving the VF, a release), taken once it is free.
#[test]
fn a_vf_turn_is_tried_without_waiting() {
    let (d, l) = ledger();
    let vf: crate::inventory::PciAddr = "0000:19:00.2".parse().unwrap();
    let other = Ledger::open(d.path()).unwrap();
    let held = other.lock_vfs(&[vf]).unwrap();
    assert!(l.try_lock_vfs(&[vf]).unwrap().is_none());
    drop(held);
    let taken = l.try_lock_vfs(&[vf]).unwrap();
    assert!(taken.is_some());
    assert!(
        other.try_lock_vfs(&[vf]).unwrap().is_none(),
        "held by the try"
    );
    drop(taken);

    // Two VFs, the second held: the try takes neither, and leaves the first
    // free (a lock it took on the way is let go).
    let second: crate::inventory::PciAddr = "0000:19:00.3".parse().unwrap();
    let held = other.lock_vfs(&[second]).unwrap();
    assert!(l.try_lock_vfs(&[vf, second]).unwrap().is_none());
    assert!(
        other.try_lock_vfs(&[vf]).unwrap().is_some(),
        "the first let go"
    );
    drop(held);
}

/// A pod a Synchronize took for gone that a container joins before its
/// release reads the ledger (a containerd 1.7 sandbox reported with pid 0
/// whose container kubelet restarts) is live: nothing of it is torn down and
/// its claims stay.
#[test]
fn a_pod_a_container_joins_after_it_was_taken_for_gone_is_kept() {
    struct Counts(std::sync::atomic::AtomicU32);
    impl Teardown for Counts {
        fn teardown(&self, _pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }
    let (_d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    l.admit(&pod("p"), &claims, "c1", super::tests::record("c1"), false)
        .unwrap();
    let gone = l.stale_pods(&HashSet::new()).unwrap();
    assert_eq!(gone, HashMap::from([("p".to_string(), Some(1))]));
    l.admit(&pod("p"), &claims, "c2", super::tests::record("c2"), false)
        .unwrap();
    let td = Counts(Default::default());
    let released = l.release_pods(&gone, &td).unwrap();
    assert_eq!(released, Released::default());
    assert_eq!(td.0.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(l.holds("p").unwrap());
}
