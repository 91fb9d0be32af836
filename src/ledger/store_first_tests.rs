//! A node's first claims, raced by a reader without the lock.

use super::journal_tests::{add, store_with_pod};
use crate::ledger::load::ON_MISSING_DOCUMENT;
use crate::ledger::Ledger;

/// Between a reader's look for the document and its look at the journal, a
/// first claim writes the document and a further change is appended: the
/// journal then holds changes to a document the reader did not find. That
/// is read again, never taken for a document lost (Corrupt), which failed
/// the hook or the look that read it in a node's first pod burst.
#[test]
fn a_document_made_while_a_reader_looked_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().to_path_buf();
    ON_MISSING_DOCUMENT.set(Some(Box::new(move || {
        let store = store_with_pod(&base);
        add(&store, "c");
    })));
    let ledger = Ledger::read(dir.path()).unwrap();
    assert!(ON_MISSING_DOCUMENT.take().is_none(), "the writer ran");
    assert!(ledger.container("c").is_some());
}
