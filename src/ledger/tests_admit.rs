//! Admission of containers: claims with the record of what each got, and the
//! pod's one network owner.
use super::tests::{gpu, ledger, pod, record};
use super::*;

#[test]
fn admit_picks_one_network_owner_until_it_is_removed() {
    let (_d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    let a = l
        .admit(&pod("p"), &claims, "c1", record("init"), true)
        .unwrap();
    assert!(a.network_owner);
    assert!(a.claimed, "the first container claims the pod's devices");
    let b = l
        .admit(&pod("p"), &claims, "c2", record("main"), true)
        .unwrap();
    assert!(!b.network_owner, "the pod netns already has its VFs");
    assert!(!b.claimed, "the pod holds them already");
    // Re-creation of the owner (same id) stays owner.
    assert!(
        l.admit(&pod("p"), &claims, "c1", record("init"), true)
            .unwrap()
            .network_owner
    );
    l.remove_container("p", "c1", &|_| false).unwrap();
    let c = l
        .admit(&pod("p"), &claims, "c3", record("main"), true)
        .unwrap();
    assert!(c.network_owner);
    let snap = l.snapshot().unwrap();
    assert_eq!(snap.pods["p"].network_owner.as_deref(), Some("c3"));
    assert_eq!(snap.pods["p"].containers.len(), 2);
}

/// The owner's poststop gave the VFs back: the container restarted in its
/// place (a new id, the exited one still recorded) owns the network again.
#[test]
fn an_owner_that_gave_up_the_network_is_followed_by_the_next_container() {
    let (_d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    let owned = ContainerRecord {
        resolved: Some("{}".into()),
        resolved_sha256: None,
        ..record("main")
    };
    l.admit(&pod("p"), &claims, "c1", owned.clone(), true)
        .unwrap();
    l.give_up_network("nobody").unwrap();
    assert_eq!(
        l.snapshot().unwrap().pods["p"].network_owner.as_deref(),
        Some("c1")
    );
    l.give_up_network("c1").unwrap();
    let snap = l.snapshot().unwrap();
    assert_eq!(snap.pods["p"].network_owner, None);
    assert!(
        !snap.container("c1").unwrap().vouches_for("{}"),
        "no longer vouched"
    );
    let restarted = l.admit(&pod("p"), &claims, "c2", owned, true).unwrap();
    assert!(restarted.network_owner);
}

#[test]
fn admit_without_claims_records_nothing() {
    let (d, l) = ledger();
    let a = l
        .admit(&pod("p"), &[], "c1", record("main"), false)
        .unwrap();
    assert!(!a.network_owner);
    assert!(!d.path().join("ledger.json").exists());
}

#[test]
fn admit_conflict_claims_nothing_and_records_nothing() {
    let (_d, l) = ledger();
    l.claim(&pod("a"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap();
    let err = l
        .admit(
            &pod("b"),
            &[gpu("GPU-1", Share::Exclusive)],
            "c1",
            record("main"),
            true,
        )
        .unwrap_err();
    assert!(matches!(err, LedgerError::Held { .. }));
    assert!(!l.snapshot().unwrap().pods.contains_key("b"));
}

/// Removing a container devgate never admitted is answered from the cached
/// document, without waiting for the lock another process holds; a known one
/// still goes through a transaction.
#[test]
fn unknown_containers_are_forgotten_without_the_lock() {
    let (dir, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    l.admit(&pod("p"), &claims, "c1", record("main"), false)
        .unwrap();
    let held = crate::fsutil::lock_exclusive(&dir.path().join("ledger.lock")).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let l = l.clone();
        std::thread::spawn(move || {
            l.remove_container("p", "not-ours", &|_| false).unwrap();
            l.remove_container("other-pod", "c1", &|_| false).unwrap();
            tx.send(()).unwrap();
            l.remove_container("p", "c1", &|_| false).unwrap();
        })
    };
    // A liveness bound, not a measurement: the lock is held until answered.
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("unknown containers answered while the lock was held");
    drop(held);
    worker.join().unwrap();
    assert!(l.snapshot().unwrap().pods["p"].containers.is_empty());
}

/// A claim list naming a device twice is refused whole: counted twice, two
/// 60 % shares would pass as one, and an exclusive device would get two
/// holders. Nothing is recorded.
#[test]
fn a_device_claimed_twice_in_one_list_is_refused() {
    let (_d, l) = ledger();
    let half = Share::Shared {
        core: 60,
        memory_ratio: 60,
    };
    for claims in [
        vec![gpu("GPU-1", half), gpu("GPU-1", half)],
        vec![
            gpu("GPU-2", Share::Exclusive),
            gpu("GPU-2", Share::Exclusive),
        ],
    ] {
        let e = l.claim(&pod("p"), &claims).unwrap_err();
        assert!(matches!(e, LedgerError::DuplicateClaim { .. }), "{e}");
        assert!(
            e.to_string().ends_with("is claimed twice by one pod"),
            "{e}"
        );
    }
    let snap = l.snapshot().unwrap();
    assert!(snap.pods.is_empty() && snap.devices.is_empty(), "{snap:?}");
}

/// Both ways of finding a device named twice (pairwise for short lists,
/// hashed for long ones) refuse it, wherever it stands in the list, also for
/// a pod that holds its claims already; a list without one is taken whole.
#[test]
fn a_device_named_twice_is_found_in_short_and_long_lists() {
    let (_d, l) = ledger();
    for n in [2, 32, 33, 200] {
        let mut claims: Vec<Claim> = (0..n)
            .map(|i| gpu(&format!("GPU-{n}-{i}"), Share::Exclusive))
            .collect();
        claims.push(claims[n / 2].clone());
        let e = l.claim(&pod(&format!("p{n}")), &claims).unwrap_err();
        assert!(matches!(e, LedgerError::DuplicateClaim { .. }), "{n}: {e}");
        assert!(e.to_string().contains(&format!("GPU-{n}-{}", n / 2)), "{e}");
        claims.pop();
        assert!(l.claim(&pod(&format!("p{n}")), &claims).unwrap(), "{n}");
        claims.push(claims[0].clone());
        let e = l.claim(&pod(&format!("p{n}")), &claims).unwrap_err();
        assert!(matches!(e, LedgerError::DuplicateClaim { .. }), "{n}: {e}");
    }
    assert_eq!(l.snapshot().unwrap().devices.len(), 2 + 32 + 33 + 200);
}

/// A pod's further claim of its own devices in another order changes
/// nothing; one more or one fewer device is a mismatch.
#[test]
fn a_pods_own_claims_in_another_order_are_the_same() {
    let (_d, l) = ledger();
    let claims = [
        gpu("GPU-1", Share::Exclusive),
        gpu("GPU-2", Share::Exclusive),
        gpu("GPU-3", Share::Exclusive),
    ];
    assert!(l.claim(&pod("p"), &claims).unwrap());
    let before = l.snapshot().unwrap();
    let reordered = [claims[2].clone(), claims[0].clone(), claims[1].clone()];
    assert!(!l.claim(&pod("p"), &reordered).unwrap());
    assert!(!l.claim(&pod("p"), &claims).unwrap());
    assert_eq!(l.snapshot().unwrap(), before);
    let more = [&claims[..], &[gpu("GPU-4", Share::Exclusive)]].concat();
    for other in [&claims[..2], &more] {
        let e = l.claim(&pod("p"), other).unwrap_err();
        assert!(matches!(e, LedgerError::ClaimMismatch { .. }), "{e}");
    }
    assert_eq!(l.snapshot().unwrap(), before);
}

/// A container planned with the VFs in the pod, moved there by its owner,
/// whose owner gave them back before the admission: refused, nothing
/// recorded, so the next try plans again and moves them in itself.
#[test]
fn a_container_relying_on_a_network_given_back_meanwhile_is_refused() {
    let (_d, l) = ledger();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    let owned = ContainerRecord {
        resolved: Some("{}".into()),
        resolved_sha256: None,
        ..record("main")
    };
    l.admit(&pod("p"), &claims, "c1", owned, true).unwrap();
    let in_pod = |id: &str| {
        l.admit_or_take_over(
            &pod("p"),
            &claims,
            id,
            record("side"),
            NetworkNeed::InPod,
            &|_| false,
        )
    };
    let a = in_pod("c2").unwrap();
    assert!(!a.network_owner);
    l.give_up_network("c1").unwrap();
    let before = l.snapshot().unwrap();
    let e = in_pod("c3").unwrap_err();
    assert!(matches!(e, LedgerError::NetworkReturned { .. }), "{e}");
    assert!(e.to_string().contains("gave its vfs back"), "{e}");
    assert_eq!(l.snapshot().unwrap(), before, "nothing recorded");
}

/// Once the ledger has a document, a pod's claim is one line of the journal:
/// the document stays as it was, and another process's ledger sees the claim
/// (its devices held, a conflicting claim refused) through the journal, also
/// after the claiming handle is gone, as after a crash.
#[test]
fn a_claim_is_a_journal_line_that_every_reader_honours() {
    let (d, l) = ledger();
    let (a, b) = (
        gpu("GPU-1", Share::Exclusive),
        gpu("GPU-2", Share::Exclusive),
    );
    l.admit(&pod("p"), &[a], "c1", record("main"), false)
        .unwrap();
    let document = std::fs::read(d.path().join("ledger.json")).unwrap();
    let admitted = l
        .admit(
            &pod("q"),
            std::slice::from_ref(&b),
            "c2",
            record("main"),
            false,
        )
        .unwrap();
    assert!(admitted.claimed);
    assert_eq!(
        std::fs::read(d.path().join("ledger.json")).unwrap(),
        document
    );
    let journal = std::fs::read_to_string(d.path().join("ledger.journal")).unwrap();
    assert!(
        journal.starts_with("{\"set\":") && journal.ends_with('\n'),
        "{journal}"
    );
    drop(l);

    let other = Ledger::open(d.path()).unwrap();
    let snap = other.snapshot().unwrap();
    assert_eq!(snap.devices["gpu GPU-2"].holders[0].sandbox_id, "q");
    assert!(snap.container("c2").is_some());
    let err = other
        .admit(&pod("r"), &[b], "c3", record("main"), false)
        .unwrap_err();
    assert!(matches!(err, LedgerError::Held { .. }), "{err}");
    // A release writes the whole document, the claim folded in.
    other.release_pod("p", &NoTeardown).unwrap();
    let folded: LedgerState =
        serde_json::from_slice(&std::fs::read(d.path().join("ledger.json")).unwrap()).unwrap();
    assert!(folded.pods.contains_key("q") && !folded.pods.contains_key("p"));
    assert_eq!(
        std::fs::metadata(d.path().join("ledger.journal"))
            .unwrap()
            .len(),
        0
    );
}

/// The state's claims agree with its device records: every pod holds each of
/// its devices, no exclusive device has two holders, and no holder is a pod
/// the state lacks.
fn assert_consistent(s: &LedgerState) {
    for (key, rec) in &s.devices {
        let exclusive = rec.holders.iter().any(|h| h.share == Share::Exclusive);
        assert!(
            !exclusive || rec.holders.len() == 1,
            "{key}: {:?}",
            rec.holders
        );
        for h in &rec.holders {
            assert!(
                s.pods.contains_key(&h.sandbox_id),
                "{key}: {h:?} has no pod"
            );
        }
    }
    for (id, pod) in &s.pods {
        for c in &pod.claims {
            let rec = &s.devices[&c.device.to_string()];
            assert!(
                rec.holders.iter().any(|h| &h.sandbox_id == id),
                "{id}: {}",
                c.device
            );
        }
    }
}

/// Claims appended as journal lines by several handles (as the plugin and
/// hooks are several processes), releases replacing the document in between,
/// and readers without the lock: no exclusive GPU ever has two holders, every
/// claim a handle was granted is seen by the others until its release, and
/// every copy a reader takes is consistent.
#[test]
fn concurrent_claims_as_lines_and_releases_never_double_hold() {
    let dir = tempfile::tempdir().unwrap();
    Ledger::open(dir.path())
        .unwrap()
        .claim(&pod("seed"), &[gpu("GPU-seed", Share::Exclusive)])
        .unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..4u32)
            .map(|t| {
                let dir = dir.path();
                s.spawn(move || {
                    let l = Ledger::open(dir).unwrap();
                    let mut granted = 0;
                    for n in 0..40u32 {
                        let id = format!("t{t}-{n}");
                        let want = [gpu(
                            &format!("GPU-{}", (t * 7 + n * 3) % 5),
                            Share::Exclusive,
                        )];
                        match l.admit(&pod(&id), &want, &format!("c-{id}"), record("main"), false) {
                            Ok(a) => {
                                assert!(a.claimed);
                                granted += 1;
                                let seen = Ledger::read(dir).unwrap();
                                assert!(seen.pods.contains_key(&id), "{id} granted but not seen");
                                if n % 2 == 0 {
                                    l.release_pod(&id, &NoTeardown).unwrap();
                                }
                            }
                            Err(LedgerError::Held { .. }) => {}
                            Err(e) => panic!("{id}: {e}"),
                        }
                    }
                    granted
                })
            })
            .collect();
        let reader = s.spawn(|| {
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                assert_consistent(&Ledger::read(dir.path()).unwrap());
                reads += 1;
            }
            reads
        });
        let granted: u32 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(reader.join().unwrap() > 0);
        assert!(granted > 0);
    });
    let end = Ledger::read(dir.path()).unwrap();
    assert_consistent(&end);
    // The pods kept (odd rounds) hold at most one GPU each of the five.
    assert!(end.pods.len() <= 6, "{:?}", end.pods.keys());
}

/// A cache that may be stale only decides whether to take the lock: a
/// container it still shows but another process removed is found gone under
/// the lock (nothing is written), and one it lacks but another process
/// recorded is removed all the same.
#[test]
fn a_removal_checks_under_the_lock_what_a_stale_cache_shows() {
    let (dir, l) = ledger();
    let other = Ledger::open(dir.path()).unwrap();
    let claims = [gpu("GPU-1", Share::Exclusive)];
    l.admit(&pod("p"), &claims, "c1", record("main"), false)
        .unwrap();
    other.remove_container("p", "c1", &|_| false).unwrap();
    let journal = || std::fs::metadata(dir.path().join("ledger.journal")).map(|m| m.len());
    let before = journal().unwrap();
    l.remove_container("p", "c1", &|_| false).unwrap();
    assert_eq!(journal().unwrap(), before, "nothing left to write");
    assert!(l.snapshot().unwrap().pods["p"].containers.is_empty());

    other
        .admit(&pod("p"), &claims, "c2", record("main"), false)
        .unwrap();
    l.remove_container("p", "c2", &|_| false).unwrap();
    assert!(other.snapshot().unwrap().pods["p"].containers.is_empty());
}
