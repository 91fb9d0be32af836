use super::*;
use crate::logging::capture::Captured;

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

/// A plugin draining beside its successor writes the same counters file
/// with no lock between them: another writer's temporary file, half
/// written, is neither written into nor renamed into place.
#[test]
fn another_plugins_half_written_counters_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join(format!("{COUNTERS_FILE}.tmp"));
    std::fs::write(&theirs, b"{\"granted\":").unwrap();
    let audit = Audit::open(dir.path());
    audit.record(&decision("u", Outcome::Unchecked));
    audit.flush();
    assert_eq!(read_counters(dir.path()).unwrap().unchecked, 1);
    assert_eq!(std::fs::read(&theirs).unwrap(), b"{\"granted\":");
}

#[test]
fn a_corrupt_file_is_an_error_for_readers_and_zero_for_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(COUNTERS_FILE), b"{not json").unwrap();
    assert!(read_counters(dir.path()).is_err());
    assert_eq!(Audit::open(dir.path()).counters(), GrantCounters::default());
}

/// Every decision is counted and has its line: a container given again the
/// decision just logged for it (kubelet restarting it) too. Lines of
/// let-through decisions wait for the writer; refusals are logged now.
#[test]
fn every_decision_is_logged_and_counted() {
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
        d("u1", "e", "gpu minors [1]", granted),
    ]
    .iter()
    .map(|x| audit.count(x).0)
    .collect();
    // Let-through decisions' lines wait for the writer; refusals' are logged now.
    use Line::{Deferred, Logged};
    assert_eq!(
        lines,
        [Deferred, Deferred, Deferred, Deferred, Deferred, Logged, Logged, Deferred, Deferred]
    );
    let c = audit.counters();
    assert_eq!((c.unchecked, c.refused), (7, 2));
}

/// The writer, woken by a decision, leaves the CPU to that decision's
/// container for [`SETTLE`] before it writes; stopping writes at once.
#[test]
fn the_write_a_decision_wakes_comes_after_its_container_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let audit = Audit::open(dir.path());
    wait_until_waiting(&audit);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
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

/// A refusal is in the counters file (with the counts before it) when its
/// decision returns: `devgate status`, run on the refused container's error,
/// shows it without waiting out the writer's interval.
#[test]
fn a_refusal_is_written_before_its_decision_returns() {
    let dir = tempfile::tempdir().unwrap();
    let audit = Audit::open(dir.path());
    wait_until_waiting(&audit);
    audit.record(&decision("u1", Outcome::Granted));
    audit.record(&decision("u2", Outcome::Refused(RefusalKind::Namespace)));
    let c = read_counters(dir.path()).unwrap();
    assert_eq!((c.granted, c.refused), (1, 1));
    assert_eq!(c.refused_by_reason["namespace"], 1);
    assert_eq!(c.last_refusal.unwrap().pod, "ns/p");
}

/// Until the writer waits for a decision (it found nothing to write at its start).
fn wait_until_waiting(audit: &Audit) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !audit.shared.lock().waiting {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer never waited"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn decision<'a>(uid: &'a str, outcome: Outcome) -> Decision<'a> {
    Decision {
        pod: "ns/p",
        uid,
        container: "main",
        devices: "gpu minors [0]",
        outcome,
        reason: "matches the pod's requests",
    }
}

/// A let-through decision's line is logged by the writer, no sooner than
/// [`SETTLE`] after the decision, with the decision's time; a refusal's at
/// once; stopping logs what is still waiting.
#[test]
fn let_through_lines_are_logged_by_the_writer_with_their_time() {
    let log = Captured::default();
    log.run(|| {
        let dir = tempfile::tempdir().unwrap();
        let audit = Audit::open(dir.path());
        wait_until_waiting(&audit);
        let before = crate::grant::audit_line::Rfc3339(std::time::SystemTime::now()).to_string();
        audit.record(&decision("u2", Outcome::Refused(RefusalKind::Mismatch)));
        assert_eq!(
            log.lines("device grant refused").len(),
            1,
            "a refusal at once"
        );
        let decided = std::time::Instant::now();
        audit.record(&decision("u1", Outcome::Granted));
        let deadline = decided + Duration::from_secs(20);
        let granted = loop {
            let lines = log.lines("uid=u1");
            if !lines.is_empty() {
                break lines;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never logged: {:?}",
                log.lines("")
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        assert!(decided.elapsed() >= SETTLE, "{:?}", decided.elapsed());
        assert_eq!(granted.len(), 1, "{granted:?}");
        for field in [
            "INFO",
            "devgate::audit",
            "device grant",
            "pod=ns/p",
            "container=main",
            "devices=gpu minors [0]",
            "outcome=\"granted\"",
            "reason=matches the pod's requests",
        ] {
            assert!(granted[0].contains(field), "{field} in {}", granted[0]);
        }
        // The decision's own time, not the writer's: same second as taken
        // just before it, barring a second boundary in between.
        let at = granted[0].split("decided=").nth(1).expect("decided field");
        assert!(
            at.len() >= 27 && at[..27] >= before[..],
            "{at} against {before}"
        );
        // Written by the writer of a plugin that stops before its interval.
        audit.record(&decision("u3", Outcome::Unchecked));
        drop(audit);
        assert_eq!(log.lines("uid=u3").len(), 1, "logged at stop");
    });
}

/// With too many lines waiting, a decision's line is logged at once rather
/// than kept.
#[test]
fn a_full_queue_logs_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let audit = Audit::open(dir.path());
    // The writer cannot take the queue while a write is held under way.
    let held = audit.shared.writing.lock().unwrap();
    let uids: Vec<String> = (0..=crate::grant::audit_line::MAX_PENDING)
        .map(|i| format!("u{i}"))
        .collect();
    let counted: Vec<_> = uids
        .iter()
        .map(|u| audit.count(&decision(u, Outcome::Granted)))
        .collect();
    assert!(counted[..counted.len() - 1]
        .iter()
        .all(|c| *c == (Line::Deferred, None)));
    // Logged now, after the lines it takes off the queue.
    let (line, earlier) = counted.last().unwrap();
    assert_eq!(*line, Line::Logged);
    assert_eq!(
        earlier.as_ref().map(Vec::len),
        Some(crate::grant::audit_line::MAX_PENDING)
    );
    assert!(audit.shared.lock().pending.is_empty());
    drop(held);
    drop(audit);
    assert_eq!(
        read_counters(dir.path()).unwrap().granted,
        uids.len() as u64
    );
}

/// A line logged at once comes after the lines of earlier decisions that
/// still wait for the writer: a refusal after the grant made before it. A
/// container given the same grant again (kubelet restarting it) has its
/// line again: every decision is one.
#[test]
fn a_line_logged_at_once_follows_the_waiting_lines_of_earlier_decisions() {
    let log = Captured::default();
    log.run_at(tracing::Level::DEBUG, || {
        let dir = tempfile::tempdir().unwrap();
        let audit = Audit::open(dir.path());
        let uids = || -> Vec<String> {
            log.lines("devgate::audit")
                .iter()
                .map(|l| {
                    l.split("uid=")
                        .nth(1)
                        .unwrap_or("")
                        .chars()
                        .take(2)
                        .collect()
                })
                .collect()
        };
        // The writer cannot log while a write is held under way: the lines
        // below it are logged by the refusal, which then waits to write the
        // counters.
        let held = audit.shared.writing.lock().unwrap();
        audit.record(&decision("u1", Outcome::Granted));
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        std::thread::scope(|s| {
            let refusal = s.spawn(|| {
                tracing::dispatcher::with_default(&dispatch, || {
                    audit.record(&decision("u2", Outcome::Refused(RefusalKind::Mismatch)))
                })
            });
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while uids().len() < 2 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            assert!(
                !refusal.is_finished(),
                "the refusal waits for the write under way"
            );
            audit.record(&decision("u3", Outcome::Granted));
            audit.record(&decision("u3", Outcome::Granted));
            assert_eq!(uids(), ["u1", "u2"], "{:?}", log.lines(""));
            drop(held);
            refusal.join().unwrap();
        });
        assert_eq!(read_counters(dir.path()).unwrap().refused, 1);
        let lines = log.lines("devgate::audit");
        assert!(
            lines[0].contains("INFO") && lines[0].contains("outcome=\"granted\""),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("device grant refused"), "{}", lines[1]);
        drop(audit);
        assert_eq!(uids(), ["u1", "u2", "u3", "u3"], "nothing logged twice");
        let lines = log.lines("devgate::audit");
        assert!(lines[3].contains("INFO") && lines[3].contains("outcome=\"granted\""));
    });
}
