//! Releases of pods that hold a device, one after another.
//!
//! A shared GPU's teardown checks for outside users and resets the GPU only
//! when the releasing pod is its last holder, read from the ledger. Two pods
//! sharing a GPU and released at once (a node drain; two poststop hooks in
//! hooks-only mode, each its own process) would each see the other still
//! holding it until the other's commit, so neither would reset it and the
//! next pod would get the GPU as they left it. Two releases of one pod (its
//! StopPodSandbox and its RemovePodSandbox, a Synchronize, the retry) would
//! both tear it down, and the later one could reset a GPU that a new pod took
//! once the earlier one committed. A release therefore holds an exclusive
//! `flock` on each device of its pods from before the teardown reads the
//! holders until the commit that drops the claims; the second release then
//! finds itself the last holder, or the pod gone. Pods with no device in
//! common still release in parallel.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::Flock;

use super::{LedgerError, PodRecord};
use crate::fsutil;

/// The directory, under the state directory, of the per-device lock files.
const LOCK_DIR: &str = "release-locks";
/// Longer names are cut: a device id is a UUID or a PCI address.
const MAX_NAME: usize = 100;

/// Held locks; dropping the value unlocks them.
#[derive(Debug)]
pub struct DeviceLocks {
    _held: Vec<Flock<File>>,
}

/// The lock file name of a device: its display form with anything outside
/// `[A-Za-z0-9.:-]` replaced, so no name leaves the lock directory.
fn file_name(device: &str) -> String {
    let safe: String = device
        .chars()
        .take(MAX_NAME)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | ':' | '-' => c,
            _ => '_',
        })
        .collect();
    format!("{safe}.lock")
}

/// Locks every device `pods` hold, in name order so that two releases never
/// wait on each other crosswise.
pub(super) fn lock_claimed(
    state_dir: &Path,
    pods: &[PodRecord],
) -> Result<DeviceLocks, LedgerError> {
    let devices = pods.iter().flat_map(|p| &p.claims).map(|c| &c.device);
    lock_devices(state_dir, devices)
}

/// The lock files of `devices`, in name order, their directory made; none
/// (and no directory) for no device.
pub(super) fn lock_paths<'d>(
    state_dir: &Path,
    devices: impl Iterator<Item = &'d super::DeviceId>,
) -> Result<Vec<PathBuf>, LedgerError> {
    let names: BTreeSet<String> = devices.map(|d| file_name(&d.to_string())).collect();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let dir = state_dir.join(LOCK_DIR);
    create_dir(&dir)?;
    Ok(names.iter().map(|name| dir.join(name)).collect())
}

/// Locks `devices`, in name order.
pub(super) fn lock_devices<'d>(
    state_dir: &Path,
    devices: impl Iterator<Item = &'d super::DeviceId>,
) -> Result<DeviceLocks, LedgerError> {
    let held = lock_paths(state_dir, devices)?
        .iter()
        .map(|path| fsutil::lock_exclusive(path).map_err(LedgerError::from))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(DeviceLocks { _held: held })
}

/// [`lock_devices`] without waiting: `None` (nothing held) while any of
/// them is held by another.
pub(super) fn try_lock_devices<'d>(
    state_dir: &Path,
    devices: impl Iterator<Item = &'d super::DeviceId>,
) -> Result<Option<DeviceLocks>, LedgerError> {
    let mut held = Vec::new();
    for path in lock_paths(state_dir, devices)? {
        match fsutil::try_lock_exclusive(&path)? {
            Some(lock) => held.push(lock),
            None => return Ok(None),
        }
    }
    Ok(Some(DeviceLocks { _held: held }))
}

/// Whether a release of a pod holding any of `claims` runs now (a device's
/// lock taken): asked without waiting.
pub(super) fn any_releasing(
    state_dir: &Path,
    claims: &[super::Claim],
) -> Result<bool, LedgerError> {
    let dir = state_dir.join(LOCK_DIR);
    for claim in claims {
        if locked_now(&dir, &claim.device)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The first device of `claims` held as a share whose release is running
/// now (its lock taken): a pod that joined it would have its processes seen
/// by that teardown, or its GPU reset under it. Asked without waiting, under
/// the ledger lock, which a release takes only after its device locks.
pub(super) fn first_releasing(
    state_dir: &Path,
    claims: &[super::Claim],
) -> Result<Option<super::DeviceId>, LedgerError> {
    let dir = state_dir.join(LOCK_DIR);
    for claim in claims {
        // An exclusive device's releasing holder still holds it.
        let shared = matches!(claim.share, super::Share::Shared { .. });
        if shared && locked_now(&dir, &claim.device)? {
            return Ok(Some(claim.device.clone()));
        }
    }
    Ok(None)
}

/// Whether `device`'s release lock in `dir` is taken, tried without waiting.
fn locked_now(dir: &Path, device: &super::DeviceId) -> Result<bool, LedgerError> {
    let path = dir.join(file_name(&device.to_string()));
    let file = match File::open(&path) {
        Ok(f) => f,
        // Never released on this node: no lock file, no release running.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(LedgerError::Io { path, source }),
    };
    // Shared: a release holds its turn exclusively, and two probes at once
    // must not each take the other for a release (flock(2)).
    match Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock) {
        Ok(_unlocked_on_drop) => Ok(false),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(true),
        Err((_, errno)) => Err(LedgerError::Io {
            path,
            source: errno.into(),
        }),
    }
}

fn create_dir(dir: &Path) -> Result<(), LedgerError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| LedgerError::Io {
            path: dir.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_file_names_stay_in_the_directory() {
        for (device, want) in [
            ("gpu GPU-1f2e-3d", "gpu_GPU-1f2e-3d.lock"),
            ("pf 0000:3b:00.0", "pf_0000:3b:00.0.lock"),
            ("gpu ../../etc/x", "gpu_.._.._etc_x.lock"),
            ("gpu a\0b/c", "gpu_a_b_c.lock"),
        ] {
            assert_eq!(file_name(device), want);
        }
        assert_eq!(file_name(&"x".repeat(500)).len(), MAX_NAME + 5);
    }

    /// A probe running in another process reads as no release; a release's
    /// turn reads as one.
    #[test]
    fn a_probe_is_not_taken_for_a_release() {
        let state = tempfile::tempdir().unwrap();
        let device = super::super::DeviceId::Gpu("GPU-1".into());
        let dir = state.path().join(LOCK_DIR);
        assert!(!locked_now(&dir, &device).unwrap(), "no lock file yet");
        let turn = lock_devices(state.path(), std::iter::once(&device)).unwrap();
        assert!(locked_now(&dir, &device).unwrap());
        drop(turn);
        let path = dir.join(file_name(&device.to_string()));
        let other = File::open(&path).unwrap();
        let _probe = Flock::lock(other, nix::fcntl::FlockArg::LockSharedNonblock).unwrap();
        assert!(!locked_now(&dir, &device).unwrap());
    }
}
