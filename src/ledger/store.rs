//! The on-disk ledger: one JSON document under an exclusive `flock`, replaced
//! atomically (write temp, fsync, rename, fsync dir) so a crash leaves either the
//! old or the new document, never a mix. The plugin and the hook are separate
//! processes; the lock makes every read-modify-write a transaction between them.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use nix::fcntl::Flock;

use crate::fsutil;

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
}

/// An open transaction: holds the lock until dropped.
pub struct Txn<'a> {
    store: &'a Store,
    _lock: Flock<File>,
    pub state: LedgerState,
}

impl Store {
    /// Opens (creating) the state directory. Mode 0700: claims are root's business.
    pub fn open(dir: &Path) -> Result<Store, LedgerError> {
        fs::create_dir_all(dir).map_err(|source| LedgerError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Store {
            dir: dir.to_path_buf(),
        })
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

    /// Takes the exclusive lock and reads the current state.
    pub fn begin(&self) -> Result<Txn<'_>, LedgerError> {
        let lock = fsutil::lock_exclusive(&self.path(LOCK_FILE)).map_err(LedgerError::from)?;
        let state = self.read_unlocked()?;
        Ok(Txn {
            store: self,
            _lock: lock,
            state,
        })
    }

    /// Reads the state without the lock: the rename makes every read consistent.
    pub fn read_unlocked(&self) -> Result<LedgerState, LedgerError> {
        let path = self.path(LEDGER_FILE);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LedgerState::default()),
            Err(source) => return Err(LedgerError::Io { path, source }),
        };
        let mut text = String::new();
        file.take(MAX_LEDGER_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(self.io(LEDGER_FILE))?;
        if text.len() as u64 > MAX_LEDGER_BYTES {
            return Err(LedgerError::Corrupt {
                path,
                reason: "larger than 16 MiB".to_string(),
            });
        }
        serde_json::from_str(&text).map_err(|e| LedgerError::Corrupt {
            path,
            reason: e.to_string(),
        })
    }

    fn write_atomic(&self, state: &LedgerState) -> Result<(), LedgerError> {
        let path = self.path(LEDGER_FILE);
        // Compact: the ledger is rewritten at every container creation;
        // `devgate status` is the view for people.
        let mut text = serde_json::to_vec(state).map_err(|e| LedgerError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        fsutil::replace_file(&path, &text).map_err(LedgerError::from)
    }
}

impl Txn<'_> {
    /// Writes the state and releases the lock.
    pub fn commit(self) -> Result<(), LedgerError> {
        self.store.write_atomic(&self.state)
    }
}
