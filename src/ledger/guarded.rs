//! Releasing a pod only while its container set is what the caller saw.
//!
//! Hooks-only mode has no long-running process to serialise container events:
//! one hook may decide that a pod is finished (its last container stopped, or
//! every init exited) while another hook admits a new container into it. The
//! decision is taken from a snapshot and the teardown runs outside the lock,
//! so the set is compared again under the lock and the pod is kept when it
//! changed: the new container keeps the claims it was admitted with.

use std::collections::BTreeMap;

use super::unclean::keep_unclean;
use super::{
    drop_pod, lift_restored, prune_empty, ContainerRecord, Ledger, LedgerError, NoTeardown,
    PodRecord, Teardown,
};

/// What [`Ledger::release_pod_if_unchanged`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardedRelease {
    /// The teardown ran and the claims are gone.
    Released(PodRecord),
    /// The container set differed from the expected one; the claims stay.
    Changed,
    /// The teardown failed: the claims stay and the pod's devices are quarantined.
    Failed { pod: PodRecord, reason: String },
    /// No such pod (never claimed, or released by someone else).
    Absent,
    /// Another release holds the turn of one of the pod's devices, and the
    /// caller would not wait for it ([`Ledger::release_pod_unjoined_now`]):
    /// nothing was done.
    Busy,
}

/// Whether a release waits for its devices' turns (`release_lock`).
#[derive(Clone, Copy)]
enum Turns {
    Wait,
    Try,
}

/// The pod's containers are the ones the caller judged, records and all: a
/// runtime that reuses container ids (podman's `start`) may have admitted one
/// again under the id of a container judged gone, with a record of its own.
fn same_containers(pod: &PodRecord, expected: &BTreeMap<String, ContainerRecord>) -> bool {
    pod.containers == *expected
}

impl Ledger {
    /// Whether the ledger still holds the pod `seen` with the very container
    /// records it was judged by ([`Self::release_pod_if_unchanged`]'s test,
    /// read without the lock).
    pub fn unchanged_since(&self, seen: &PodRecord) -> Result<bool, LedgerError> {
        let now = self.snapshot()?;
        let pod = now.pods.get(&seen.pod.sandbox_id);
        Ok(pod.is_some_and(|p| same_containers(p, &seen.containers)))
    }

    /// Releases `sandbox_id` after `teardown` if its containers are exactly
    /// `expected` (their records, not only their ids), both before the
    /// teardown and again under the ledger lock.
    ///
    /// Like [`Ledger::release_pod`], the teardown runs unlocked and the pod
    /// holds its claims until it is done. A failed teardown quarantines the
    /// pod's devices even when the set changed meanwhile: the devices were
    /// found in a state nobody should be handed.
    pub fn release_pod_if_unchanged(
        &self,
        sandbox_id: &str,
        expected: &BTreeMap<String, ContainerRecord>,
        teardown: &dyn Teardown,
    ) -> Result<GuardedRelease, LedgerError> {
        let unchanged = |pod: &PodRecord| same_containers(pod, expected);
        self.release_pod_while(sandbox_id, &unchanged, teardown, Turns::Wait)
    }

    /// Releases `sandbox_id` after `teardown` if it holds no container and
    /// at most `admitted` containers were ever recorded in it
    /// ([`PodRecord::admitted`]), both before the teardown and again under the
    /// ledger lock: a claim made for containers that never ran. A live pod
    /// whose containers came and went (kubelet removes a dead one and starts
    /// the next) is [`GuardedRelease::Changed`] and keeps its devices until
    /// its sandbox stops.
    pub fn release_pod_unjoined(
        &self,
        sandbox_id: &str,
        admitted: u32,
        teardown: &dyn Teardown,
    ) -> Result<GuardedRelease, LedgerError> {
        let unchanged = |pod: &PodRecord| pod.unjoined(admitted);
        self.release_pod_while(sandbox_id, &unchanged, teardown, Turns::Wait)
    }

    /// [`Self::release_pod_unjoined`] with no teardown (a live sandbox none
    /// of whose containers was given the devices), where waiting for the
    /// devices' turns is no option: another pod's teardown may hold a
    /// shared GPU's for seconds, past a runtime's request deadline.
    /// [`GuardedRelease::Busy`] when one is held.
    pub fn release_pod_unjoined_now(
        &self,
        sandbox_id: &str,
        admitted: u32,
    ) -> Result<GuardedRelease, LedgerError> {
        let unchanged = |pod: &PodRecord| pod.unjoined(admitted);
        self.release_pod_while(sandbox_id, &unchanged, &NoTeardown, Turns::Try)
    }

    /// The release of both: `unchanged` is asked of the pod's record before
    /// the teardown and again under the lock.
    fn release_pod_while(
        &self,
        sandbox_id: &str,
        unchanged: &dyn Fn(&PodRecord) -> bool,
        teardown: &dyn Teardown,
        turns: Turns,
    ) -> Result<GuardedRelease, LedgerError> {
        let seen_now = || {
            self.store
                .read_unlocked()
                .map(|mut s| s.pods.remove(sandbox_id))
        };
        let Some(seen) = seen_now()? else {
            return Ok(GuardedRelease::Absent);
        };
        // Held until the commit: see `release_lock`. Read again once held.
        let dir = self.store.dir();
        let _held = match turns {
            Turns::Wait => super::release_lock::lock_claimed(dir, &[seen])?,
            Turns::Try => {
                let devices = seen.claims.iter().map(|c| &c.device);
                match super::release_lock::try_lock_devices(dir, devices)? {
                    Some(held) => held,
                    None => return Ok(GuardedRelease::Busy),
                }
            }
        };
        let Some(seen) = seen_now()? else {
            return Ok(GuardedRelease::Absent);
        };
        if !unchanged(&seen) {
            return Ok(GuardedRelease::Changed);
        }
        let outcome = teardown.teardown(&seen);
        let committed = self.commit_guarded(sandbox_id, &seen, outcome, unchanged);
        // Kept whole: a container joined meanwhile, or the commit failed.
        if !matches!(committed, Ok((_, false))) {
            teardown.kept(&seen);
        }
        committed.map(|(result, _)| result)
    }

    /// The ledger's side of [`Self::release_pod_while`], under the lock;
    /// with whether the pod kept every claim.
    fn commit_guarded(
        &self,
        sandbox_id: &str,
        seen: &PodRecord,
        outcome: Result<(), super::Unclean>,
        unchanged: &dyn Fn(&PodRecord) -> bool,
    ) -> Result<(GuardedRelease, bool), LedgerError> {
        let mut txn = self.store.begin()?;
        let Some(now) = txn.state.pods.get(sandbox_id) else {
            return Ok((GuardedRelease::Absent, false));
        };
        let still = unchanged(now);
        let result = match outcome {
            // The clean devices leave only a pod nobody joined meanwhile: a
            // new container was admitted with all of them.
            Err(unclean) => {
                keep_unclean(&mut txn.state, sandbox_id, &seen.claims, &unclean, still);
                prune_empty(&mut txn.state);
                let failed = GuardedRelease::Failed {
                    pod: seen.clone(),
                    reason: unclean.reason,
                };
                (failed, !still)
            }
            Ok(()) if still => {
                drop_pod(&mut txn.state, sandbox_id);
                // A VF a failed restore quarantined is back once one succeeds.
                lift_restored(&mut txn.state, sandbox_id, &seen.claims);
                prune_empty(&mut txn.state);
                (GuardedRelease::Released(seen.clone()), false)
            }
            Ok(()) => return Ok((GuardedRelease::Changed, true)),
        };
        txn.commit()?;
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::super::tests::pod;
    use super::super::{Claim, ContainerRecord, DeviceId, Share};
    use super::*;

    /// Without waiting: where the turn of one of the pod's devices is held
    /// (the second in name order here), nothing is done and no turn stays
    /// taken; once free, the pod goes.
    #[test]
    fn a_release_that_does_not_wait_takes_no_turn_while_one_is_held() {
        let d = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(d.path()).unwrap();
        let gpu = |n: u8| DeviceId::Gpu(format!("GPU-{n}"));
        let claim = |n| Claim {
            device: gpu(n),
            share: Share::Exclusive,
            pf: None,
        };
        ledger.claim(&pod("a"), &[claim(1), claim(2)]).unwrap();
        let held = ledger.lock_device(&gpu(2)).unwrap();
        let out = ledger.release_pod_unjoined_now("a", 0).unwrap();
        assert_eq!(out, GuardedRelease::Busy);
        assert!(ledger.holds("a").unwrap());
        let first = super::super::release_lock::try_lock_devices(d.path(), [gpu(1)].iter());
        assert!(first.unwrap().is_some(), "the first device's turn is free");
        drop(held);
        let out = ledger.release_pod_unjoined_now("a", 0).unwrap();
        assert!(matches!(out, GuardedRelease::Released(_)), "{out:?}");
        assert!(!ledger.holds("a").unwrap());
    }

    fn claims() -> Vec<Claim> {
        vec![Claim {
            device: DeviceId::Gpu("GPU-1".to_string()),
            share: Share::Exclusive,
            pf: None,
        }]
    }

    fn record() -> ContainerRecord {
        ContainerRecord {
            devices: Vec::new(),
            ..crate::ledger::tests::record("main")
        }
    }

    /// The containers `ids`, each with the record the tests admit them with.
    fn set(ids: &[&str]) -> BTreeMap<String, ContainerRecord> {
        ids.iter().map(|s| (s.to_string(), record())).collect()
    }

    /// A teardown that lets another ledger handle act while it runs, the way
    /// a second hook process would between the snapshot and the commit.
    struct Meanwhile<'a> {
        act: Box<dyn Fn() + 'a>,
        fail: bool,
        seen: RefCell<Vec<String>>,
    }

    impl Teardown for Meanwhile<'_> {
        fn teardown(&self, pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
            self.seen.borrow_mut().push(pod.pod.sandbox_id.clone());
            (self.act)();
            if self.fail {
                return Err("gpu busy".into());
            }
            Ok(())
        }
    }

    fn two_handles() -> (tempfile::TempDir, Ledger, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let a = Ledger::open(dir.path()).unwrap();
        let b = Ledger::open(dir.path()).unwrap();
        (dir, a, b)
    }

    #[test]
    fn a_container_admitted_during_the_teardown_keeps_the_pod() {
        let (_d, hook1, hook2) = two_handles();
        hook1
            .admit(&pod("p"), &claims(), "old", record(), false)
            .unwrap();
        let admit_new = || {
            hook2
                .admit(&pod("p"), &claims(), "new", record(), false)
                .unwrap();
        };
        let teardown = Meanwhile {
            act: Box::new(admit_new),
            fail: false,
            seen: RefCell::default(),
        };
        let out = hook1
            .release_pod_if_unchanged("p", &set(&["old"]), &teardown)
            .unwrap();
        assert_eq!(out, GuardedRelease::Changed);
        assert_eq!(*teardown.seen.borrow(), ["p"]);
        let state = hook2.snapshot().unwrap();
        let held = &state.pods["p"];
        assert_eq!(held.claims, claims());
        assert!(held.containers.contains_key("new"), "{held:?}");
        assert_eq!(state.devices["gpu GPU-1"].holders.len(), 1);
        // A later release with the current set goes through.
        let none = Meanwhile {
            act: Box::new(|| {}),
            fail: false,
            seen: RefCell::default(),
        };
        let out = hook2
            .release_pod_if_unchanged("p", &set(&["new", "old"]), &none)
            .unwrap();
        assert!(matches!(out, GuardedRelease::Released(_)), "{out:?}");
        let state = hook1.snapshot().unwrap();
        assert!(
            state.pods.is_empty() && state.devices.is_empty(),
            "{state:?}"
        );
    }

    #[test]
    fn a_set_that_differs_up_front_skips_the_teardown() {
        let (_d, l, _) = two_handles();
        l.admit(&pod("p"), &claims(), "c1", record(), false)
            .unwrap();
        let teardown = Meanwhile {
            act: Box::new(|| {}),
            fail: false,
            seen: RefCell::default(),
        };
        let out = l
            .release_pod_if_unchanged("p", &set(&[]), &teardown)
            .unwrap();
        assert_eq!(out, GuardedRelease::Changed);
        assert!(teardown.seen.borrow().is_empty());
        let out = l
            .release_pod_if_unchanged("q", &set(&[]), &teardown)
            .unwrap();
        assert_eq!(out, GuardedRelease::Absent);
        assert_eq!(l.snapshot().unwrap().pods.len(), 1);
    }

    #[test]
    fn a_failed_teardown_quarantines_and_keeps_the_claims() {
        let (_d, l, _) = two_handles();
        l.admit(&pod("p"), &claims(), "c1", record(), false)
            .unwrap();
        l.remove_container("p", "c1", &|_| false).unwrap();
        let teardown = Meanwhile {
            act: Box::new(|| {}),
            fail: true,
            seen: RefCell::default(),
        };
        let out = l
            .release_pod_if_unchanged("p", &set(&[]), &teardown)
            .unwrap();
        assert!(
            matches!(&out, GuardedRelease::Failed { reason, .. } if reason == "gpu busy"),
            "{out:?}"
        );
        let state = l.snapshot().unwrap();
        assert_eq!(state.pods["p"].claims, claims());
        let q = state.devices["gpu GPU-1"].quarantine.as_ref().unwrap();
        assert_eq!(q.reason, "gpu busy");
    }

    #[test]
    fn a_release_by_another_hook_meanwhile_waits_and_finds_the_pod_gone() {
        use super::super::tests_release::{Enters, LetsAnotherTry};
        let (_d, hook1, hook2) = two_handles();
        hook1
            .admit(&pod("p"), &claims(), "c1", record(), false)
            .unwrap();
        let (teardown, started, enters) = LetsAnotherTry::new();
        let (out, other) = std::thread::scope(|s| {
            let hook2 = &hook2;
            let other = s.spawn(move || {
                started.recv().unwrap();
                hook2.release_pod("p", &Enters(enters)).unwrap()
            });
            let out = hook1
                .release_pod_if_unchanged("p", &set(&["c1"]), &teardown)
                .unwrap();
            (out, other.join().unwrap())
        });
        assert!(matches!(out, GuardedRelease::Released(_)), "{out:?}");
        assert!(
            other.pods.is_empty() && other.failed.is_empty(),
            "{other:?}"
        );
        assert!(hook1.snapshot().unwrap().pods.is_empty());
    }

    /// Hooks-only mode: a VF whose restore failed is quarantined; the retry
    /// that restores it (the next createRuntime's reaping) returns it.
    #[test]
    fn a_retried_release_returns_a_quarantined_vf() {
        let (_d, l, _) = two_handles();
        let vf = vec![Claim {
            device: DeviceId::Vf("0000:19:00.2".parse().unwrap()),
            share: Share::Exclusive,
            pf: None,
        }];
        l.admit(&pod("p"), &vf, "c1", record(), false).unwrap();
        let attempt = |fail| Meanwhile {
            act: Box::new(|| {}),
            fail,
            seen: RefCell::default(),
        };
        let out = l
            .release_pod_if_unchanged("p", &set(&["c1"]), &attempt(true))
            .unwrap();
        assert!(matches!(out, GuardedRelease::Failed { .. }), "{out:?}");
        let err = l.claim(&pod("q"), &vf).unwrap_err();
        assert!(matches!(
            err,
            LedgerError::Held { .. } | LedgerError::Quarantined { .. }
        ));
        let out = l
            .release_pod_if_unchanged("p", &set(&["c1"]), &attempt(false))
            .unwrap();
        assert!(matches!(out, GuardedRelease::Released(_)), "{out:?}");
        let state = l.snapshot().unwrap();
        assert!(state.devices.is_empty(), "{state:?}");
        l.claim(&pod("q"), &vf).expect("the VF is back in service");
    }
}
