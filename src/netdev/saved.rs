//! Saved VF state: what a VF looked like before devgate touched it, written
//! before the first change and removed only after a full restore. One JSON file
//! per VF (`<state-dir>/vf/<bdf>.json`), replaced atomically (temp, fsync,
//! rename, fsync dir) as the ledger does, under a per-VF `flock` so the hook
//! and the plugin never work on the same VF at once (sriov-cni's per-BDF lock,
//! commit d5232e68).

use std::fs::{self, File};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::fcntl::Flock;
use serde::{Deserialize, Serialize};

use super::netns::NetnsId;
use super::settings::{HwAddr, VfAttach};
use super::vfinfo::VfState;
use crate::fsutil::{self, BoundedError};
use crate::inventory::PciAddr;

pub const SAVED_VERSION: u32 = 1;
const DIR: &str = "vf";
/// A record is a few hundred bytes; anything this large is not one of ours.
const MAX_RECORD_BYTES: u64 = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SavedError {
    #[error("vf state {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("vf state {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// The VF netdev as it was on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedLink {
    pub name: String,
    pub index: u32,
    pub mac: Option<HwAddr>,
    pub mtu: u32,
    pub up: bool,
    /// PCI address the kernel reports as the netdev's parent; identifies the VF
    /// wherever it is and whatever its name.
    pub parent: Option<String>,
    /// Its alternative names on the host (udev's `enp…` names). A name a pod
    /// adds in its netns comes home with the VF (the kernel moves altnames
    /// with their device) and could clash with a host name there: restore
    /// drops every other. `None` in records written before they were saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub altnames: Option<Vec<String>>,
}

/// Where the VF went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedNetns {
    pub id: NetnsId,
    /// A path that named the namespace at attach time, when one was known.
    pub path: Option<PathBuf>,
}

fn attach_as_saved<S: serde::Serializer>(a: &VfAttach, s: S) -> Result<S::Ok, S::Error> {
    a.saved_form().serialize(s)
}

/// Everything needed to put a VF back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedVf {
    pub version: u32,
    pub container_id: String,
    /// Written without `rdma_chars` (see [`VfAttach::saved_form`]).
    #[serde(serialize_with = "attach_as_saved")]
    pub attach: VfAttach,
    pub netns: SavedNetns,
    pub host: SavedLink,
    /// The PF's admin view of the VF; `None` when the PF is not on this host.
    pub pf: Option<VfState>,
    /// The PF's ifindex when `pf` was read.
    pub pf_index: Option<u32>,
    /// The PF's PCI address (its link's parent) when `pf` was read: finds the
    /// PF again where its ifindex is gone (a driver reload) and its name may
    /// since belong to another PF. Absent in records written before it, and
    /// where neither rtnetlink nor ethtool named the PF's device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf_parent: Option<String>,
    /// The RDMA device's index, with `attach.move_rdma`, read on the host
    /// before the move. The device keeps it for its life, through renames
    /// and moves (`assign_name`: `xa_alloc_cyclic`), so the restore finds it
    /// by it: a pod allowed to rename its device, or a device of another
    /// name's making that took the old name, cannot mislead the restore.
    /// Absent in records written before it, which find the device by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_index: Option<u32>,
    pub saved_unix: u64,
    /// Set before a restore first touches the VF: from then on it may be
    /// down, its PF settings (the tenant VLAN) reset, and no longer whole in
    /// the pod, so no container of the pod is given it as it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restoring: bool,
    /// Set while the attach that saved the record is still at work, cleared
    /// once the VF is in the pod as planned. A record left with it (the
    /// runtime died during createRuntime, so no rollback and no poststop
    /// ran) may stand for a VF moved but not renamed, configured or up, or
    /// whose RDMA device stayed behind: no container of the pod is given it
    /// as it is. Absent, so false, in records written before it, whose
    /// attaches are taken as whole, as they were then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attaching: bool,
}

impl SavedVf {
    pub fn vf(&self) -> PciAddr {
        self.attach.vf_bus_id
    }

    /// Whether a run on the VF stopped part way (or runs now): an attach not
    /// finished, or a restore begun. Its VF may be anywhere between the
    /// host's state and the pod's.
    pub fn cut(&self) -> bool {
        self.restoring || self.attaching
    }
}

#[path = "saved_pod.rs"]
mod pod;

#[cfg(test)]
thread_local! {
    /// Fails this thread's next sync of the records' directory with EIO.
    pub(crate) static FAIL_NEXT_DIR_SYNC: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

#[cfg(test)]
impl SavedVf {
    /// A record of a veth stand-in with no PF, for tests.
    pub(crate) fn example(container: &str, bdf: &str) -> SavedVf {
        use super::netns::NetnsId;
        use super::settings::{VfAttach, VfSettings};
        SavedVf {
            version: SAVED_VERSION,
            container_id: container.to_string(),
            attach: VfAttach {
                pf_netdev: String::new(),
                vf_index: 0,
                vf_bus_id: bdf.parse().unwrap(),
                host_netdev: "veth0".to_string(),
                rdma_device: None,
                container_ifname: "net1".to_string(),
                settings: VfSettings::default(),
                move_rdma: false,
                rdma_chars: Vec::new(),
            },
            netns: SavedNetns {
                id: NetnsId {
                    dev: 4,
                    ino: 4026532000,
                },
                path: None,
            },
            host: SavedLink {
                name: "veth0".to_string(),
                index: 9,
                mac: "02:00:00:00:00:01".parse().ok(),
                mtu: 1500,
                up: false,
                parent: None,
                altnames: None,
            },
            pf: None,
            pf_index: None,
            pf_parent: None,
            rdma_index: None,
            saved_unix: 1,
            restoring: false,
            attaching: false,
        }
    }
}

/// The store under one state directory.
#[derive(Debug, Clone)]
pub struct SavedStore {
    dir: PathBuf,
}

/// Held while a VF is being attached or detached.
pub struct VfLock {
    _lock: Flock<File>,
}

impl SavedStore {
    /// Nothing is created until the first save or lock.
    pub fn new(state_dir: &Path) -> SavedStore {
        SavedStore {
            dir: state_dir.join(DIR),
        }
    }

    fn path(&self, vf: PciAddr, ext: &str) -> PathBuf {
        self.dir.join(format!("{vf}.{ext}"))
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SavedError + '_ {
        move |source| SavedError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    fn ensure_dir(&self) -> Result<(), SavedError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(Self::io(&self.dir))
    }

    /// Takes the VF's exclusive lock, waiting for a holder in another process.
    pub fn lock(&self, vf: PciAddr) -> Result<VfLock, SavedError> {
        self.ensure_dir()?;
        let lock = fsutil::lock_exclusive(&self.path(vf, "lock")).map_err(saved_io)?;
        Ok(VfLock { _lock: lock })
    }

    pub fn load(&self, vf: PciAddr) -> Result<Option<SavedVf>, SavedError> {
        read_record(&self.path(vf, "json"))
    }

    pub fn save(&self, rec: &SavedVf) -> Result<(), SavedError> {
        self.ensure_dir()?;
        let path = self.path(rec.vf(), "json");
        let mut text = serde_json::to_vec_pretty(rec).map_err(|e| SavedError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        text.push(b'\n');
        fsutil::replace_file(&path, &text).map_err(saved_io)
    }

    /// Drops a record; a missing one is fine. The record is gone once the
    /// unlink returns: a directory that then fails to sync (disk-backed
    /// state only) is warned about, as `fsutil::replace` does, not taken
    /// for a restore that failed, which would quarantine a VF that is home.
    pub fn remove(&self, vf: PciAddr) -> Result<(), SavedError> {
        let path = self.path(vf, "json");
        match fs::remove_file(&path) {
            Ok(()) => {
                if let Err(e) = self.sync_dir() {
                    tracing::warn!(path = %path.display(), error = %nri::ErrorChain(&e), "vf record removed, but its directory did not sync");
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(SavedError::Io { path, source }),
        }
    }

    fn sync_dir(&self) -> Result<(), SavedError> {
        #[cfg(test)]
        if FAIL_NEXT_DIR_SYNC.take() {
            return Err(SavedError::Io {
                path: self.dir.clone(),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        fsutil::sync_dir(&self.dir).map_err(saved_io)
    }

    /// Whether `vf` has a record (readable or not): something moved it, or
    /// is moving it.
    pub fn has_record(&self, vf: PciAddr) -> bool {
        self.path(vf, "json").exists()
    }

    /// The record files, in name order. A missing directory means none.
    fn paths(&self) -> Result<Vec<PathBuf>, SavedError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(SavedError::Io {
                    path: self.dir.clone(),
                    source,
                })
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        Ok(paths)
    }

    /// Every record, in file-name order; any unreadable record is an error.
    pub fn all(&self) -> Result<Vec<SavedVf>, SavedError> {
        let mut out = Vec::new();
        for p in self.paths()? {
            if let Some(rec) = read_record(&p)? {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// Every readable record, in file-name order, and the errors of those
    /// that could not be read; an error only when the directory cannot be
    /// listed.
    pub fn readable(&self) -> Result<(Vec<SavedVf>, Vec<SavedError>), SavedError> {
        let (mut records, mut unreadable) = (Vec::new(), Vec::new());
        for p in self.paths()? {
            match read_record(&p) {
                Ok(Some(rec)) => records.push(rec),
                Ok(None) => {}
                Err(e) => unreadable.push(e),
            }
        }
        Ok((records, unreadable))
    }

    /// The records of one container, and the record files that could not be
    /// read, whose container is therefore unknown. An error only when the
    /// directory cannot be listed.
    pub fn scan_container(&self, container_id: &str) -> Result<ContainerScan, SavedError> {
        let mut scan = ContainerScan::default();
        for p in self.paths()? {
            match read_record(&p) {
                Ok(Some(rec)) if rec.container_id == container_id => scan.records.push(rec),
                Ok(_) => {}
                Err(e) => scan.unreadable.push(e),
            }
        }
        Ok(scan)
    }

    /// The records of one container. A record file that cannot be read (one
    /// written by another release of devgate, or edited by hand) is logged and
    /// skipped rather than failing every container's poststop on the node: it
    /// names its VF, and every later use of that VF (an attach, the per-VF
    /// restore at the pod's release) reads it again and fails on it there.
    pub fn for_container(&self, container_id: &str) -> Result<Vec<SavedVf>, SavedError> {
        let scan = self.scan_container(container_id)?;
        for e in &scan.unreadable {
            tracing::error!(container = %container_id, error = %nri::ErrorChain(e), "saved vf record skipped");
        }
        Ok(scan.records)
    }

    /// The VFs of [`SavedStore::for_container`]'s records: what
    /// [`super::detach_listed`] restores for the container.
    pub fn vfs_of(&self, container_id: &str) -> Result<Vec<PciAddr>, SavedError> {
        let records = self.for_container(container_id)?;
        Ok(records.iter().map(SavedVf::vf).collect())
    }
}

/// What [`SavedStore::scan_container`] found.
#[derive(Debug, Default)]
pub struct ContainerScan {
    pub records: Vec<SavedVf>,
    pub unreadable: Vec<SavedError>,
}

fn read_record(path: &Path) -> Result<Option<SavedVf>, SavedError> {
    let corrupt = |reason: String| SavedError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let text = match fsutil::read_file_bounded(path, MAX_RECORD_BYTES) {
        Ok(text) => text,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(BoundedError::Io(source)) => return Err(SavedStore::io(path)(source)),
        Err(e @ BoundedError::TooLarge { .. }) => return Err(corrupt(e.to_string())),
    };
    let rec: SavedVf = serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
    if rec.version != SAVED_VERSION {
        return Err(corrupt(format!(
            "version {} (want {SAVED_VERSION})",
            rec.version
        )));
    }
    Ok(Some(rec))
}

fn saved_io(e: fsutil::FsError) -> SavedError {
    SavedError::Io {
        path: e.path,
        source: e.source,
    }
}
