//! The on-disk ledger: one JSON document under an exclusive `flock`, replaced
//! atomically (write temp, fsync, rename, fsync dir; no fsync on tmpfs, where it
//! does nothing) so a crash leaves either the old or the new document, never a mix. The plugin and the hook are separate
//! processes; the lock makes every read-modify-write a transaction between them.
//!
//! The plugin runs a transaction at every container creation and removal, so the
//! store keeps the last document it read or wrote, keyed by the file's identity
//! (device, inode, size, mtime). Every replacement is a new inode, so a matching
//! key under the lock means nobody else has written since: the cached document is
//! reused and the file is neither read nor parsed. The cache keeps its version
//! open, so that no other file can get its inode number meanwhile.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;

use crate::fsutil::{self, BoundedError, Durability};

use super::model::LedgerState;
use super::LedgerError;

const LEDGER_FILE: &str = "ledger.json";
const LOCK_FILE: &str = "ledger.lock";
/// A ledger larger than this is corrupt or hostile; refuse to parse it.
const MAX_LEDGER_BYTES: u64 = 16 * 1024 * 1024;

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
    /// Whether a commit must fsync: not on tmpfs, the default `/run/devgate`.
    durability: Durability,
    /// The serialized document of the last commit, kept for its capacity:
    /// the next one is about as long and needs no growing allocations.
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

/// What identifies one version of the ledger file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl FileKey {
    fn of_stat(st: &nix::sys::stat::FileStat) -> FileKey {
        FileKey {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec,
        }
    }

    fn of(meta: &fs::Metadata) -> FileKey {
        FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

#[derive(Debug)]
struct Cached {
    key: FileKey,
    state: LedgerState,
    /// The cached version, kept open: its inode number stays its own until the
    /// cache moves on, so another version can never show the same key
    /// (filesystems such as ext4 hand a freed inode number to the next file
    /// created, and mtime moves only once per timer tick).
    _pin: File,
}

/// An open transaction: holds the lock until dropped.
pub struct Txn<'a> {
    store: &'a Store,
    handles: MutexGuard<'a, Option<Handles>>,
    pub state: LedgerState,
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
        fs::DirBuilder::new()
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

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn io(&self, name: &str) -> impl FnOnce(std::io::Error) -> LedgerError + '_ {
        let path = self.path(name);
        move |source| LedgerError::Io { path, source }
    }

    /// Takes the exclusive lock and reads the current state. The cached document
    /// moves into the transaction when the file is the one this store last saw
    /// (a commit moves it back; a transaction dropped unwritten leaves the cache
    /// empty, and the next one reads the file).
    pub fn begin(&self) -> Result<Txn<'_>, LedgerError> {
        let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
        self.locked(&mut handles)?;
        // The transaction exists from here on, so a failure to read unlocks.
        let mut txn = Txn {
            store: self,
            handles,
            state: LedgerState::default(),
        };
        if let Some(h) = txn.handles.as_ref() {
            txn.state = self.take_current(&h.dir)?;
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
            path: self.path(LOCK_FILE),
            source: std::io::Error::other("lock file unlinked while locking"),
        })
    }

    /// The current document under the lock, from the cache or the file.
    fn take_current(&self, dir: &File) -> Result<LedgerState, LedgerError> {
        let key = match fstatat(Some(dir.as_raw_fd()), LEDGER_FILE, AtFlags::empty()) {
            Ok(st) => FileKey::of_stat(&st),
            Err(Errno::ENOENT) => return Ok(LedgerState::default()),
            Err(e) => return Err(self.io(LEDGER_FILE)(e.into())),
        };
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        match cache.take() {
            Some(cached) if cached.key == key => Ok(cached.state),
            _ => {
                drop(cache);
                self.read_file()
            }
        }
    }

    /// Runs `f` on the current document without the lock, on the cached copy when
    /// the file is still that version (no read, no parse, no clone). For questions
    /// whose answer no concurrent writer can change under the caller, such as
    /// whether a container id, unique and admitted only at its creation, is known.
    pub fn peek<R>(&self, f: impl FnOnce(&LedgerState) -> R) -> Result<R, LedgerError> {
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(cached) = cache.as_ref() {
                if self.is_current(cached.key)? {
                    return Ok(f(&cached.state));
                }
            }
        }
        Ok(f(&self.read_file()?))
    }

    /// Whether the ledger file is still the version `key` names.
    fn is_current(&self, key: FileKey) -> Result<bool, LedgerError> {
        match fs::metadata(self.path(LEDGER_FILE)) {
            Ok(meta) => Ok(FileKey::of(&meta) == key),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(LedgerError::Io {
                path: self.path(LEDGER_FILE),
                source,
            }),
        }
    }

    fn remember(&self, key: FileKey, state: LedgerState, pin: File) {
        let cached = Cached {
            key,
            state,
            _pin: pin,
        };
        *self.cache.lock().unwrap_or_else(PoisonError::into_inner) = Some(cached);
    }

    /// Reads the state without the lock: the rename makes every read consistent.
    pub fn read_unlocked(&self) -> Result<LedgerState, LedgerError> {
        self.peek(LedgerState::clone)
    }

    /// Reads and parses the file, and caches what it read.
    fn read_file(&self) -> Result<LedgerState, LedgerError> {
        let path = self.path(LEDGER_FILE);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LedgerState::default()),
            Err(source) => return Err(LedgerError::Io { path, source }),
        };
        let meta = file.metadata().map_err(self.io(LEDGER_FILE))?;
        if meta.len() > MAX_LEDGER_BYTES {
            return Err(too_large(path));
        }
        // Sized from fstat: one read instead of a doubling series.
        let mut text = Vec::with_capacity(meta.len() as usize + 1);
        match fsutil::read_bounded(&file, MAX_LEDGER_BYTES, &mut text) {
            Ok(()) => {}
            Err(BoundedError::Io(source)) => return Err(self.io(LEDGER_FILE)(source)),
            Err(BoundedError::TooLarge { .. }) => return Err(too_large(path)),
        }
        let state: LedgerState =
            serde_json::from_slice(&text).map_err(|e| LedgerError::Corrupt {
                path,
                reason: e.to_string(),
            })?;
        // Only a file read whole at the size fstat saw is worth caching.
        if text.len() as u64 == meta.len() {
            self.remember(FileKey::of(&meta), state.clone(), file);
        }
        Ok(state)
    }

    fn write_atomic(&self, h: &mut Handles, state: LedgerState) -> Result<(), LedgerError> {
        // Compact: the ledger is rewritten at every container creation;
        // `devgate status` is the view for people.
        let text = &mut h.text;
        text.clear();
        serde_json::to_writer(&mut *text, &state).map_err(|e| LedgerError::Corrupt {
            path: self.path(LEDGER_FILE),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        let (meta, file) = fsutil::replace_in(&h.dir, &self.dir, LEDGER_FILE, text, h.durability)
            .map_err(LedgerError::from)?;
        self.remember(FileKey::of(&meta), state, file);
        Ok(())
    }
}

fn too_large(path: PathBuf) -> LedgerError {
    LedgerError::Corrupt {
        path,
        reason: "larger than 16 MiB".to_string(),
    }
}

impl Txn<'_> {
    /// Writes the state and releases the lock (held until the new document is in
    /// place: the transaction's drop unlocks when this returns); the document
    /// moves into the cache.
    pub fn commit(mut self) -> Result<(), LedgerError> {
        let state = std::mem::take(&mut self.state);
        // `begin` filled the handles before handing out the transaction.
        let Some(h) = self.handles.as_mut() else {
            return Err(self.store.io(LOCK_FILE)(std::io::Error::other(
                "no lock held",
            )));
        };
        self.store.write_atomic(h, state)
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
