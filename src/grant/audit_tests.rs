use super::*;

#[test]
fn counters_survive_into_another_reader_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read_counters(dir.path()).unwrap(), GrantCounters::default());
    let audit = Audit::open(dir.path());
    let d = |outcome| Decision {
        pod: "ns/p",
        uid: "u",
        container: "c",
        devices: "gpu minors [0]",
        outcome,
        reason: "the pod's containers request no gpu",
    };
    audit.record(&d(Outcome::Granted));
    audit.record(&d(Outcome::Refused(RefusalKind::Mismatch)));
    audit.record(&d(Outcome::Refused(RefusalKind::Mismatch)));
    // The flush thread writes them without being asked.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut c = read_counters(dir.path()).unwrap();
    while c.refused < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        c = read_counters(dir.path()).unwrap();
    }
    assert_eq!((c.granted, c.refused), (1, 2));
    assert_eq!(c.refused_by_reason["mismatch"], 2);
    assert_eq!(c.last_refusal.as_ref().unwrap().pod, "ns/p");
    let text = table(&c);
    assert!(
        text.contains("granted 1") && text.contains("mismatch 2"),
        "{text}"
    );
    // A restarted plugin counts on; what it counted is written when it stops.
    drop(audit);
    let restarted = Audit::open(dir.path());
    restarted.record(&d(Outcome::Unchecked));
    drop(restarted);
    let c = read_counters(dir.path()).unwrap();
    assert_eq!((c.granted, c.unchecked, c.refused), (1, 1, 2));
}

#[test]
fn flush_writes_now_and_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let audit = Audit::open(dir.path());
    audit.flush();
    assert!(
        !dir.path().join(COUNTERS_FILE).exists(),
        "nothing counted, nothing written"
    );
    audit.record(&Decision {
        pod: "ns/p",
        uid: "u",
        container: "c",
        devices: "gpu minors [0]",
        outcome: Outcome::Unchecked,
        reason: "grant_check off",
    });
    audit.flush();
    assert_eq!(read_counters(dir.path()).unwrap().unchecked, 1);
}

#[test]
fn a_corrupt_file_is_an_error_for_readers_and_zero_for_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(COUNTERS_FILE), b"{not json").unwrap();
    assert!(read_counters(dir.path()).is_err());
    assert_eq!(Audit::open(dir.path()).counters(), GrantCounters::default());
}

/// A pod's further containers given the decision just logged for it are
/// counted but not logged again at info; another pod, outcome, device set or
/// reason is, and a refusal always is.
#[test]
fn a_decision_is_logged_once_per_pod_and_counted_for_every_container() {
    let dir = tempfile::tempdir().unwrap();
    let audit = Audit::open(dir.path());
    let d = |uid, container, devices, outcome| Decision {
        pod: "ns/p",
        uid,
        container,
        devices,
        outcome,
        reason: "grant_check off",
    };
    let granted = Outcome::Unchecked;
    let refused = Outcome::Refused(RefusalKind::Mismatch);
    let lines: Vec<Line> = [
        d("u1", "a", "gpu minors [0]", granted),
        d("u1", "b", "gpu minors [0]", granted),
        d("u1", "c", "gpu minors [1]", granted),
        d("u2", "a", "gpu minors [1]", granted),
        d("u1", "d", "gpu minors [1]", granted),
        d("u1", "e", "gpu minors [1]", refused),
        d("u1", "e", "gpu minors [1]", refused),
        d("u1", "e", "gpu minors [1]", granted),
    ]
    .iter()
    .map(|x| audit.count(x))
    .collect();
    use Line::{Logged, Repeated};
    assert_eq!(
        lines,
        [Logged, Repeated, Logged, Logged, Logged, Logged, Logged, Logged]
    );
    let c = audit.counters();
    assert_eq!((c.unchecked, c.refused), (6, 2));
}

/// The writer, woken by a decision, leaves the CPU to that decision's
/// container for [`SETTLE`] before it writes; stopping writes at once.
#[test]
fn the_write_a_decision_wakes_comes_after_its_container_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let audit = Audit::open(dir.path());
    // The writer waits for a decision (it found nothing to write at its start).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !audit.shared.lock().waiting {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer never waited"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let decided = std::time::Instant::now();
    audit.record(&Decision {
        pod: "ns/p",
        uid: "u",
        container: "c",
        devices: "gpu minors [0]",
        outcome: Outcome::Granted,
        reason: "",
    });
    let mut c = read_counters(dir.path()).unwrap();
    while c.granted == 0 {
        assert!(std::time::Instant::now() < deadline, "never written");
        std::thread::sleep(Duration::from_millis(2));
        c = read_counters(dir.path()).unwrap();
    }
    assert!(decided.elapsed() >= SETTLE, "{:?}", decided.elapsed());
    // Stopping does not wait out the settling.
    audit.record(&Decision {
        pod: "ns/q",
        uid: "v",
        container: "c",
        devices: "gpu minors [1]",
        outcome: Outcome::Granted,
        reason: "",
    });
    drop(audit);
    assert_eq!(read_counters(dir.path()).unwrap().granted, 2);
}
