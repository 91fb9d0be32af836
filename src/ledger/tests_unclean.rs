//! A failed teardown that names its devices: they stay the pod's,
//! quarantined; the pod's other devices go back to service.
use std::collections::BTreeSet;

use super::tests::{gpu, ledger, pod};
use super::*;

const VF: &str = "0000:19:00.2";

fn vf() -> Claim {
    Claim {
        device: DeviceId::Vf(VF.parse().unwrap()),
        share: Share::Exclusive,
        pf: Some("0000:19:00.0".parse().unwrap()),
    }
}

/// Fails for the devices given, the same way every time it runs.
struct FailsFor(Vec<DeviceId>);

impl Teardown for FailsFor {
    fn teardown(&self, _pod: &PodRecord) -> Result<(), Unclean> {
        if self.0.is_empty() {
            return Ok(());
        }
        Err(Unclean::of(self.0.clone(), "gpu GPU-2 fell off the bus"))
    }
}

fn gpu2() -> DeviceId {
    DeviceId::Gpu("GPU-2".into())
}

fn pod_of_three_claims() -> Vec<Claim> {
    vec![
        gpu("GPU-1", Share::Exclusive),
        gpu("GPU-2", Share::Exclusive),
        vf(),
    ]
}

fn pod_of_three(l: &Ledger) -> Vec<Claim> {
    let claims = pod_of_three_claims();
    l.claim(&pod("a"), &claims).unwrap();
    claims
}

#[test]
fn a_release_keeps_only_the_devices_its_teardown_could_not_clean() {
    let (_d, l) = ledger();
    pod_of_three(&l);
    let out = l.release_pod("a", &FailsFor(vec![gpu2()])).unwrap();
    assert_eq!(out.pods, vec![]);
    assert_eq!(out.failed.len(), 1);
    assert_eq!(out.failed[0].reason, "gpu GPU-2 fell off the bus");
    let state = l.snapshot().unwrap();
    assert_eq!(state.pods["a"].claims, [gpu("GPU-2", Share::Exclusive)]);
    let kept = &state.devices["gpu GPU-2"];
    assert_eq!(kept.holders.len(), 1);
    assert!(kept.quarantine.is_some());
    let held: BTreeSet<&String> = state.devices.keys().collect();
    assert_eq!(held, BTreeSet::from([&"gpu GPU-2".to_string()]));
    // The others are another pod's to take; the kept one is not.
    l.claim(&pod("b"), &[gpu("GPU-1", Share::Exclusive), vf()])
        .unwrap();
    let refused = l.claim(&pod("c"), &[gpu("GPU-2", Share::Exclusive)]);
    assert!(refused.is_err(), "{refused:?}");
    // A container of the pod asking for all three (hooks-only mode, a
    // restart in the same sandbox) is told why it waits.
    let again = l.claim(&pod("a"), &pod_of_three_claims()).unwrap_err();
    assert!(
        matches!(again, LedgerError::ReleaseFailed { .. }),
        "{again}"
    );
    assert!(
        again
            .to_string()
            .contains("holds only [\"gpu GPU-2\"] (quarantined: gpu GPU-2 fell off the bus)"),
        "{again}"
    );
    // The retry tears down what was kept, and ends the pod.
    let out = l.release_pod("a", &FailsFor(vec![])).unwrap();
    assert_eq!(out.pods, vec![pod("a")]);
    let state = l.snapshot().unwrap();
    assert!(!state.pods.contains_key("a"));
    // A GPU leaves quarantine through the GPU retry, which cleans it first.
    assert!(state.devices["gpu GPU-2"].quarantine.is_some());
    assert!(state.devices["gpu GPU-2"].holders.is_empty());
}

#[test]
fn a_failure_that_cannot_tell_its_devices_keeps_them_all() {
    for teardown in [
        Unclean::all("netns gone"),
        // Names no device of the pod.
        Unclean::of([DeviceId::Gpu("GPU-9".into())], "gpu GPU-9 gone"),
    ] {
        struct Once(Unclean);
        impl Teardown for Once {
            fn teardown(&self, _pod: &PodRecord) -> Result<(), Unclean> {
                Err(self.0.clone())
            }
        }
        // A ledger of its own: nothing quarantined before.
        let (_d, l) = ledger();
        let claims = pod_of_three(&l);
        let out = l.release_pod("a", &Once(teardown)).unwrap();
        assert_eq!(out.failed.len(), 1);
        let state = l.snapshot().unwrap();
        assert_eq!(state.pods["a"].claims, claims);
        assert_eq!(state.devices.len(), 3);
        assert!(state.devices.values().all(|d| d.quarantine.is_some()));
    }
}

/// Hooks-only mode's guarded release: the clean devices leave a pod whose
/// containers are as seen; a pod a new container joined keeps them all.
#[test]
fn a_guarded_release_frees_the_clean_devices_of_an_unchanged_pod() {
    let (_d, l) = ledger();
    pod_of_three(&l);
    let out = l
        .release_pod_if_unchanged("a", &Default::default(), &FailsFor(vec![gpu2()]))
        .unwrap();
    assert!(matches!(out, GuardedRelease::Failed { .. }), "{out:?}");
    let state = l.snapshot().unwrap();
    assert_eq!(state.pods["a"].claims, [gpu("GPU-2", Share::Exclusive)]);
    assert_eq!(state.devices.len(), 1);

    // A container admitted while the teardown ran: the pod keeps every
    // device it was admitted with; the failing one is quarantined.
    let (_d, l) = ledger();
    let claims = pod_of_three(&l);
    struct JoinsThenFails<'a>(&'a Ledger, &'a [Claim]);
    impl Teardown for JoinsThenFails<'_> {
        fn teardown(&self, _pod: &PodRecord) -> Result<(), Unclean> {
            let record = super::tests::record("new");
            self.0
                .admit(&pod("a"), self.1, "new", record, false)
                .unwrap();
            Err(Unclean::of([gpu2()], "gpu GPU-2 fell off the bus"))
        }
    }
    let out = l
        .release_pod_if_unchanged("a", &Default::default(), &JoinsThenFails(&l, &claims))
        .unwrap();
    assert!(matches!(out, GuardedRelease::Failed { .. }), "{out:?}");
    let state = l.snapshot().unwrap();
    assert_eq!(state.pods["a"].claims, claims);
    assert!(state.devices["gpu GPU-2"].quarantine.is_some());
    assert!(state.devices["gpu GPU-1"].quarantine.is_none());
}
