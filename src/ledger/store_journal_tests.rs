//! The journal as the store writes and reads it.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::*;
use crate::ledger::journal::{COMPACT_AT, JOURNAL_FILE};
use crate::ledger::tests::record;
use crate::ledger::{Ledger, PodRecord, PodRef};

/// A store whose document holds pod `s` with no container.
pub(super) fn store_with_pod(dir: &Path) -> Store {
    let store = Store::open(dir).unwrap();
    let mut txn = store.begin().unwrap();
    let pod = PodRecord {
        pod: PodRef {
            sandbox_id: "s".to_string(),
            ..PodRef::default()
        },
        claims: Vec::new(),
        claimed_unix: 1,
        containers: Default::default(),
        network_owner: None,
        admitted: 0,
    };
    txn.state.pods.insert("s".to_string(), pod);
    txn.commit().unwrap();
    store
}

/// Admits container `c` to pod `s` as the plugin does: a journal line.
pub(super) fn add(store: &Store, c: &str) {
    try_add(store, c).unwrap();
}

fn try_add(store: &Store, c: &str) -> Result<(), LedgerError> {
    let mut txn = store.begin()?;
    let pod = txn.state.pods.get_mut("s").unwrap();
    pod.containers.insert(c.to_string(), record(c));
    txn.commit_pod("s", &[c])
}

fn containers(state: &LedgerState) -> Vec<String> {
    state.pods["s"].containers.keys().cloned().collect()
}

fn ino(dir: &Path, name: &str) -> u64 {
    fs::metadata(dir.join(name)).unwrap().ino()
}

fn journal_len(dir: &Path) -> u64 {
    fs::metadata(dir.join(JOURNAL_FILE)).map_or(0, |m| m.len())
}

#[test]
fn a_pod_change_is_appended_and_every_reader_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let ours = store_with_pod(dir.path());
    let doc = ino(dir.path(), LEDGER_FILE);
    add(&ours, "a");
    assert_eq!(ino(dir.path(), LEDGER_FILE), doc, "the document stays");
    let text = fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    let theirs = Store::open(dir.path()).unwrap();
    assert_eq!(containers(&theirs.read_unlocked().unwrap()), ["a"]);
    assert_eq!(containers(&Ledger::read(dir.path()).unwrap()), ["a"]);
    // Another process appends behind our cache: the journal's length tells.
    let mut txn = theirs.begin().unwrap();
    txn.state.pods.get_mut("s").unwrap().containers.remove("a");
    txn.commit_pod("s", &["a"]).unwrap();
    assert!(containers(&ours.read_unlocked().unwrap()).is_empty());
    add(&ours, "b");
    assert_eq!(containers(&theirs.begin().unwrap().state), ["b"]);
}

#[test]
fn a_whole_write_folds_the_journal_in_and_empties_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_pod(dir.path());
    add(&store, "a");
    let generation = store.read_unlocked().unwrap().generation;
    store.begin().unwrap().commit().unwrap();
    assert_eq!(journal_len(dir.path()), 0);
    let text = fs::read_to_string(dir.path().join(LEDGER_FILE)).unwrap();
    assert!(text.contains("\"a\":"), "{text}");
    let other = Ledger::read(dir.path()).unwrap();
    assert_eq!(
        (other.generation, containers(&other)),
        (generation + 1, vec!["a".to_string()])
    );
}

/// A crash between the replace and the emptying leaves lines of the old
/// generation: the document holds them already, and a removal since must stay.
#[test]
fn lines_of_an_older_generation_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_pod(dir.path());
    add(&store, "a");
    let stale = fs::read(dir.path().join(JOURNAL_FILE)).unwrap();
    let mut txn = store.begin().unwrap();
    txn.state.pods.get_mut("s").unwrap().containers.clear();
    txn.commit().unwrap();
    fs::write(dir.path().join(JOURNAL_FILE), &stale).unwrap();
    assert!(containers(&Ledger::read(dir.path()).unwrap()).is_empty());
    assert!(containers(&store.begin().unwrap().state).is_empty());
    add(&store, "b");
    assert_eq!(containers(&Ledger::read(dir.path()).unwrap()), ["b"]);
}

/// A writer killed inside its `write` leaves part of a line: no reader takes
/// it, and the next writer cuts it off before its own line. The cut puts a
/// file of the complete lines in the journal's place: a reader that has the
/// old one open reads it as it was, never the cut line's start joined to the
/// end of the line appended after the cut.
#[test]
fn a_line_cut_short_is_ignored_then_cut_off() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_pod(dir.path());
    add(&store, "a");
    let whole = journal_len(dir.path());
    let journal = dir.path().join(JOURNAL_FILE);
    let mut file = fs::OpenOptions::new().append(true).open(&journal).unwrap();
    file.write_all(b"{\"g\":1,\"sandbox\":\"s\",\"pod\":nu")
        .unwrap();
    let cut = fs::read(&journal).unwrap();
    let (mut held, before) = (
        fs::File::open(&journal).unwrap(),
        ino(dir.path(), JOURNAL_FILE),
    );
    let theirs = Store::at(dir.path());
    assert_eq!(containers(&theirs.read_unlocked().unwrap()), ["a"]);
    add(&theirs, "b");
    let text = fs::read_to_string(&journal).unwrap();
    assert!(!text.contains("nu{"), "{text}");
    assert_eq!(text.lines().count(), 2);
    assert!(journal_len(dir.path()) > whole);
    assert_ne!(
        ino(dir.path(), JOURNAL_FILE),
        before,
        "replaced, not cut in place"
    );
    let mut seen = Vec::new();
    held.read_to_end(&mut seen).unwrap();
    assert_eq!(seen, cut, "the old version as it was");
    assert_eq!(containers(&store.read_unlocked().unwrap()), ["a", "b"]);
}

#[test]
fn a_journal_grown_past_its_bound_is_folded_into_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_pod(dir.path());
    let mut doc = ino(dir.path(), LEDGER_FILE);
    let mut replaced = 0;
    for i in 0..300 {
        add(&store, &format!("container-{i:04}"));
        let now = ino(dir.path(), LEDGER_FILE);
        if now != doc {
            replaced += 1;
            doc = now;
            assert_eq!(journal_len(dir.path()), 0);
        }
        assert!(journal_len(dir.path()) <= COMPACT_AT);
    }
    assert!(replaced > 0, "never folded");
    assert!(replaced < 300, "folded {replaced} times");
    assert_eq!(containers(&Ledger::read(dir.path()).unwrap()).len(), 300);
}

#[test]
fn a_corrupt_journal_line_fails_the_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_pod(dir.path());
    add(&store, "a");
    fs::write(dir.path().join(JOURNAL_FILE), b"{torn}\n").unwrap();
    let err = Ledger::read(dir.path()).unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(JOURNAL_FILE), "{err}");
    assert!(store.begin().is_err());
}

/// Readers without the lock, while one writer appends and another replaces
/// the document (emptying the journal): every read sees every change
/// committed before it started, never a document without its lines.
#[test]
fn readers_without_the_lock_never_miss_a_committed_line() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let dir = tempfile::tempdir().unwrap();
    store_with_pod(dir.path());
    let done = AtomicBool::new(false);
    let committed = AtomicUsize::new(0);
    // The writer starts once both readers have read: they are reading while
    // it writes, however the threads are scheduled.
    let reading = AtomicUsize::new(0);
    let reads = std::thread::scope(|s| {
        s.spawn(|| {
            // `done` on every way out, a panic's included: the readers stop.
            struct Done<'a>(&'a AtomicBool);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    self.0.store(true, SeqCst);
                }
            }
            let _done = Done(&done);
            // Bounded: a reader that failed its first read never counts.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while reading.load(SeqCst) < 2 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the readers never read"
                );
                std::thread::yield_now();
            }
            let (appender, replacer) = (Store::at(dir.path()), Store::at(dir.path()));
            for i in 1..=400 {
                add(&appender, &format!("c{i:04}"));
                committed.store(i, SeqCst);
                if i % 3 == 0 {
                    replacer.begin().unwrap().commit().unwrap();
                }
            }
        });
        let readers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let reader = Store::at(dir.path());
                    // Reads begun while the writes went on (some committed,
                    // not all).
                    let mut during = 0;
                    let mut first = true;
                    loop {
                        let finished = done.load(SeqCst);
                        let before = committed.load(SeqCst);
                        let seen = containers(&reader.read_unlocked().unwrap()).len();
                        assert!(seen >= before, "saw {seen} of {before} committed");
                        during += usize::from(!finished && before > 0);
                        if std::mem::take(&mut first) {
                            reading.fetch_add(1, SeqCst);
                        }
                        if finished {
                            return during;
                        }
                    }
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<usize>>()
    });
    // Reads overlapped the writes: the property was put to the test.
    assert!(
        reads.iter().sum::<usize>() > 0,
        "reads during the writes: {reads:?}"
    );
}

/// A reader without the lock that read the new document but the journal
/// before its emptying (the old generation's lines) keeps no copy: the next
/// generation's lines can bring the journal back to the same length, and a
/// copy keyed by it would hide them.
#[test]
fn a_journal_read_before_its_emptying_is_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let writer = store_with_pod(dir.path());
    add(&writer, "c01");
    add(&writer, "c02");
    let journal = dir.path().join(JOURNAL_FILE);
    let old_lines = fs::read(&journal).unwrap();
    let reader = Store::at(dir.path());
    assert_eq!(containers(&reader.read_unlocked().unwrap()), ["c01", "c02"]);
    // The replace; then, as the reader may find it, the journal not yet emptied.
    writer.begin().unwrap().commit().unwrap();
    let mut file = fs::OpenOptions::new().write(true).open(&journal).unwrap();
    file.write_all(&old_lines).unwrap();
    assert_eq!(containers(&reader.read_unlocked().unwrap()), ["c01", "c02"]);
    // Emptied, and two lines of the same length appended.
    file.set_len(0).unwrap();
    add(&writer, "c03");
    add(&writer, "c04");
    assert_eq!(fs::read(&journal).unwrap().len(), old_lines.len());
    assert_eq!(
        containers(&reader.read_unlocked().unwrap()),
        ["c01", "c02", "c03", "c04"]
    );
}

/// What the plugin does at exit: the document alone is then the ledger, for
/// people and for a release from before the journal.
#[test]
fn folding_leaves_the_whole_ledger_in_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_pod(dir.path());
    let ledger = Ledger::open(dir.path()).unwrap();
    ledger.fold_journal().unwrap();
    assert!(!dir.path().join(JOURNAL_FILE).exists(), "nothing to fold");
    add(&store, "a");
    let doc = ino(dir.path(), LEDGER_FILE);
    ledger.fold_journal().unwrap();
    assert_ne!(ino(dir.path(), LEDGER_FILE), doc);
    assert_eq!(journal_len(dir.path()), 0);
    let text = fs::read(dir.path().join(LEDGER_FILE)).unwrap();
    let alone: LedgerState = serde_json::from_slice(&text).unwrap();
    assert_eq!(containers(&alone), ["a"]);
}

/// A reader without the lock that opened the journal before a fold reads that
/// version whole: the fold puts an empty file in its place rather than cutting
/// it, so lines appended since never follow the old version's start in what
/// the reader reads.
#[test]
fn a_fold_leaves_a_journal_open_elsewhere_as_it_was() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_pod(dir.path());
    add(&store, "c01");
    add(&store, "c02");
    let journal = dir.path().join(JOURNAL_FILE);
    let mut held = fs::File::open(&journal).unwrap();
    let old = fs::read(&journal).unwrap();
    store.begin().unwrap().commit().unwrap();
    for c in ["c03", "c04", "c05", "c06"] {
        add(&store, c);
    }
    assert!(journal_len(dir.path()) > old.len() as u64);
    let mut seen = String::new();
    held.read_to_string(&mut seen).unwrap();
    assert_eq!(seen, String::from_utf8(old).unwrap());
    let now = Ledger::read(dir.path()).unwrap();
    assert_eq!(containers(&now), ["c01", "c02", "c03", "c04", "c05", "c06"]);
}

/// A line that did not sync is followed at once by the whole document,
/// replaced (and synced where the filesystem needs it): Linux reports a
/// failed writeback once, so a later line's sync would pass with this one's
/// page perhaps never written. The change stands, in the document.
#[test]
fn a_line_that_did_not_sync_is_carried_by_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let ours = store_with_pod(dir.path());
    add(&ours, "a");
    assert!(journal_len(dir.path()) > 0);
    let doc = ino(dir.path(), LEDGER_FILE);
    FAIL_NEXT_SYNC.set(true);
    add(&ours, "b");
    assert!(!FAIL_NEXT_SYNC.get(), "the line's sync was tried");
    assert_ne!(ino(dir.path(), LEDGER_FILE), doc, "the document replaced");
    assert_eq!(journal_len(dir.path()), 0, "the journal emptied");
    let text = fs::read(dir.path().join(LEDGER_FILE)).unwrap();
    let written: LedgerState = serde_json::from_slice(&text).unwrap();
    assert_eq!(containers(&written), ["a", "b"]);
    let theirs = Store::at(dir.path());
    assert_eq!(containers(&theirs.read_unlocked().unwrap()), ["a", "b"]);
    // And this store goes on appending.
    add(&ours, "c");
    assert!(journal_len(dir.path()) > 0);
    assert_eq!(
        containers(&theirs.read_unlocked().unwrap()),
        ["a", "b", "c"]
    );
}

/// A line a full disk cut short stays as it is: the transaction fails, no
/// reader takes the half line, and the next transaction puts a file of the
/// complete lines in the journal's place before it appends. Cut in place, a
/// reader without the lock that had read part of it could join its start to
/// the end of the line appended next.
#[test]
fn a_line_written_in_part_is_left_for_the_next_transaction_to_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let ours = store_with_pod(dir.path());
    add(&ours, "a");
    let whole = journal_len(dir.path());
    let before = ino(dir.path(), JOURNAL_FILE);
    SHORT_NEXT_WRITE.set(true);
    assert!(try_add(&ours, "b").is_err(), "a line written in part fails");
    assert!(!SHORT_NEXT_WRITE.get(), "the line's write was cut");
    assert!(journal_len(dir.path()) > whole, "the half line left");
    assert_eq!(
        ino(dir.path(), JOURNAL_FILE),
        before,
        "nothing cut in place"
    );
    let theirs = Store::at(dir.path());
    assert_eq!(containers(&theirs.read_unlocked().unwrap()), ["a"]);
    add(&ours, "c");
    assert_ne!(
        ino(dir.path(), JOURNAL_FILE),
        before,
        "cut by a new file in its place"
    );
    let text = fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.ends_with('\n'));
    assert_eq!(containers(&theirs.read_unlocked().unwrap()), ["a", "c"]);
    assert_eq!(containers(&ours.read_unlocked().unwrap()), ["a", "c"]);
}

/// Journal lines without their document (lost outside devgate: the first
/// claim writes the document, and it is only ever replaced) fail every read
/// and transaction rather than read as an empty ledger, which would give the
/// devices they claim out again.
#[test]
fn a_journal_without_its_document_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_pod(dir.path());
    add(&store, "a");
    fs::remove_file(dir.path().join(LEDGER_FILE)).unwrap();
    let err = Store::at(dir.path()).read_unlocked().unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(JOURNAL_FILE), "{err}");
    let err = Store::open(dir.path()).unwrap().begin().err().unwrap();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
    // An empty journal is no change: the ledger is empty.
    fs::write(dir.path().join(JOURNAL_FILE), b"").unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.begin().unwrap().state, LedgerState::default());
}
