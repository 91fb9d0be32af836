//! The on-disk ledger: one JSON document under an exclusive `flock`, replaced
//! atomically (write temp, fsync, rename, fsync dir; no fsync on tmpfs, where it
//! does nothing) so a crash leaves either the old or the new document, never a
//! mix, and a journal of changes (a pod's claim, or its containers' records)
//! appended between two replaces (see `journal`). The plugin and the hook are separate processes;
//! the lock makes every read-modify-write a transaction between them.
//!
//! The plugin runs a transaction at every container creation and removal, so the
//! store keeps the last ledger it read or wrote, keyed by the document's
//! identity (device, inode, size, mtime) and the journal's length. Every
//! replacement is a new inode, and the journal only grows between two, so a
//! matching key under the lock means nobody else has written since: the cached
//! copy is reused and nothing is read or parsed.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::fsutil::{self, Durability, FileKey};

use super::load::{self, JournalKey, Key, Pins, LEDGER_FILE, MAX_LEDGER_BYTES};
use super::model::LedgerState;
use super::LedgerError;

const LOCK_FILE: &str = "ledger.lock";

/// The ledger files under a state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    cache: Arc<Mutex<Option<Cached>>>,
    /// The directory and the lock file, opened by the first transaction and kept,
    /// so that a transaction walks no path. The mutex orders this process's
    /// transactions: `flock` excludes other open files, not two users of one.
    handles: Arc<Mutex<Option<Handles>>>,
}

/// What a transaction works through.
#[derive(Debug)]
struct Handles {
    dir: File,
    lock: File,
    /// The journal opened for appending, with its identity; reopened when the
    /// name no longer leads to it.
    journal: Option<(Arc<File>, JournalKey)>,
    /// Whether a commit must fsync: not on tmpfs, the default `/run/devgate`.
    durability: Durability,
    /// The serialized document or line of the last commit, kept for its
    /// capacity: the next one is about as long and needs no growing allocations.
    text: Vec<u8>,
}

impl Handles {
    fn open(dir: &Path) -> Result<Handles, LedgerError> {
        let lock = fsutil::open_lock_file(&dir.join(LOCK_FILE))?;
        let dir = File::open(dir).map_err(|source| LedgerError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Handles {
            durability: Durability::of_dir(&dir),
            dir,
            lock,
            journal: None,
            text: Vec::new(),
        })
    }

    /// Whether the lock file is still linked: one removed together with the state
    /// directory no longer excludes the processes that open it by name.
    fn lock_is_linked(&self) -> bool {
        self.lock.metadata().is_ok_and(|m| m.nlink() > 0)
    }
}

/// `flock(2)` on a kept descriptor; a signal interrupting the wait retries it.
fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor this process owns.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

#[derive(Debug)]
struct Cached {
    key: Key,
    state: LedgerState,
    _pins: Pins,
}

/// An open transaction: holds the lock until dropped.
pub struct Txn<'a> {
    store: &'a Store,
    handles: MutexGuard<'a, Option<Handles>>,
    pub state: LedgerState,
    /// The version the state was read from.
    key: Key,
    pins: Pins,
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.handles.as_ref() {
            // Closing would release it too; the descriptor is kept for the next one.
            let _ = flock(&h.lock, libc::LOCK_UN);
        }
    }
}

impl Store {
    /// Opens the state directory, creating it (and missing parents) with mode
    /// 0700: claims are root's business. An existing one keeps its mode.
    pub fn open(dir: &Path) -> Result<Store, LedgerError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| LedgerError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        Ok(Store::at(dir))
    }

    /// The store under `dir`, which may not exist (readers only).
    pub fn at(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
            cache: Arc::new(Mutex::new(None)),
            handles: Arc::new(Mutex::new(None)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The error of an I/O step on `name`; its path is made only on failure,
    /// as every transaction passes this on its way.
    fn io(&self, name: &'static str) -> impl FnOnce(std::io::Error) -> LedgerError + '_ {
        move |source| LedgerError::Io {
            path: self.dir.join(name),
            source,
        }
    }

    /// Takes the exclusive lock and reads the current state. The cached copy
    /// moves into the transaction when the files are the ones this store last
    /// saw (a commit moves it back; a transaction dropped unwritten leaves the
    /// cache empty, and the next one reads the files).
    pub fn begin(&self) -> Result<Txn<'_>, LedgerError> {
        let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
        self.locked(&mut handles)?;
        // The transaction exists from here on, so a failure to read unlocks.
        let mut txn = Txn {
            store: self,
            handles,
            state: LedgerState::default(),
            key: Key {
                doc: None,
                journal: None,
            },
            pins: Pins::default(),
        };
        if let Some(h) = txn.handles.as_ref() {
            let (state, key, pins) = self.take_current(&h.dir)?;
            (txn.state, txn.key, txn.pins) = (state, key, pins);
        }
        Ok(txn)
    }

    /// Locks the kept lock file, (re)opening the handles first when there are none
    /// or their lock file has been unlinked.
    fn locked<'h>(&self, handles: &'h mut Option<Handles>) -> Result<&'h Handles, LedgerError> {
        for _ in 0..2 {
            let h = match handles.take() {
                Some(h) => h,
                None => Handles::open(&self.dir)?,
            };
            flock(&h.lock, libc::LOCK_EX).map_err(self.io(LOCK_FILE))?;
            if h.lock_is_linked() {
                return Ok(handles.insert(h));
            }
            // Dropping the handles closes the stale lock file and releases it.
        }
        Err(LedgerError::Io {
            path: self.dir.join(LOCK_FILE),
            source: std::io::Error::other("lock file unlinked while locking"),
        })
    }

    /// The current ledger under the lock, from the cache or the files.
    fn take_current(&self, dir: &File) -> Result<(LedgerState, Key, Pins), LedgerError> {
        let key = load::current_key(Some(dir), &self.dir)?;
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cached) = cache.take_if(|c| c.key == key) {
            return Ok((cached.state, key, cached._pins));
        }
        drop(cache);
        let loaded = load::load(&self.dir, true)?;
        let pins = loaded.pins.clone();
        self.remember(loaded.key, loaded.state.clone(), loaded.pins);
        Ok((loaded.state, loaded.key, pins))
    }

    /// Runs `f` on the current ledger without the lock, on the cached copy when
    /// the files are still that version (no read, no parse, no clone). For
    /// questions whose answer no concurrent writer can change under the caller,
    /// such as whether a container id, unique and admitted only at its
    /// creation, is known.
    pub fn peek<R>(&self, f: impl FnOnce(&LedgerState) -> R) -> Result<R, LedgerError> {
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(cached) = cache.as_ref() {
                if self.unlocked_key(cached.key.doc.is_some())? == cached.key {
                    return Ok(f(&cached.state));
                }
            }
        }
        Ok(f(&self.read_files()?))
    }

    /// `f` of the cached state as it is, perhaps stale: `None` without one.
    /// Only for a question whose answer a transaction checks again.
    pub fn peek_cached<R>(&self, f: impl FnOnce(&LedgerState) -> R) -> Option<R> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.as_ref().map(|c| f(&c.state))
    }

    /// The files' key without the ledger lock, to compare with a cached one:
    /// through the kept directory when no transaction of this process holds it
    /// (no path to walk), else by path. Only for a cached key with a document:
    /// a kept directory removed since shows none, so it never passes for that
    /// key, while it would for an empty one.
    fn unlocked_key(&self, cached_doc: bool) -> Result<Key, LedgerError> {
        if cached_doc {
            if let Ok(handles) = self.handles.try_lock() {
                if let Some(h) = handles.as_ref() {
                    return load::current_key(Some(&h.dir), &self.dir);
                }
            }
        }
        load::current_key(None, &self.dir)
    }

    fn remember(&self, key: Key, state: LedgerState, pins: Pins) {
        let cached = Cached {
            key,
            state,
            _pins: pins,
        };
        *self.cache.lock().unwrap_or_else(PoisonError::into_inner) = Some(cached);
    }

    /// Empties the cache: no key names what the files hold now.
    fn forget(&self) {
        *self.cache.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Reads the state without the lock (see `load` for why it is consistent).
    pub fn read_unlocked(&self) -> Result<LedgerState, LedgerError> {
        self.peek(LedgerState::clone)
    }

    /// Reads the files without the lock, and caches what it read.
    fn read_files(&self) -> Result<LedgerState, LedgerError> {
        let loaded = load::load(&self.dir, false)?;
        // A cut tail is no part of the copy, but its key would name it. Lines
        // of another generation are a journal a crash or a failed emptying
        // left, which a later fold empties: such a copy is read again then.
        if !loaded.torn && !loaded.other_generations {
            self.remember(loaded.key, loaded.state.clone(), loaded.pins);
        }
        Ok(loaded.state)
    }
}

impl Txn<'_> {
    /// Whether the state read holds lines of the journal.
    pub fn has_journal(&self) -> bool {
        self.key.journal.is_some_and(|k| k.size > 0)
    }

    /// Ends a transaction that changed nothing: its state goes back to the
    /// cache, so that the next transaction need not read the files again.
    pub fn unchanged(mut self) {
        let state = std::mem::take(&mut self.state);
        let pins = std::mem::take(&mut self.pins);
        self.store.remember(self.key, state, pins);
    }

    /// Writes the whole state (the journal folded in, its generation bumped)
    /// and releases the lock (held until the new document is in place: the
    /// transaction's drop unlocks when this returns); the state moves into the
    /// cache.
    pub fn commit(mut self) -> Result<(), LedgerError> {
        let mut state = std::mem::take(&mut self.state);
        state.generation = state.generation.wrapping_add(1);
        let store = self.store;
        // `begin` filled the handles before handing out the transaction.
        let Some(h) = self.handles.as_mut() else {
            return Err(store.io(LOCK_FILE)(std::io::Error::other("no lock held")));
        };
        let text = &mut h.text;
        text.clear();
        // Compact: `devgate status` is the view for people.
        serde_json::to_writer(&mut *text, &state).map_err(|e| LedgerError::Corrupt {
            path: store.dir.join(LEDGER_FILE),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        if text.len() as u64 > MAX_LEDGER_BYTES {
            let size = text.len() as u64;
            // Not kept at that size for the next transaction.
            h.text = Vec::new();
            return Err(LedgerError::Full {
                path: store.dir.join(LEDGER_FILE),
                size,
                limit: MAX_LEDGER_BYTES,
            });
        }
        let (meta, file) = fsutil::replace_in(&h.dir, &store.dir, LEDGER_FILE, text, h.durability)
            .map_err(LedgerError::from)?;
        let doc = Some(FileKey::of(&meta));
        // The new generation leaves every journal line behind: emptying the
        // journal only saves readers from skipping them.
        let journal = match self.key.journal {
            None => Some((None, None)),
            Some(k) if k.size == 0 => Some((Some(k), self.pins.journal.take())),
            Some(_) => store.empty_journal(h).map(|(k, pin)| (Some(k), Some(pin))),
        };
        match journal {
            Some((journal, pin)) => {
                let pins = Pins {
                    doc: Some(Arc::new(file)),
                    journal: pin,
                };
                store.remember(Key { doc, journal }, state, pins);
            }
            // No key names the journal as it is: the next transaction reads.
            None => store.forget(),
        }
        Ok(())
    }
}

mod append;
#[cfg(test)]
pub(super) use append::{FAIL_NEXT_SYNC, SHORT_NEXT_WRITE};

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "store_journal_tests.rs"]
mod journal_tests;

#[cfg(test)]
#[path = "store_first_tests.rs"]
mod first_tests;
