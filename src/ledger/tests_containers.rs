//! A container's record forgotten unless it is its pod's last, decided under
//! the lock (hooks-only poststop of containers stopping together).
use super::tests::{gpu, ledger, pod, record};
use super::*;

#[test]
fn only_the_pods_last_record_is_kept() {
    let (_d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    for c in ["c1", "c2"] {
        l.admit(&pod("p"), &claims, c, record("main"), false)
            .unwrap();
    }
    let containers = |l: &Ledger| -> Vec<String> {
        l.snapshot().unwrap().pods["p"]
            .containers
            .keys()
            .cloned()
            .collect()
    };
    let away = |_: &PodRecord| false;
    // c1 has a sibling: it goes.
    assert_eq!(
        l.remove_container_unless_last("p", "c1", &away).unwrap(),
        Removal::Removed
    );
    assert_eq!(containers(&l), ["c2"]);
    // c2 is now the last: it stays, with the claims.
    assert_eq!(
        l.remove_container_unless_last("p", "c2", &away).unwrap(),
        Removal::Last
    );
    assert_eq!(containers(&l), ["c2"]);
    assert_eq!(l.snapshot().unwrap().pods["p"].claims.len(), 1);
    // A container with no record beside the last one changes nothing.
    assert_eq!(
        l.remove_container_unless_last("p", "c9", &away).unwrap(),
        Removal::Removed
    );
    assert_eq!(containers(&l), ["c2"]);
    // Neither is a pod the ledger does not hold.
    assert_eq!(
        l.remove_container_unless_last("gone", "c2", &away).unwrap(),
        Removal::Removed
    );
    // Without the guard the last record goes, the claims staying.
    l.remove_container("p", "c2", &away).unwrap();
    assert!(containers(&l).is_empty());
    assert_eq!(
        l.remove_container_unless_last("p", "c2", &away).unwrap(),
        Removal::Last,
        "a pod with claims and no container is its release's to end"
    );
}

/// A restore decided on the pod's containers gives the owner's network up
/// unless a container joined since: it keeps it. One that left changes
/// nothing.
#[test]
fn the_network_is_given_up_unless_a_container_joined() {
    let (_d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    l.admit(&pod("p"), &claims, "c1", record("main"), true)
        .unwrap();
    let owner = |l: &Ledger| l.network_owner("p").unwrap();
    assert_eq!(owner(&l).as_deref(), Some("c1"));
    let set = |ids: &[&str]| -> std::collections::BTreeSet<String> {
        ids.iter().map(|id| id.to_string()).collect()
    };
    l.admit(&pod("p"), &claims, "c2", record("side"), false)
        .unwrap();
    assert!(!l
        .give_up_network_unless_joined("p", "c1", &set(&["c1"]))
        .unwrap());
    assert_eq!(owner(&l).as_deref(), Some("c1"), "c2 joined meanwhile");

    // Another container than the owner: nothing to give up.
    let both = set(&["c1", "c2"]);
    assert!(l.give_up_network_unless_joined("p", "c2", &both).unwrap());
    assert_eq!(owner(&l).as_deref(), Some("c1"));
    // c2 left since: the owner's network goes all the same.
    let away = |_: &PodRecord| false;
    l.remove_container("p", "c2", &away).unwrap();
    assert!(l.give_up_network_unless_joined("p", "c1", &both).unwrap());
    assert_eq!(owner(&l), None);
    assert!(!l
        .give_up_network_unless_joined("gone", "c1", &both)
        .unwrap());
}

/// `keep`, asked of the pod as it stands under the lock, keeps the owner's
/// network as a joined container does; a pod gone is told apart.
#[test]
fn the_network_is_kept_where_the_pod_as_it_stands_says_so() {
    let (_d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    l.admit(&pod("p"), &claims, "c1", record("main"), true)
        .unwrap();
    let seen: std::collections::BTreeSet<String> = ["c1".to_string()].into();
    let asked = std::cell::Cell::new(0);
    let runs_beside = |p: &PodRecord| {
        asked.set(asked.get() + 1);
        p.network_owner.as_deref() == Some("c1")
    };
    let kept = l.give_up_network_unless("p", "c1", &seen, &runs_beside);
    assert_eq!(kept.unwrap(), GiveUp::Kept);
    assert_eq!(asked.get(), 1);
    assert_eq!(l.network_owner("p").unwrap().as_deref(), Some("c1"));

    let given = l.give_up_network_unless("p", "c1", &seen, &|_| false);
    assert_eq!(given.unwrap(), GiveUp::Given);
    assert_eq!(l.network_owner("p").unwrap(), None);
    let gone = l.give_up_network_unless("gone", "c1", &seen, &|_| false);
    assert_eq!(gone.unwrap(), GiveUp::PodGone);
}

/// A network given up before a restore that failed is taken back, the
/// owner's record vouching again for its annotation, unless a container
/// took it over meanwhile; a pod gone has none to take.
#[test]
fn a_network_given_up_is_taken_back_unless_taken_over() {
    let (_d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    let mut vouching = record("main");
    vouching.resolved_sha256 = Some("ab".repeat(32));
    l.admit(&pod("p"), &claims, "c1", vouching.clone(), true)
        .unwrap();
    let pods = |l: &Ledger| l.snapshot().unwrap().pods;
    let before = pods(&l)["p"].containers["c1"].clone();
    assert_eq!(before.resolved_sha256, vouching.resolved_sha256);
    l.give_up_network("c1").unwrap();
    assert_eq!(pods(&l)["p"].containers["c1"].resolved_sha256, None);

    assert!(l.take_network_back("p", "c1", &before).unwrap());
    let p = &pods(&l)["p"];
    assert_eq!(p.network_owner.as_deref(), Some("c1"));
    assert_eq!(p.containers["c1"].resolved_sha256, before.resolved_sha256);

    // c2 took the network over once c1 gave it up: c1 takes nothing back.
    l.give_up_network("c1").unwrap();
    l.admit(&pod("p"), &claims, "c2", record("next"), true)
        .unwrap();
    assert!(!l.take_network_back("p", "c1", &before).unwrap());
    let p = &pods(&l)["p"];
    assert_eq!(p.network_owner.as_deref(), Some("c2"));
    assert_eq!(p.containers["c1"].resolved_sha256, None);
    assert!(!l.take_network_back("gone", "c1", &before).unwrap());
}
