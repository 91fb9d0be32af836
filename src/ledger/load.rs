//! Reading the ledger: the document, then the journal lines of its generation
//! (see `journal`), and what identifies the pair so that a cached copy can be
//! told current by two `stat`s.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;

use crate::fsutil::{self, BoundedError, FileKey, WholeFile};

use super::journal::{self, JOURNAL_FILE};
use super::model::{LedgerState, LEDGER_VERSION};
use super::LedgerError;

pub(super) const LEDGER_FILE: &str = "ledger.json";
/// A ledger (or journal) larger than this is corrupt or hostile; refuse to parse it.
pub(super) const MAX_LEDGER_BYTES: u64 = 16 * 1024 * 1024;
/// Reads without the lock that found the document replaced under them, in a
/// row, before giving up: a replace takes microseconds, a read about as long.
const MAX_UNLOCKED_TRIES: usize = 64;
/// Reads without the lock that found a journal line they could not parse, in
/// a row, before reporting it: a writer's cut and append take microseconds.
const CORRUPT_TRIES: usize = 4;

/// What identifies the journal's content: within one generation it only grows
/// by complete lines (a cut tail was never part of it), so its length names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct JournalKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

impl JournalKey {
    pub(super) fn of(meta: &fs::Metadata) -> JournalKey {
        JournalKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
        }
    }

    pub(super) fn is_file(&self, meta: &fs::Metadata) -> bool {
        (self.dev, self.ino) == (meta.dev(), meta.ino())
    }
}

/// The ledger's current content, as two `stat`s see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Key {
    pub doc: Option<FileKey>,
    pub journal: Option<JournalKey>,
}

/// The versions a cached copy was read from, kept open so that no other file
/// can get their inode numbers meanwhile (filesystems such as ext4 hand a freed
/// inode number to the next file created, and mtime moves once per timer tick).
#[derive(Debug, Clone, Default)]
pub(super) struct Pins {
    pub doc: Option<Arc<File>>,
    pub journal: Option<Arc<File>>,
}

/// A ledger read whole.
pub(super) struct Loaded {
    pub state: LedgerState,
    pub key: Key,
    pub pins: Pins,
    /// The journal ended in a line without its newline (see `journal`): the
    /// copy is right, but the key names bytes that are no part of it.
    pub torn: bool,
    /// The journal read held lines of another generation: the copy is right,
    /// but without the lock the key may name other content (see
    /// `journal::Replayed`), so such a copy is not kept.
    pub other_generations: bool,
}

fn io(path: PathBuf) -> impl FnOnce(std::io::Error) -> LedgerError {
    move |source| LedgerError::Io { path, source }
}

/// `stat` of the two files: relative to `dir` (held open by writers), or by
/// path under `base`.
pub(super) fn current_key(dir: Option<&File>, base: &Path) -> Result<Key, LedgerError> {
    let stat = |name: &str| {
        let found = match dir {
            Some(d) => fstatat(Some(d.as_raw_fd()), name, AtFlags::empty()),
            None => fstatat(None, &base.join(name), AtFlags::empty()),
        };
        match found {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(io(base.join(name))(e.into())),
        }
    };
    // The journal first: a document found still the cached version had not
    // been replaced when the journal was looked at, so the journal was still
    // that version's, which only grows; its length then names its content.
    // (A copy read between a replace and the journal's emptying holds lines
    // of the generation before; such a copy is never cached, see `Loaded`.)
    let journal = stat(JOURNAL_FILE)?.map(|st| JournalKey {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
    });
    let doc = stat(LEDGER_FILE)?.map(|st| FileKey::of_stat(&st));
    Ok(Key { doc, journal })
}

/// Reads the ledger under `base`. Without the lock, a document replaced while
/// its journal was read is read again: that replace folded the journal in and
/// then emptied it, so the journal read may lack lines of the document read.
/// With it (`locked`), a cut tail is cut off the file, since its writer is gone.
pub(super) fn load(base: &Path, locked: bool) -> Result<Loaded, LedgerError> {
    for attempt in 0..MAX_UNLOCKED_TRIES {
        let Some((mut state, doc_key, doc)) = read_document(base)? else {
            #[cfg(test)]
            if let Some(meanwhile) = ON_MISSING_DOCUMENT.take() {
                meanwhile();
            }
            let key = current_key(None, base)?;
            // A node's first claim wrote the document since it was looked
            // for, and a change may be appended already: read again.
            if !locked && key.doc.is_some() && attempt + 1 < MAX_UNLOCKED_TRIES {
                continue;
            }
            // The first claim of an empty ledger writes the document, and it
            // is only ever replaced, so journal lines without one are changes
            // to a document lost outside devgate: read as empty, the ledger
            // would give the devices they claim out again.
            if let Some(journal) = key.journal.filter(|j| j.size > 0) {
                return Err(LedgerError::Corrupt {
                    path: base.join(LEDGER_FILE),
                    reason: format!(
                        "missing, while {JOURNAL_FILE} beside it holds {} bytes of changes to it (drain the node, then remove both files to start empty)",
                        journal.size
                    ),
                });
            }
            let key = Key { doc: None, ..key };
            let state = LedgerState::default();
            return Ok(loaded(state, key, None, None, false));
        };
        let (journal_key, journal, replayed) = match read_journal(base, &mut state) {
            Ok(read) => read,
            // Without the lock, a writer may cut a torn tail under the read
            // and append after it, so that the read joins the two: read again.
            Err(LedgerError::Corrupt { .. }) if !locked && attempt + 1 < CORRUPT_TRIES => continue,
            Err(e) => return Err(e),
        };
        let complete = replayed.complete as u64;
        let torn = journal_key.is_some_and(|k| complete < k.size);
        if !locked && !still_named(base, &doc_key)? {
            continue;
        }
        let mut key = Key {
            doc: Some(doc_key),
            journal: journal_key,
        };
        let (torn, journal) = if locked && torn {
            let (cut_key, cut) = cut_tail(base, complete)?;
            key.journal = Some(cut_key);
            (false, Some(cut))
        } else {
            (torn, journal)
        };
        let mut loaded = loaded(state, key, Some(doc), journal, torn);
        loaded.other_generations = replayed.other_generations;
        return Ok(loaded);
    }
    Err(io(base.join(LEDGER_FILE))(std::io::Error::other(
        "replaced at every read",
    )))
}

fn loaded(
    state: LedgerState,
    key: Key,
    doc: Option<File>,
    journal: Option<File>,
    torn: bool,
) -> Loaded {
    let pins = Pins {
        doc: doc.map(Arc::new),
        journal: journal.map(Arc::new),
    };
    Loaded {
        state,
        key,
        pins,
        torn,
        other_generations: false,
    }
}

/// Whether `base`'s document is still the version `key` names.
fn still_named(base: &Path, key: &FileKey) -> Result<bool, LedgerError> {
    let path = base.join(LEDGER_FILE);
    match fs::metadata(&path) {
        Ok(meta) => Ok(FileKey::of(&meta) == *key),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(LedgerError::Io { path, source }),
    }
}

/// Reads the whole of `path` (at most [`MAX_LEDGER_BYTES`]); `None` when
/// there is no such file.
fn read_whole(path: &Path) -> Result<Option<WholeFile>, LedgerError> {
    match fsutil::read_whole_bounded(path, MAX_LEDGER_BYTES) {
        Ok(whole) => Ok(Some(whole)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(BoundedError::Io(source)) => Err(io(path.to_path_buf())(source)),
        Err(BoundedError::TooLarge { .. }) => Err(too_large(path.to_path_buf())),
    }
}

fn read_document(base: &Path) -> Result<Option<(LedgerState, FileKey, File)>, LedgerError> {
    let path = base.join(LEDGER_FILE);
    let Some(WholeFile { file, meta, bytes }) = read_whole(&path)? else {
        return Ok(None);
    };
    let state: LedgerState = serde_json::from_slice(&bytes).map_err(|e| LedgerError::Corrupt {
        path,
        reason: e.to_string(),
    })?;
    // A newer release bumps the version when what it writes (the document or
    // its journal) would be misread here: refused, as a claim misread would
    // give its devices out twice.
    if state.version > LEDGER_VERSION {
        return Err(LedgerError::Newer {
            path: base.join(LEDGER_FILE),
            version: state.version,
            known: LEDGER_VERSION,
        });
    }
    // A document replaces its file whole, so the size read is the size stat saw.
    Ok(Some((state, FileKey::of(&meta), file)))
}

/// Applies the journal to `state`: its key (the length read), the file, and
/// what the replay found.
fn read_journal(
    base: &Path,
    state: &mut LedgerState,
) -> Result<(Option<JournalKey>, Option<File>, journal::Replayed), LedgerError> {
    let path = base.join(JOURNAL_FILE);
    let Some(WholeFile {
        file,
        meta,
        bytes: text,
    }) = read_whole(&path)?
    else {
        let nothing = journal::Replayed {
            complete: 0,
            other_generations: false,
        };
        return Ok((None, None, nothing));
    };
    let replayed =
        journal::replay(state, &text).map_err(|reason| LedgerError::Corrupt { path, reason })?;
    // Lines appended after the `fstat` were read and applied: the key names
    // what was read.
    let key = JournalKey {
        size: text.len() as u64,
        ..JournalKey::of(&meta)
    };
    Ok((Some(key), Some(file), replayed))
}

/// Cuts the journal back to its first `complete` bytes, its complete lines
/// (under the lock: the writer of the tail is gone, and the next line must
/// not be appended to its half); the new file's key and the file. A file of
/// those lines takes the journal's name rather than the file being cut in
/// place, as the fold empties it: a reader without the lock that has the old
/// one open reads it whole, the cut line included (and reads again), never
/// the cut line's start joined to the end of a line appended after the cut,
/// which could parse as a line no one wrote.
fn cut_tail(base: &Path, complete: u64) -> Result<(JournalKey, File), LedgerError> {
    let path = base.join(JOURNAL_FILE);
    tracing::warn!(path = %path.display(), at = complete, "ledger journal ends in a cut line: cutting it off");
    let bytes = read_whole(&path)?
        .map(|whole| whole.bytes)
        .unwrap_or_default();
    let lines = bytes.get(..complete as usize).unwrap_or(&bytes);
    let meta = fsutil::replace_file_meta(&path, lines)?;
    let file = File::open(&path).map_err(io(path))?;
    Ok((JournalKey::of(&meta), file))
}

fn too_large(path: PathBuf) -> LedgerError {
    LedgerError::Corrupt {
        path,
        reason: "larger than 16 MiB".to_string(),
    }
}

#[cfg(test)]
thread_local! {
    /// Runs once, on this thread, when a read finds no document: what other
    /// processes may do in that moment.
    pub(in crate::ledger) static ON_MISSING_DOCUMENT: std::cell::Cell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::Cell::new(None) };
}
