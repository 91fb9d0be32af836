//! Appending to the ledger's journal (see `journal`) under a transaction.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;

use crate::fsutil::Durability;

use super::super::journal::{self, COMPACT_AT, JOURNAL_FILE};
use super::super::load::{JournalKey, Key, Pins};
use super::super::model::LedgerState;
use super::super::LedgerError;
use super::{Handles, Store, Txn, LOCK_FILE};

impl Txn<'_> {
    /// Commits a change to `sandbox_id`'s record alone: the records of
    /// `containers` and its network owner, never its claims nor any device,
    /// which a line of the journal carries (appended, one `write`). A ledger
    /// without a document yet, a pod the state does not hold, or a line that
    /// would grow the journal past [`COMPACT_AT`], is written whole instead.
    pub fn commit_pod(self, sandbox_id: &str, containers: &[&str]) -> Result<(), LedgerError> {
        if !self.state.pods.contains_key(sandbox_id) {
            return self.commit();
        }
        self.append_with(|buf, state| {
            let pod = &state.pods[sandbox_id];
            journal::encode(buf, state.generation, sandbox_id, pod, containers)
        })
    }

    /// Commits a claim: `sandbox_id`'s record and those of the devices keyed
    /// `devices`, set whole by one line of the journal, or the whole document
    /// as [`Txn::commit_pod`] says.
    pub fn commit_claim(self, sandbox_id: &str, devices: &[String]) -> Result<(), LedgerError> {
        self.append_with(|buf, state| journal::encode_set(buf, state, sandbox_id, devices))
    }

    /// Appends the line `encode` writes for the state, or writes the whole
    /// document (no document yet, a line past the bound, another journal).
    fn append_with(
        mut self,
        encode: impl FnOnce(&mut Vec<u8>, &LedgerState) -> serde_json::Result<()>,
    ) -> Result<(), LedgerError> {
        if self.key.doc.is_none() {
            return self.commit();
        }
        let store = self.store;
        let Some(h) = self.handles.as_mut() else {
            return Err(store.io(LOCK_FILE)(std::io::Error::other("no lock held")));
        };
        let text = &mut h.text;
        text.clear();
        encode(text, &self.state).map_err(|e| LedgerError::Corrupt {
            path: store.dir.join(JOURNAL_FILE),
            reason: e.to_string(),
        })?;
        let size = self.key.journal.map_or(0, |k| k.size);
        if size + text.len() as u64 > COMPACT_AT {
            return self.commit();
        }
        let Some((file, at)) = store.journal_at(h, self.key.journal)? else {
            // Not the file the key named: write the whole document.
            return self.commit();
        };
        let text = &h.text;
        let synced = append(&file, text, h.durability).map_err(store.io(JOURNAL_FILE))?;
        let journal = Some(JournalKey {
            size: at.size + text.len() as u64,
            ..at
        });
        if !synced {
            return self.commit_after_unsynced(journal);
        }
        let key = Key {
            doc: self.key.doc,
            journal,
        };
        let pins = Pins {
            doc: self.pins.doc.take(),
            journal: Some(file),
        };
        let state = std::mem::take(&mut self.state);
        store.remember(key, state, pins);
        Ok(())
    }

    /// After a line that did not sync: the whole document, replaced and
    /// synced, carries its change instead. Linux reports a failed writeback
    /// once (`errseq_t`, mm/filemap.c), so the next line's sync would pass
    /// with this one's page perhaps never written. The line stands either
    /// way (readers replay it), so a failed replace is only logged.
    fn commit_after_unsynced(mut self, journal: Option<JournalKey>) -> Result<(), LedgerError> {
        self.key.journal = journal;
        if let Err(e) = self.commit() {
            tracing::warn!(error = %nri::ErrorChain(&e), "ledger journal line did not sync, nor did the document replacing it");
        }
        Ok(())
    }
}

impl Store {
    /// The journal to append to, at the length `seen` under the lock (none:
    /// no file yet), opened (created) when the kept one is not that file.
    /// `None` when the file found is not the one seen.
    fn journal_at(
        &self,
        h: &mut Handles,
        seen: Option<JournalKey>,
    ) -> Result<Option<(Arc<File>, JournalKey)>, LedgerError> {
        if let (Some((file, kept)), Some(seen)) = (&h.journal, seen) {
            if (kept.dev, kept.ino) == (seen.dev, seen.ino) {
                return Ok(Some((file.clone(), seen)));
            }
        }
        let path = self.dir.join(JOURNAL_FILE);
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(self.io(JOURNAL_FILE))?;
        let meta = file.metadata().map_err(self.io(JOURNAL_FILE))?;
        let found = JournalKey::of(&meta);
        let same = match seen {
            Some(seen) => seen.is_file(&meta) && seen.size == found.size,
            None => found.size == 0,
        };
        if seen.is_none() && h.durability == Durability::Sync {
            // The new name is durable once its directory is.
            h.dir.sync_all().map_err(self.io(JOURNAL_FILE))?;
        }
        let file = Arc::new(file);
        h.journal = Some((file.clone(), found));
        Ok(same.then_some((file, found)))
    }

    /// Empties the journal after a replace: its key and pin, or `None` when it
    /// could not be emptied (its lines are of an older generation, ignored).
    /// An empty file takes its name rather than the file being cut in place:
    /// a reader without the lock that has the old version open reads it whole
    /// (lines of the generation before, which it skips), never its start
    /// followed by lines appended to the new one since.
    pub(super) fn empty_journal(&self, h: &mut Handles) -> Option<(JournalKey, Arc<File>)> {
        let emptied = crate::fsutil::replace_in(&h.dir, &self.dir, JOURNAL_FILE, b"", h.durability);
        match emptied {
            Ok((meta, file)) => {
                // Appends open the new file; the old one stays only as readers' copy.
                h.journal = None;
                Some((JournalKey::of(&meta), Arc::new(file)))
            }
            Err(e) => {
                tracing::warn!(error = %nri::ErrorChain(&e), "ledger journal not emptied: its lines are of an older generation");
                None
            }
        }
    }
}

/// One `write` of a whole line at the end of the journal (`O_APPEND`). A write
/// cut short (a signal between pages, a full disk) leaves a line without its
/// newline, which no reader takes; the next locked load cuts it off by putting
/// a file of the complete lines in the journal's place (`load::cut_tail`), so
/// the next line starts at a line's start. Cutting it here in place instead
/// could join, for a reader without the lock that read part of it, its start
/// to the end of the line appended next. False when the line is written but
/// did not sync.
fn append(file: &File, line: &[u8], durability: Durability) -> std::io::Result<bool> {
    append_then(file, line, |f| {
        #[cfg(test)]
        if FAIL_NEXT_SYNC.take() {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        match durability {
            Durability::Sync => f.sync_data(),
            Durability::Memory => Ok(()),
        }
    })
}

#[cfg(test)]
thread_local! {
    /// Fails this thread's next journal sync with EIO, whatever the filesystem.
    pub(in crate::ledger) static FAIL_NEXT_SYNC: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
    /// Writes only the first half of this thread's next journal line, as a
    /// full disk would.
    pub(in crate::ledger) static SHORT_NEXT_WRITE: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

/// [`append`] with `sync` run once the whole line is written.
fn append_then(
    file: &File,
    line: &[u8],
    sync: impl FnOnce(&File) -> std::io::Result<()>,
) -> std::io::Result<bool> {
    let mut out = file;
    #[cfg(test)]
    let line_now = if SHORT_NEXT_WRITE.take() {
        &line[..line.len() / 2]
    } else {
        line
    };
    #[cfg(not(test))]
    let line_now = line;
    match out.write(line_now)? {
        n if n == line.len() => {}
        _ => return Err(std::io::Error::other("journal line written in part")),
    }
    // The whole line is written: every reader replays it from here on. A
    // sync that fails leaves only its survival of a power loss in doubt; an
    // error would tell the caller nothing was committed (a claim reported
    // refused while every reader sees it held), as for a replace
    // (`fsutil::replace`).
    if let Err(e) = sync(file) {
        tracing::warn!(error = %nri::ErrorChain(&e), "ledger journal line appended, but it did not sync");
        return Ok(false);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek};

    use super::*;

    /// A line written whole stands when its sync fails: readers see it, so
    /// the transaction is reported made, and the next line follows it.
    #[test]
    fn a_whole_line_stands_when_its_sync_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)
            .unwrap();
        let mut synced = false;
        let stands = append_then(&file, b"{\"a\":1}\n", |_| {
            synced = true;
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        });
        assert!(synced);
        assert!(!stands.unwrap(), "reported unsynced");
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n");
        // Appended after it, synced: both lines, in order.
        assert!(append_then(&file, b"{\"b\":2}\n", |f| f.sync_data()).unwrap());
        let mut text = String::new();
        let mut f = &file;
        f.rewind().unwrap();
        f.read_to_string(&mut text).unwrap();
        assert_eq!(text, "{\"a\":1}\n{\"b\":2}\n");
    }
}
