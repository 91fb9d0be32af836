//! A node's first claims, raced by a reader without the lock.

use super::*;
use crate::ledger::load::ON_MISSING_DOCUMENT;
use crate::ledger::tests::record;
use crate::ledger::{Ledger, PodRecord, PodRef};

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
        let store = Store::open(&base).unwrap();
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
        let mut txn = store.begin().unwrap();
        let pod = txn.state.pods.get_mut("s").unwrap();
        pod.containers.insert("c".to_string(), record("c"));
        txn.commit_pod("s", &["c"]).unwrap();
    })));
    let ledger = Ledger::read(dir.path()).unwrap();
    assert!(ON_MISSING_DOCUMENT.take().is_none(), "the writer ran");
    assert!(ledger.container("c").is_some());
}
