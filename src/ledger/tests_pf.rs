//! A PF used whole and the VFs of that PF: never held by two pods at once.
use super::tests::{ledger, pod};
use super::*;

const PF: &str = "0000:19:00.0";

fn pf(share: Share) -> Claim {
    Claim {
        device: DeviceId::Pf(PF.parse().unwrap()),
        share,
        pf: None,
    }
}

fn vf(bus: &str, of: &str) -> Claim {
    Claim {
        device: DeviceId::Vf(bus.parse().unwrap()),
        share: Share::Exclusive,
        pf: Some(of.parse().unwrap()),
    }
}

fn half() -> Share {
    Share::Shared {
        core: 50,
        memory_ratio: 50,
    }
}

#[test]
fn a_vf_is_refused_while_another_pod_holds_its_pf_whole() {
    let (_d, l) = ledger();
    l.claim(&pod("a"), &[pf(Share::Exclusive)]).unwrap();
    let err = l.claim(&pod("b"), &[vf("0000:19:00.2", PF)]).unwrap_err();
    assert!(
        matches!(
            &err,
            LedgerError::HeldWithPf {
                device: DeviceId::Vf(_),
                other: DeviceId::Pf(_),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "vf 0000:19:00.2 conflicts with pf 0000:19:00.0, held by pod ns/pod-a: a pf used whole excludes its vfs from other pods"
    );
    // A VF of another PF is free, and the refused pod holds nothing.
    l.claim(&pod("b"), &[vf("0000:1a:00.2", "0000:1a:00.0")])
        .unwrap();
    assert_eq!(l.snapshot().unwrap().pods["b"].claims.len(), 1);
    l.release_pod("a", &NoTeardown).unwrap();
    l.claim(&pod("c"), &[vf("0000:19:00.2", PF)]).unwrap();
}

#[test]
fn a_pf_is_refused_whole_while_another_pod_holds_one_of_its_vfs() {
    let (_d, l) = ledger();
    l.claim(&pod("a"), &[vf("0000:19:00.3", PF)]).unwrap();
    let err = l.claim(&pod("b"), &[pf(Share::Exclusive)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pf 0000:19:00.0 conflicts with vf 0000:19:00.3, held by pod ns/pod-a: a pf used whole excludes its vfs from other pods"
    );
    assert!(!l.snapshot().unwrap().pods.contains_key("b"));
    // A share of the PF and the VF add up in the scheduler's count only.
    l.claim(&pod("b"), &[pf(half())]).unwrap();
    l.release_pod("a", &NoTeardown).unwrap();
    l.release_pod("b", &NoTeardown).unwrap();
    l.claim(&pod("d"), &[pf(Share::Exclusive)]).unwrap();
}

/// A record written before claims named their PF has none: it is not
/// checked against the PF, and the ledger still reads it.
#[test]
fn claims_recorded_without_their_pf_still_read() {
    let (_d, l) = ledger();
    let mut old = vf("0000:19:00.4", PF);
    old.pf = None;
    l.claim(&pod("a"), std::slice::from_ref(&old)).unwrap();
    let json = serde_json::to_string(&l.snapshot().unwrap()).unwrap();
    assert!(!json.contains("\"pf\""), "{json}");
    l.claim(&pod("b"), &[pf(Share::Exclusive)]).unwrap();
}

/// What a refused claim may wait for: the pods being released whose leaving
/// lets it in, across the PF-and-VF rule both ways; the lasting refusal where
/// a live pod or a quarantine refuses it anyway.
#[test]
fn waits_for_names_the_releases_that_let_a_claim_in() {
    let (_d, l) = ledger();
    l.claim(&pod("vfs"), &[vf("0000:19:00.2", PF)]).unwrap();
    l.claim(&pod("whole"), &[pf(Share::Exclusive)]).unwrap_err();
    let other_pf = "0000:1a:00.0";
    l.claim(
        &pod("pf"),
        &[Claim {
            device: DeviceId::Pf(other_pf.parse().unwrap()),
            share: Share::Exclusive,
            pf: None,
        }],
    )
    .unwrap();
    let releasing = |names: &'static [&'static str]| move |id: &str| names.contains(&id);
    let whole = [pf(Share::Exclusive)];
    let waits =
        |claims: &[Claim], names| l.waits_for(&pod("new"), claims, &releasing(names)).unwrap();
    assert_eq!(waits(&whole, &["vfs"]).unwrap(), ["vfs"]);
    assert!(
        matches!(waits(&whole, &["pf"]), Err(LedgerError::HeldWithPf { .. })),
        "the vf's holder is live"
    );
    let under_pf = [vf("0000:1a:00.2", other_pf)];
    assert_eq!(waits(&under_pf, &["pf", "vfs"]).unwrap(), ["pf"]);
    let free = [vf("0000:1b:00.2", "0000:1b:00.0")];
    assert!(waits(&free, &[]).unwrap().is_empty(), "fits now");
    l.quarantine(&free[0].device, "restore failed").unwrap();
    assert!(
        matches!(
            waits(&free, &["vfs", "pf"]),
            Err(LedgerError::Quarantined { .. })
        ),
        "quarantined"
    );
}
