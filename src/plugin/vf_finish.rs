//! Finishing a VF restore that began and stopped while its pod lives on.
//!
//! A restore marks the VF's record `restoring` before it first touches the VF
//! (down, its PF settings reset, then moved home). The network owner's
//! poststop killed by the runtime's hook timeout, or failing on the way,
//! leaves the VF in the pod half undone: no container may be given it as it
//! is, and no later one could move it, its netdev not being on the host. The
//! pod's release would finish the restore, but the pod lives on (its
//! container restarted), so the plugin finishes it when the pod's next
//! container asks for the VF, and refuses that one attempt: kubelet's retry
//! finds the VF home and moves it in again.
//!
//! An attach cut part way is restored the same way: its record stays marked
//! `attaching` when the runtime dies during createRuntime, so that neither
//! the hook's rollback nor poststop runs, and the VF may sit in the pod
//! not renamed, configured or up. So is a pod whose VFs are split between
//! the host and the pod (a restore or an attach cut between two VFs): the
//! ones in the pod come home, for the next attempt to move them all in.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use crate::inventory::PciAddr;
use crate::ledger::Ledger;
use crate::netdev::SavedVf;

use super::vf_teardown::VfTeardown;

/// Finishes the restore begun on a VF of a live pod, off the request path.
pub trait FinishRestore: Send + Sync {
    /// Starts restoring `container`'s records among `vfs` (the VFs of pod
    /// `sandbox`), each only while it is still `container`'s, if once no
    /// hook works on them they are still left part way
    /// ([`crate::netdev::SavedStore::left_part_way`], the pod's network
    /// given up counting where it is no longer `container`'s); a container
    /// whose VFs are being restored already is left to that.
    fn finish(&self, sandbox: &str, container: &str, vfs: &[PciAddr]);
}

/// Each restore on a thread of its own: it enters the pod's namespace, and
/// may wait for a VF's lock held by a hook still at work.
pub struct OnWorker(Arc<Inner>);

struct Inner {
    host_root: PathBuf,
    vfs: VfTeardown,
    /// Containers whose VFs are being restored.
    running: Mutex<HashSet<String>>,
}

impl OnWorker {
    /// `host_root` holds the `sys/` where a VF's netdev on the host shows.
    pub fn new(state_dir: PathBuf, host_root: PathBuf) -> OnWorker {
        OnWorker(Arc::new(Inner {
            vfs: VfTeardown::new(state_dir, &host_root),
            host_root,
            running: Mutex::default(),
        }))
    }
}

/// Takes its container out of `running` however the worker ends.
struct Running(Arc<Inner>, String);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running().remove(&self.1);
    }
}

impl Inner {
    fn running(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run(&self, sandbox: &str, container: &str, vfs: &[PciAddr]) {
        // Under the VFs' release turns, which a hook holds for its whole
        // attach and its poststop from giving the network up to the end of
        // its restore: one at work when the plan read the records has
        // finished or died by now, and the records and the ledger say what
        // is left.
        let read = Ledger::open(self.vfs.state_dir()).and_then(|l| {
            let turns = l.lock_vfs(vfs)?;
            let owner = l.network_owner(sandbox)?;
            Ok((turns, owner))
        });
        let (_turns, owner) = match read {
            Ok(read) => read,
            Err(e) => {
                tracing::error!(container, error = %nri::ErrorChain(&e), "vf restore not finished: tried again at the pod's next container");
                return;
            }
        };
        let at_home = |vf| crate::inventory::has_netdev(&self.host_root, vf);
        let given_up = owner.as_deref() != Some(container);
        if !self
            .vfs
            .store()
            .left_part_way(container, vfs, at_home, given_up)
        {
            tracing::info!(
                container,
                "vf restore not needed: the pod's vfs are whole once no hook works on them"
            );
            return;
        }
        // Under each VF's lock: a record another container saved since (the
        // VF home and moved in again) is not this restore's.
        let ours = |r: &SavedVf| Ok(r.container_id == container);
        let outcomes = match self.vfs.restore_each(vfs, &ours) {
            Ok(outcomes) => outcomes,
            Err(e) => {
                tracing::error!(container, error = %e, "vf restore not finished: tried again at the pod's next container");
                return;
            }
        };
        for (vf, outcome) in outcomes {
            match outcome {
                Ok(true) => tracing::info!(container, vf = %vf, "vf restore finished"),
                Ok(false) => tracing::debug!(container, vf = %vf, "vf restore finished by another"),
                Err(e) => {
                    tracing::error!(container, vf = %vf, error = %nri::ErrorChain(&e), "vf restore not finished: tried again at the pod's next container")
                }
            }
        }
    }
}

impl FinishRestore for OnWorker {
    fn finish(&self, sandbox: &str, container: &str, vfs: &[PciAddr]) {
        if !self.0.running().insert(container.to_string()) {
            return;
        }
        let running = Running(Arc::clone(&self.0), container.to_string());
        let (sandbox, vfs) = (sandbox.to_string(), vfs.to_vec());
        let spawned = std::thread::Builder::new()
            .name("devgate-vf-finish".into())
            .spawn(move || running.0.run(&sandbox, &running.1, &vfs));
        if let Err(e) = spawned {
            tracing::error!(container, error = %e, "vf restore not finished: no thread for it");
        }
    }
}

#[cfg(test)]
#[path = "vf_finish_tests.rs"]
mod tests;
