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

/// Each container first recorded in a pod counts once, whether admitted or
/// recorded, again or removed, and every reader holds the writer's count:
/// another process replaying the journal, and the document once folded.
#[test]
fn a_pod_counts_each_container_first_recorded_once_for_every_reader() {
    let (d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    let away = |_: &PodRecord| false;
    l.claim(&pod("p"), &claims).unwrap();
    let count = |l: &Ledger| l.snapshot().unwrap().pods["p"].admitted();
    assert_eq!(count(&l), 0, "claimed ahead of any container");
    l.admit(&pod("p"), &claims, "c1", record("main"), false)
        .unwrap();
    l.admit(&pod("p"), &claims, "c1", record("main"), false)
        .unwrap();
    l.record_container("p", "c2", record("side")).unwrap();
    l.remove_container("p", "c1", &away).unwrap();
    l.remove_container("p", "c2", &away).unwrap();
    assert!(l.snapshot().unwrap().pods["p"].containers.is_empty());
    assert_eq!(count(&l), 2);
    let other = Ledger::open(d.path()).unwrap();
    assert_eq!(count(&other), 2, "replayed from the journal");
    l.fold_journal().unwrap();
    assert_eq!(count(&Ledger::open(d.path()).unwrap()), 2, "the document");
}

/// A record from before the count: its containers and its network owner
/// count, and a container removed keeps them counted.
#[test]
fn a_record_without_the_count_counts_what_it_holds() {
    let (_d, l) = ledger();
    l.claim(&pod("p"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap();
    let mut rec = l.snapshot().unwrap().pods["p"].clone();
    rec.containers.insert("c1".to_string(), record("main"));
    rec.containers.insert("c2".to_string(), record("side"));
    assert_eq!(rec.admitted, 0);
    assert_eq!(rec.admitted(), 2);
    assert!(rec.remove_container("c1"));
    assert!(!rec.remove_container("c1"));
    assert_eq!(rec.admitted(), 2);
    let mut owned = l.snapshot().unwrap().pods["p"].clone();
    owned.network_owner = Some("c1".to_string());
    assert_eq!(owned.admitted(), 1);
}

/// The release of a claim made for containers that never ran: a pod none
/// joined goes; one whose containers came and went keeps its devices, as
/// does one a container joins while its teardown runs.
#[test]
fn only_a_pod_no_container_joined_is_released_unjoined() {
    struct Joins<'a>(&'a Ledger);
    impl Teardown for Joins<'_> {
        fn teardown(&self, _: &PodRecord) -> Result<(), super::Unclean> {
            let claims = [gpu("GPU-2", Share::Exclusive)];
            self.0
                .admit(&pod("q"), &claims, "c9", record("main"), false)
                .unwrap();
            self.0.remove_container("q", "c9", &|_| false).unwrap();
            Ok(())
        }
    }
    let (_d, l) = ledger();
    let away = |_: &PodRecord| false;
    l.claim(&pod("ahead"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap();
    assert!(matches!(
        l.release_pod_unjoined("ahead", 0, &NoTeardown).unwrap(),
        GuardedRelease::Released(_)
    ));

    let claims = [gpu("GPU-3", Share::Exclusive)];
    l.admit(&pod("ran"), &claims, "c1", record("main"), false)
        .unwrap();
    l.remove_container("ran", "c1", &away).unwrap();
    assert_eq!(
        l.release_pod_unjoined("ran", 0, &NoTeardown).unwrap(),
        GuardedRelease::Changed
    );
    assert!(l.holds("ran").unwrap());
    // Its only container was the one that failed: it goes with its claims.
    assert!(matches!(
        l.release_pod_unjoined("ran", 1, &NoTeardown).unwrap(),
        GuardedRelease::Released(_)
    ));

    l.claim(&pod("q"), &[gpu("GPU-2", Share::Exclusive)])
        .unwrap();
    assert_eq!(
        l.release_pod_unjoined("q", 0, &Joins(&l)).unwrap(),
        GuardedRelease::Changed
    );
    assert!(l.holds("q").unwrap(), "a container ran meanwhile");
}

/// A runtime that reuses container ids (podman's `start`) admits an id again
/// while a hook releases its pod, judged gone from the old record: the
/// release keeps the pod, and the old record's removal leaves the new one.
#[test]
fn a_container_admitted_again_under_its_id_keeps_its_pod_and_record() {
    use crate::ledger::{GuardedRelease, Teardown, Unclean};
    struct Readmits<'a>(&'a Ledger, ContainerRecord);
    impl Teardown for Readmits<'_> {
        fn teardown(&self, _: &PodRecord) -> Result<(), Unclean> {
            let claims = [gpu("GPU-1", Share::Exclusive)];
            self.0
                .admit(&pod("p"), &claims, "c1", self.1.clone(), false)
                .unwrap();
            Ok(())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (hook1, hook2) = (
        Ledger::open(dir.path()).unwrap(),
        Ledger::open(dir.path()).unwrap(),
    );
    let claims = [gpu("GPU-1", Share::Exclusive)];
    let old = record("main");
    hook1
        .admit(&pod("p"), &claims, "c1", old.clone(), false)
        .unwrap();
    let new = ContainerRecord {
        applied_unix: old.applied_unix + 60,
        ..old.clone()
    };
    let judged = [("c1".to_string(), old.clone())].into_iter().collect();
    let out = hook1
        .release_pod_if_unchanged("p", &judged, &Readmits(&hook2, new.clone()))
        .unwrap();
    assert_eq!(out, GuardedRelease::Changed);
    // Admitted again before the release began: no teardown runs at all.
    struct Untouched;
    impl Teardown for Untouched {
        fn teardown(&self, _: &PodRecord) -> Result<(), Unclean> {
            panic!("the new container's devices were torn down");
        }
    }
    let out = hook1
        .release_pod_if_unchanged("p", &judged, &Untouched)
        .unwrap();
    assert_eq!(out, GuardedRelease::Changed);
    assert!(!hook1
        .remove_container_if("p", "c1", &old, &|_| false)
        .unwrap());
    let state = hook2.snapshot().unwrap();
    assert_eq!(state.pods["p"].containers["c1"], new);
    assert_eq!(state.pods["p"].claims, claims);
    // The record judged gone, still there, goes.
    assert!(hook1
        .remove_container_if("p", "c1", &new, &|_| false)
        .unwrap());
    assert!(hook1.snapshot().unwrap().pods["p"].containers.is_empty());
}
