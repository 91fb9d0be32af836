//! `health.json`: the ledger's protocol (`src/ledger/store.rs`) for a second document.
//! Writers take an exclusive `flock` on `health.lock`, then replace the file atomically
//! (temp, fsync, rename, fsync dir); readers need no lock. The default directory is
//! under /var/lib, not /run, so that a GPU that faulted stays out after a reboot.

use std::fs::{self, File};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::fcntl::Flock;

use crate::fsutil::{self, BoundedError, FileKey, WholeFile};

use super::{add_faults, Fault, HealthState, Transition};
use crate::gpu::GpuError;

const HEALTH_FILE: &str = "health.json";
const LOCK_FILE: &str = "health.lock";
const MAX_HEALTH_BYTES: u64 = 4 * 1024 * 1024;
/// Longest a kept version is taken on its descriptor's word alone before the
/// path is looked at again (see [`Cached::still_current`]).
const PATH_RECHECK: Duration = Duration::from_secs(1);

/// The health document under one directory. Creating it costs nothing: the directory
/// is made on the first write, so `devgate status` can read without side effects.
#[derive(Debug, Clone)]
pub struct HealthStore {
    dir: PathBuf,
    /// `dir`'s `health.json`, joined once.
    file: PathBuf,
    /// The last document read by [`HealthStore::current`], checked at every
    /// container creation: kept while the file is that version.
    cache: Arc<Mutex<Option<Cached>>>,
}

#[derive(Debug)]
struct Cached {
    key: FileKey,
    state: Arc<HealthState>,
    /// The version read, kept open so that its inode number stays its own,
    /// and so that it can be checked without a path walk.
    pin: File,
    /// The kept inode's change time when the path last led to it: a link
    /// added or removed (a replace unlinks it) changes it.
    ctime: (i64, i64),
    /// When the path last led to this version.
    seen_at_path: Instant,
}

impl Cached {
    /// Whether the kept version is still the document, seen through its
    /// descriptor alone: every write replaces the file, which unlinks the kept
    /// inode (`nlink` 0, a new change time), and an edit in place changes its
    /// key. What only the path shows (the file renamed away by hand and another
    /// put in its place), or a change within one tick of the change time's
    /// clock, is seen within [`PATH_RECHECK`].
    fn still_current(&self) -> bool {
        self.seen_at_path.elapsed() < PATH_RECHECK
            && self.pin.metadata().is_ok_and(|m| {
                m.nlink() > 0 && FileKey::of(&m) == self.key && ctime(&m) == self.ctime
            })
    }
}

fn ctime(meta: &fs::Metadata) -> (i64, i64) {
    (meta.ctime(), meta.ctime_nsec())
}

impl HealthStore {
    pub fn new(dir: &Path) -> HealthStore {
        HealthStore {
            dir: dir.to_path_buf(),
            file: dir.join(HEALTH_FILE),
            cache: Arc::new(Mutex::new(None)),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.file.clone()
    }

    /// The plugin's gate before a claim: fails for an unhealthy GPU. (A quarantined
    /// GPU is refused by `Ledger::claim`.)
    pub fn check(&self, uuid: &str) -> Result<(), GpuError> {
        match self.current()?.unhealthy(uuid) {
            None => Ok(()),
            Some(cond) => Err(GpuError::Unhealthy {
                uuid: uuid.to_string(),
                reason: cond.reason(),
            }),
        }
    }

    /// The current document for reading, as [`HealthStore::snapshot`], from
    /// the copy read last while the file is still that version: one `fstat`
    /// of the kept version (a `stat` of the path at most once a second, and
    /// while there is no file) instead of an open, a read and a parse at
    /// every container creation. Every write replaces the file (a new inode),
    /// so an equal key is the same document.
    pub fn current(&self) -> Result<Arc<HealthState>, GpuError> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cached) = cache.as_ref().filter(|c| c.still_current()) {
            return Ok(cached.state.clone());
        }
        let meta = match fs::metadata(&self.file) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                *cache = None;
                return Ok(Arc::default());
            }
            Err(source) => {
                return Err(GpuError::HealthIo {
                    path: self.path(),
                    source,
                })
            }
        };
        if let Some(cached) = cache.as_mut().filter(|c| c.key == FileKey::of(&meta)) {
            cached.ctime = ctime(&meta);
            cached.seen_at_path = Instant::now();
            return Ok(cached.state.clone());
        }
        let Some((state, read)) = self.read()? else {
            return Ok(Arc::default());
        };
        let state = Arc::new(state);
        if let Some((meta, pin)) = read {
            let cached = Cached {
                key: FileKey::of(&meta),
                ctime: ctime(&meta),
                state: state.clone(),
                pin,
                seen_at_path: Instant::now(),
            };
            *cache = Some(cached);
        }
        Ok(state)
    }

    /// The current document; a missing file is an empty one.
    pub fn snapshot(&self) -> Result<HealthState, GpuError> {
        Ok(self.read()?.map(|(state, _)| state).unwrap_or_default())
    }

    /// Reads and parses the file: `None` when there is none, else the document
    /// and, when it was read whole at the size `fstat` saw, that version's
    /// metadata and open file.
    #[allow(clippy::type_complexity)]
    fn read(&self) -> Result<Option<(HealthState, Option<(fs::Metadata, File)>)>, GpuError> {
        let path = self.path();
        let WholeFile { file, meta, bytes } =
            match fsutil::read_whole_bounded(&path, MAX_HEALTH_BYTES) {
                Ok(whole) => whole,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(BoundedError::Io(source)) => return Err(GpuError::HealthIo { path, source }),
                Err(e @ BoundedError::TooLarge { .. }) => {
                    return Err(GpuError::HealthCorrupt {
                        path,
                        reason: e.to_string(),
                    })
                }
            };
        let state = serde_json::from_slice(&bytes).map_err(|e| GpuError::HealthCorrupt {
            path,
            reason: e.to_string(),
        })?;
        let whole = bytes.len() as u64 == meta.len();
        Ok(Some((state, whole.then_some((meta, file)))))
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

    /// Writes an empty document where there is none, so that
    /// [`HealthStore::current`] has a version to keep and check through its
    /// descriptor from the first container on. For the plugin, at start.
    pub fn create_if_absent(&self) -> Result<(), GpuError> {
        self.create_dir()?;
        let _lock = self.lock()?;
        match fs::symlink_metadata(&self.file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.write_atomic(&HealthState::default())
            }
            Err(source) => Err(GpuError::HealthIo {
                path: self.path(),
                source,
            }),
            Ok(_) => Ok(()),
        }
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
        let mut text = serde_json::to_vec_pretty(state).map_err(|e| GpuError::HealthCorrupt {
            path: self.path(),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        fsutil::replace_file(&self.file, &text).map_err(health_io)
    }
}

fn health_io(e: fsutil::FsError) -> GpuError {
    GpuError::HealthIo {
        path: e.path,
        source: e.source,
    }
}
