//! Why a ledger operation failed: each variant names the file, device or pod.

use std::path::PathBuf;

use super::DeviceId;

impl From<crate::fsutil::FsError> for LedgerError {
    fn from(e: crate::fsutil::FsError) -> LedgerError {
        LedgerError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("ledger {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// Written, the document could not be read back: the change is refused,
    /// not the whole ledger from then on.
    #[error("the node's ledger {path} is full: this change would make it {size} bytes, over the {limit} it is read up to (devgate status lists the pods holding devices)")]
    Full {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("ledger {path} is of version {version}, newer than this release reads ({known}): run the release that wrote it")]
    Newer {
        path: PathBuf,
        version: u32,
        known: u32,
    },
    /// `holder` as people read it.
    #[error("{device} is held by pod {holder}")]
    Held { device: DeviceId, holder: String },
    #[error("{device} is quarantined: {reason}")]
    Quarantined { device: DeviceId, reason: String },
    #[error(
        "{device} share over 100%: core {core}%, memory {memory_ratio}% with existing holders"
    )]
    Overcommitted {
        device: DeviceId,
        core: u32,
        memory_ratio: u32,
    },
    /// A PF used whole and a VF of it, held by two pods.
    #[error("{device} conflicts with {other}, held by pod {holder}: a pf used whole excludes its vfs from other pods")]
    HeldWithPf {
        device: DeviceId,
        other: DeviceId,
        holder: String,
    },
    /// `device`: the first that differs; `held`: the pod holds it and the
    /// container does not ask it, else the other way round.
    #[error("pod {pod} already holds a different set of devices: {device} {}", held_word(*.held))]
    ClaimMismatch {
        pod: String,
        device: DeviceId,
        held: bool,
    },
    /// The pod's earlier release kept these (its teardown could not clean
    /// them) and gave the others back: its containers get devices again once
    /// a retry of that teardown succeeds.
    #[error("pod {pod} holds only {devices:?} (quarantined: {reason}): a release whose teardown could not clean them gave its other devices back; it is admitted again once a retry cleans them")]
    ReleaseFailed {
        pod: String,
        devices: Vec<String>,
        reason: String,
    },
    /// Each device is claimed once: two claims of one device would count
    /// its shares twice or make one pod two holders of an exclusive device.
    #[error("{device} is claimed twice by one pod")]
    DuplicateClaim { device: DeviceId },
    #[error("{device} is being released: the teardown of a pod that held it is running")]
    Releasing { device: DeviceId },
    /// The container was planned with the pod's VFs in its netns, moved there
    /// by its network owner, and the owner gave them back to the host before
    /// the admission: admitted, it would start without them.
    #[error("pod {pod} gave its vfs back to the host while this container was planned: the next try moves them in")]
    NetworkReturned { pod: String },
}

fn held_word(held: bool) -> &'static str {
    match held {
        true => "is among them and not asked now",
        false => "is asked and not among them (a device renumbered since the pod's claim, or its annotation changed)",
    }
}
