//! VF restore when a pod is released: the same code as the hook's poststop, for
//! VFs whose poststop never ran (runtime crash, hook killed, netns already gone).
//! Detach is idempotent, so VFs the hook already restored cost one file lookup.

use std::path::{Path, PathBuf};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::Duration;

use super::in_flight::InFlight;
use super::lifecycle::Release;

use crate::inventory::PciAddr;
use crate::ledger::{DeviceId, Ledger, PodRecord, Teardown, Unclean};
use crate::netdev::{self, NetnsRoots, SavedStore, SavedVf, SysNetEnv, VfOps};

#[derive(Clone)]
pub struct VfTeardown {
    store: SavedStore,
    state_dir: PathBuf,
    /// `<host-root>/sys`, where a VF's RDMA device made anew shows.
    sys_root: PathBuf,
}

impl VfTeardown {
    pub fn new(state_dir: PathBuf, host_root: &Path) -> VfTeardown {
        VfTeardown {
            store: SavedStore::new(&state_dir),
            state_dir,
            sys_root: host_root.join("sys"),
        }
    }

    /// Where the saved VF records are.
    pub(super) fn store(&self) -> &SavedStore {
        &self.store
    }

    /// The state directory, the ledger's and the records'.
    pub(super) fn state_dir(&self) -> &std::path::Path {
        &self.state_dir
    }

    /// Whether a VF of `pod` has a saved record: something moved it.
    fn any_moved(&self, pod: &PodRecord) -> Result<bool, String> {
        for vf in pod.vfs() {
            let _lock = self.store.lock(vf).map_err(|e| e.to_string())?;
            if self.store.has_record(vf) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn detach(&self, pod: &PodRecord) -> Result<(), Unclean> {
        let vfs: Vec<PciAddr> = pod.vfs().collect();
        if vfs.is_empty() {
            return Ok(());
        }
        // The record is this pod's unless another pod's container holds it:
        // one released meanwhile by another release, its VF claimed and moved
        // again. Asked under the VF's lock, after the record is read: the
        // ledger records a container before its hook saves a VF.
        let sandbox = pod.pod.sandbox_id.as_str();
        // With the ledger unreadable the record may be another pod's: the
        // VF is kept (and retried), never pulled out of a pod that holds it.
        let ours = |rec: &SavedVf| match Ledger::read(&self.state_dir) {
            Ok(state) => Ok(state
                .pod_of(&rec.container_id)
                .is_none_or(|p| p.pod.sandbox_id == sandbox)),
            Err(e) => Err(netdev::Cause::HolderUnknown {
                container: rec.container_id.clone(),
                reason: nri::ErrorChain(&e).to_string(),
            }),
        };
        let outcomes = self
            .restore_each(&vfs, &ours)
            .map_err(|e| vfs_unclean(pod, e))?;
        // Each VF is restored on its own: one that fails is kept (and
        // quarantined) without keeping the others.
        outcomes
            .into_iter()
            .filter_map(|(vf, outcome)| {
                let e = outcome.err()?;
                Some(Unclean::of(
                    [DeviceId::Vf(vf)],
                    nri::ErrorChain(&e).to_string(),
                ))
            })
            .reduce(Unclean::and)
            .map_or(Ok(()), Err)
    }

    /// Restores each of `vfs` whose record `ours` accepts (asked under the
    /// VF's lock), on the calling thread, which it may move
    /// between namespaces while it runs: whether each had such a record to
    /// restore, or why it failed. An error when the namespaces cannot be
    /// worked with at all.
    pub(super) fn restore_each(
        &self,
        vfs: &[PciAddr],
        ours: &dyn Fn(&SavedVf) -> Result<bool, netdev::Cause>,
    ) -> Result<Vec<Restored>, String> {
        let mut env = SysNetEnv::new(NetnsRoots::default())
            .map_err(|e| nri::ErrorChain(&e).to_string())?
            .with_sys_root(self.sys_root.clone());
        let mut ops = VfOps {
            env: &mut env,
            store: &self.store,
            checkpoint: &|_| {},
        };
        Ok(vfs
            .iter()
            .map(|&vf| (vf, netdev::detach_vf(&mut ops, vf, ours)))
            .collect())
    }
}

impl VfTeardown {
    /// Restores, before the runtime hears back from StopPodSandbox, the VFs
    /// of the pod that are still in its network namespace: its network
    /// owner's poststop left them to a container of the pod that ran on, or
    /// never ran. containerd tears the pod's network down and removes the
    /// namespace once its NRI plugins have answered StopPodSandbox
    /// (`stopPodSandbox`: containers, sandbox task, NRI, then CNI and the
    /// netns); a VF still in it then comes home only when the kernel's
    /// namespace cleanup gets to it (`default_device_exit_net`, run from a
    /// workqueue), under its pod name, or not at all where a driver loses it
    /// (sriov-cni #349). The pod's release, which runs after the reply, finds
    /// them restored; a failure here is left to it, which keeps the VF and
    /// retries. The restore counts among `releases` (an admission waiting for
    /// the pod's devices waits for it too); where one of the pod already runs
    /// (a stop the runtime retries), the answer waits for that instead.
    ///
    /// Either wait ends after `wait` (the [`super::budget::Waits`] of the
    /// runtime's request timeout, which cuts off a plugin that misses it): a
    /// restore still running then (a VF's lock held by a hook that hangs)
    /// goes on without the reply, and the release after it waits for the
    /// same locks.
    pub(super) fn restore_before_stop(
        &self,
        ledger: &Ledger,
        sandbox_id: &str,
        releases: &Arc<InFlight>,
        wait: Duration,
    ) {
        if releases.releasing(sandbox_id) {
            if !releases.wait_released(sandbox_id, wait) {
                tracing::warn!(sandbox = %sandbox_id, "the pod's release still runs at its stop: answered without it");
            }
            return;
        }
        // Looked at without the VFs' locks, which a hook that hangs may
        // hold: at the pod's stop none of its hooks moves a VF in (its
        // containers have stopped, and the runtime admits none into a
        // stopping sandbox), and a restore under way keeps its record until
        // it ends. So with no record there is nothing to wait for, which is
        // every pod whose poststop gave its VFs back.
        let pod = match ledger.pod(sandbox_id) {
            Ok(Some(pod)) if pod.vfs().any(|vf| self.store.has_record(vf)) => pod,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(sandbox = %sandbox_id, error = %nri::ErrorChain(&e), "ledger unreadable: the pod's vfs are left to its release");
                return;
            }
        };
        let running = releases.enter(&Release::Pod(sandbox_id.to_string()));
        let (done, finished) = std::sync::mpsc::sync_channel(1);
        let vfs = self.clone();
        let name = pod.pod.name.clone();
        let spawned = std::thread::Builder::new()
            .name("vf-stop".into())
            .spawn(move || {
                let _running = running;
                let _ = done.send(vfs.teardown(&pod));
            });
        if let Err(e) = spawned {
            tracing::warn!(sandbox = %sandbox_id, error = %e, "no thread for the vf restore at the pod's stop: its release makes it");
            return;
        }
        match finished.recv_timeout(wait) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(sandbox = %sandbox_id, pod = %name, reason = %e.reason, "vf restore at the pod's stop failed: its release retries it");
            }
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(sandbox = %sandbox_id, pod = %name, wait_ms = wait.as_millis() as u64, "vf restore at the pod's stop still runs: answered without it");
            }
            Err(RecvTimeoutError::Disconnected) => {
                tracing::error!(sandbox = %sandbox_id, pod = %name, "vf restore at the pod's stop ended without an outcome: its release makes it");
            }
        }
    }
}

/// A VF and whether it had a record to restore, or why its restore failed.
pub(super) type Restored = (PciAddr, Result<bool, netdev::VfError>);

/// A failure of the VF teardown itself (a VF's lock, the namespace handle,
/// its thread): the pod's VFs are in doubt, not its GPUs, whose teardown is
/// another's and may have run clean (`Unclean`: one device's failure keeps
/// no other out of service).
fn vfs_unclean(pod: &PodRecord, reason: impl Into<String>) -> Unclean {
    Unclean::of(pod.vfs().map(DeviceId::Vf), reason)
}

impl Teardown for VfTeardown {
    fn teardown(&self, pod: &PodRecord) -> Result<(), Unclean> {
        // A VF with no saved record is on the host: its hook restored it or
        // never moved it, which is every VF of a pod whose poststop ran. Each
        // is asked under its lock, as detach asks, so a hook moving it now
        // has saved its record (it saves before it moves) or waits for us.
        if !self.any_moved(pod).map_err(|e| vfs_unclean(pod, e))? {
            return Ok(());
        }
        // setns is per thread: detach enters pod namespaces, so it gets a thread
        // of its own and the caller's namespace never changes.
        std::thread::scope(|s| {
            s.spawn(|| self.detach(pod))
                .join()
                .unwrap_or_else(|_| Err(vfs_unclean(pod, "vf teardown thread panicked")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Claim, ContainerRecord, PodRef, Share};
    use crate::netdev::SavedVf;

    const VF: &str = "0000:ee:09.1";

    fn pod_ref(name: &str) -> PodRef {
        PodRef {
            sandbox_id: format!("sb-{name}"),
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn vf_claim() -> Claim {
        Claim {
            device: DeviceId::Vf(VF.parse().unwrap()),
            share: Share::Exclusive,
            pf: None,
        }
    }

    /// Pod p0, which held the VF, as the ledger recorded it.
    fn p0() -> PodRecord {
        PodRecord {
            pod: pod_ref("p0"),
            claims: vec![vf_claim()],
            claimed_unix: 1,
            containers: Default::default(),
            network_owner: None,
            admitted: 0,
        }
    }

    /// Pod q holds the VF now, its container q1 has it moved in (its record
    /// saved); a late teardown of p0, which held it before, runs.
    /// What it returned, and the VF's record after: `Some(restoring)`.
    fn late_teardown(record_of: &str) -> (Result<(), Unclean>, Option<bool>) {
        late_teardown_with(record_of, |_| {})
    }

    /// [`late_teardown`], `meanwhile` done to the state directory before the
    /// teardown runs.
    fn late_teardown_with(
        record_of: &str,
        meanwhile: impl FnOnce(&Path),
    ) -> (Result<(), Unclean>, Option<bool>) {
        let dir = tempfile::tempdir().unwrap();
        let record = ContainerRecord {
            name: "main".into(),
            devices: Vec::new(),
            applied_unix: 1,
            init: None,
            cgroups: Vec::new(),
            resolved: None,
            resolved_sha256: None,
            hooks_only: false,
        };
        let ledger = Ledger::open(dir.path()).unwrap();
        ledger
            .admit(&pod_ref("q"), &[vf_claim()], "q1", record, true)
            .unwrap();
        let store = SavedStore::new(dir.path());
        store.save(&SavedVf::example(record_of, VF)).unwrap();
        meanwhile(dir.path());
        let p0 = p0();
        let out = VfTeardown::new(dir.path().to_path_buf(), Path::new("/")).teardown(&p0);
        let record = store.load(VF.parse().unwrap()).unwrap();
        (out, record.map(|r| r.restoring))
    }

    /// A VF teardown that cannot run (here its VF's lock cannot be made)
    /// names the pod's VFs only: the GPU beside them is not kept for it.
    #[test]
    fn a_teardown_that_cannot_run_keeps_only_the_vfs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vf"), "not a directory").unwrap();
        let mut pod = p0();
        pod.claims.push(Claim {
            device: DeviceId::Gpu("GPU-1".into()),
            share: Share::Exclusive,
            pf: None,
        });
        let err = VfTeardown::new(dir.path().to_path_buf(), Path::new("/"))
            .teardown(&pod)
            .unwrap_err();
        let vf = DeviceId::Vf(VF.parse().unwrap());
        assert_eq!(err.devices, Some([vf].into()), "{}", err.reason);
        assert!(err.reason.contains("vf"), "{}", err.reason);
    }

    #[test]
    fn vfs_on_the_host_need_no_restore_and_a_moved_one_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let teardown = VfTeardown::new(dir.path().to_path_buf(), Path::new("/"));
        let p0 = p0();
        assert_eq!(teardown.any_moved(&p0), Ok(false));
        assert_eq!(teardown.teardown(&p0), Ok(()));
        SavedStore::new(dir.path())
            .save(&SavedVf::example("p0-main", VF))
            .unwrap();
        assert_eq!(teardown.any_moved(&p0), Ok(true));
    }

    /// A pod's stop waits for its VFs' restore so long and no longer: with
    /// a VF's lock held (a hook that hangs), it answers in time, the record
    /// kept for the restore that goes on and for the release.
    #[test]
    fn a_stop_answers_in_time_while_a_vf_lock_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        assert!(ledger.claim(&pod_ref("p0"), &[vf_claim()]).unwrap());
        let store = SavedStore::new(dir.path());
        store.save(&SavedVf::example("p0-main", VF)).unwrap();
        let vf = VF.parse().unwrap();
        let held = store.lock(vf).unwrap();
        let releases = Arc::new(InFlight::default());
        let teardown = VfTeardown::new(dir.path().to_path_buf(), Path::new("/"));
        // A runtime that waits 250 ms for an answer, not 2 s.
        let waits = super::super::budget::Waits::for_timeout(Duration::from_millis(250));
        let wait = waits.stop_restore;
        let began = std::time::Instant::now();
        teardown.restore_before_stop(&ledger, "sb-p0", &releases, wait);
        let took = began.elapsed();
        assert!(took >= wait, "it waited for the restore");
        let at_default =
            super::super::budget::Waits::for_timeout(super::super::budget::DEFAULT_REQUEST_TIMEOUT);
        assert!(took < at_default.stop_restore, "answered after {took:?}");
        assert!(store.load(vf).unwrap().is_some());
        assert!(releases.releasing("sb-p0"), "the restore still runs");
        // A stop the runtime sends again waits for that restore, and starts
        // no other.
        teardown.restore_before_stop(&ledger, "sb-p0", &releases, wait);
        assert!(began.elapsed() >= wait * 2);
        // Nothing left to restore once the lock is free: the thread ends.
        store.remove(vf).unwrap();
        drop(held);
        assert!(releases.wait_released("sb-p0", Duration::from_secs(10)));
    }

    #[test]
    fn a_vf_another_pod_holds_now_is_not_restored_for_the_old_one() {
        assert_eq!(late_teardown("q1"), (Ok(()), Some(false)));
        // A record of no other pod's container is the old pod's: restored
        // (here it fails, since the stand-in link does not exist).
        let (out, record) = late_teardown("p0-gone");
        assert_eq!(record, Some(true), "its restore began and is kept");
        // The failure names its VF, which the release keeps alone.
        let vf = DeviceId::Vf(VF.parse().unwrap());
        assert_eq!(out.unwrap_err().devices, Some([vf].into()));
    }

    /// With the ledger unreadable, whose the record is cannot be told: the
    /// VF is kept as it is (its record untouched, no restore begun) and the
    /// failure names it, instead of restoring it out of the pod that may
    /// hold it now.
    #[test]
    fn a_vf_whose_holder_cannot_be_told_is_kept() {
        let (out, record) = late_teardown_with("q1", |dir| {
            std::fs::write(dir.join("ledger.json"), b"{not json").unwrap();
        });
        assert_eq!(record, Some(false), "the record was left untouched");
        let err = out.unwrap_err();
        let vf = DeviceId::Vf(VF.parse().unwrap());
        assert_eq!(err.devices, Some([vf].into()));
        assert!(err.reason.contains("cannot be told"), "{}", err.reason);
    }
}
