//! `health.json`: the ledger's protocol (`src/ledger/store.rs`) for a second document.
//! Writers take an exclusive `flock` on `health.lock`, then replace the file atomically
//! (temp, fsync, rename, fsync dir); readers need no lock. The default directory is
//! under /var/lib, not /run, so that a GPU that faulted stays out after a reboot.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use super::{add_faults, Fault, HealthState, Transition};
use crate::gpu::GpuError;

const HEALTH_FILE: &str = "health.json";
const LOCK_FILE: &str = "health.lock";
const MAX_HEALTH_BYTES: u64 = 4 * 1024 * 1024;

/// The health document under one directory. Creating it costs nothing: the directory
/// is made on the first write, so `devgate status` can read without side effects.
#[derive(Debug, Clone)]
pub struct HealthStore {
    dir: PathBuf,
}

impl HealthStore {
    pub fn new(dir: &Path) -> HealthStore {
        HealthStore {
            dir: dir.to_path_buf(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(HEALTH_FILE)
    }

    /// The plugin's gate before a claim: fails for an unhealthy GPU. (A quarantined
    /// GPU is refused by `Ledger::claim`.)
    pub fn check(&self, uuid: &str) -> Result<(), GpuError> {
        match self.snapshot()?.unhealthy(uuid) {
            None => Ok(()),
            Some(cond) => Err(GpuError::Unhealthy {
                uuid: uuid.to_string(),
                reason: cond.reason(),
            }),
        }
    }

    /// The current document; a missing file is an empty one.
    pub fn snapshot(&self) -> Result<HealthState, GpuError> {
        let path = self.path();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HealthState::default()),
            Err(source) => return Err(GpuError::HealthIo { path, source }),
        };
        let mut text = String::new();
        file.take(MAX_HEALTH_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|source| GpuError::HealthIo {
                path: path.clone(),
                source,
            })?;
        if text.len() as u64 > MAX_HEALTH_BYTES {
            return Err(GpuError::HealthCorrupt {
                path,
                reason: "larger than 4 MiB".to_string(),
            });
        }
        serde_json::from_str(&text).map_err(|e| GpuError::HealthCorrupt {
            path,
            reason: e.to_string(),
        })
    }

    /// Read-modify-write under the lock; the file is rewritten only when `f` changed it.
    pub fn update<T>(&self, f: impl FnOnce(&mut HealthState) -> T) -> Result<T, GpuError> {
        self.create_dir()?;
        let _lock = self.lock()?;
        let before = self.snapshot()?;
        let mut state = before.clone();
        let out = f(&mut state);
        if state != before {
            self.write_atomic(&state)?;
        }
        Ok(out)
    }

    /// Marks a GPU unhealthy now.
    pub fn mark(
        &self,
        uuid: &str,
        faults: &[Fault],
        now: u64,
    ) -> Result<Option<Transition>, GpuError> {
        self.update(|state| {
            let entry = state.gpus.entry(uuid.to_string()).or_default();
            add_faults(uuid, entry, faults, now)
        })
    }

    /// Returns a GPU to service by hand; `true` when it was unhealthy.
    pub fn clear(&self, uuid: &str) -> Result<bool, GpuError> {
        self.update(|state| {
            let entry = state.gpus.get_mut(uuid);
            entry.is_some_and(|g| {
                g.clean_checks = 0;
                g.unhealthy.take().is_some()
            })
        })
    }

    fn io(&self, path: PathBuf) -> impl FnOnce(std::io::Error) -> GpuError {
        move |source| GpuError::HealthIo { path, source }
    }

    fn create_dir(&self) -> Result<(), GpuError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(self.io(self.dir.clone()))
    }

    fn lock(&self) -> Result<Flock<File>, GpuError> {
        let path = self.dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(self.io(path.clone()))?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| GpuError::HealthIo {
            path,
            source: errno.into(),
        })
    }

    fn write_atomic(&self, state: &HealthState) -> Result<(), GpuError> {
        let tmp = self.dir.join(format!("{HEALTH_FILE}.tmp"));
        let mut text = serde_json::to_vec_pretty(state).map_err(|e| GpuError::HealthCorrupt {
            path: tmp.clone(),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(self.io(tmp.clone()))?;
        file.write_all(&text).map_err(self.io(tmp.clone()))?;
        file.sync_all().map_err(self.io(tmp.clone()))?;
        fs::rename(&tmp, self.path()).map_err(self.io(self.path()))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(self.io(self.dir.clone()))
    }
}
