//! `health.json`: the ledger's protocol (`src/ledger/store.rs`) for a second document.
//! Writers take an exclusive `flock` on `health.lock`, then replace the file atomically
//! (temp, fsync, rename, fsync dir); readers need no lock. The default directory is
//! under /var/lib, not /run, so that a GPU that faulted stays out after a reboot.

use std::fs::{self, File};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::fcntl::Flock;

use crate::fsutil::{self, BoundedError};

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
        let text = match fsutil::read_file_bounded(&path, MAX_HEALTH_BYTES) {
            Ok(text) => text,
            Err(e) if e.is_not_found() => return Ok(HealthState::default()),
            Err(BoundedError::Io(source)) => return Err(GpuError::HealthIo { path, source }),
            Err(e @ BoundedError::TooLarge { .. }) => {
                return Err(GpuError::HealthCorrupt {
                    path,
                    reason: e.to_string(),
                })
            }
        };
        serde_json::from_slice(&text).map_err(|e| GpuError::HealthCorrupt {
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
        fsutil::lock_exclusive(&self.dir.join(LOCK_FILE)).map_err(health_io)
    }

    fn write_atomic(&self, state: &HealthState) -> Result<(), GpuError> {
        let path = self.path();
        let mut text = serde_json::to_vec_pretty(state).map_err(|e| GpuError::HealthCorrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        fsutil::replace_file(&path, &text).map_err(health_io)
    }
}

fn health_io(e: fsutil::FsError) -> GpuError {
    GpuError::HealthIo {
        path: e.path,
        source: e.source,
    }
}
