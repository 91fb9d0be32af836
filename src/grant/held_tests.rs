//! A pod the API cache lacks whose claim the ledger holds (a container
//! restarted while the API server is out of reach) is let through on the
//! ledger's word; nothing else changes.
use super::*;

#[test]
fn a_pod_holding_its_claim_is_let_through_when_the_api_cannot_answer() {
    let api = FakeApi::start().unwrap();
    api.put_pod(pod("team", "forged", "u-forged", NODE, &[("cpu", "1")]));
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    let config = Arc::new(Config {
        grant_wait_ms: 50,
        ..Config::default()
    });
    let a = alloc(ONE_GPU);
    assert!(found(&checker, "u-forged"));
    let asked = std::cell::Cell::new(0);
    let held = || {
        asked.set(asked.get() + 1);
        true
    };
    checker
        .check_held(&config, id("team", "ghost", "u-ghost"), "main", &a, &held)
        .expect("held: let through, unverified");
    // What the API server knows decides, held or not: a mismatch refuses.
    assert_eq!(asked.get(), 1);
    let e = checker
        .check_held(&config, id("team", "forged", "u-forged"), "main", &a, &held)
        .unwrap_err();
    assert!(
        nri::ErrorChain(&e).to_string().contains("request no gpu"),
        "{e}"
    );
    assert_eq!(asked.get(), 1, "asked only of a pod the cache lacks");
    // Not held: refused, as before.
    let e = checker
        .check_held(&config, id("team", "other", "u-other"), "main", &a, &|| {
            false
        })
        .unwrap_err();
    assert!(e.to_string().contains("u-other"), "{e}");
    drop(checker);
    let c = audit::read_counters(dir.path()).unwrap();
    assert_eq!((c.granted, c.unverified, c.refused), (0, 1, 2), "{c:?}");
}

/// The ledger's word is not kept for the pod: once the watch has the pod,
/// its next container is checked against its requests, and a mismatch is
/// refused although the ledger holds the claim.
#[test]
fn the_ledgers_word_is_not_kept_for_the_pods_next_containers() {
    let api = FakeApi::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    let config = Arc::new(Config {
        grant_wait_ms: 50,
        ..Config::default()
    });
    let a = alloc(ONE_GPU);
    let deadline = Instant::now() + LONG;
    while !checker.cache().is_synced() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    checker
        .check_held(&config, id("team", "late", "u-late"), "main", &a, &|| true)
        .expect("held, not yet listed");
    api.put_pod(pod("team", "late", "u-late", NODE, &[("cpu", "1")]));
    assert!(found(&checker, "u-late"));
    let e = checker
        .check_held(&config, id("team", "late", "u-late"), "side", &a, &|| true)
        .unwrap_err();
    assert!(
        nri::ErrorChain(&e).to_string().contains("request no gpu"),
        "{e}"
    );
}
