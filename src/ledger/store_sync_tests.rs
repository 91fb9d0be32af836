//! The store on a disk whose syncs fail: a change stands where every reader
//! sees it, and nothing a power loss may need is thrown away.

use std::fs;

use super::journal_tests::{add, containers, ino, journal_len, store_with_pod};
use super::*;
use crate::ledger::journal::JOURNAL_FILE;
use crate::ledger::Ledger;

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

/// A document whose directory did not sync after its rename may be the old
/// one again after a power loss, and the old one needs the journal's lines:
/// they stay (of an older generation for the new document, which skips
/// them) until a fold whose directory synced empties the journal.
#[test]
fn the_journal_stays_while_the_documents_rename_may_not_survive() {
    let dir = tempfile::tempdir().unwrap();
    let ours = store_with_pod(dir.path());
    let open = fs::File::open(dir.path()).unwrap();
    assert_eq!(
        crate::fsutil::Durability::of_dir(&open),
        crate::fsutil::Durability::Sync,
        "a disk-backed directory"
    );
    let old_doc = fs::read(dir.path().join(LEDGER_FILE)).unwrap();
    add(&ours, "a");
    let journal = dir.path().join(JOURNAL_FILE);
    let lines = fs::read(&journal).unwrap();
    assert!(!lines.is_empty());
    crate::fsutil::FAIL_NEXT_DIR_SYNC.set(true);
    ours.begin().unwrap().commit().unwrap();
    assert!(
        !crate::fsutil::FAIL_NEXT_DIR_SYNC.get(),
        "the sync was tried"
    );
    assert_eq!(fs::read(&journal).unwrap(), lines, "the journal kept");
    assert_eq!(containers(&Ledger::read(dir.path()).unwrap()), ["a"]);
    // What a power loss may leave: the old document beside the journal.
    let lost = tempfile::tempdir().unwrap();
    fs::write(lost.path().join(LEDGER_FILE), &old_doc).unwrap();
    fs::write(lost.path().join(JOURNAL_FILE), &lines).unwrap();
    assert_eq!(containers(&Ledger::read(lost.path()).unwrap()), ["a"]);
    // Appends go on after the older lines, and every reader skips those.
    add(&ours, "b");
    let theirs = Store::open(dir.path()).unwrap();
    assert_eq!(containers(&theirs.read_unlocked().unwrap()), ["a", "b"]);
    ours.begin().unwrap().commit().unwrap();
    assert_eq!(journal_len(dir.path()), 0, "a synced fold empties it");
    assert_eq!(containers(&Ledger::read(dir.path()).unwrap()), ["a", "b"]);
}
