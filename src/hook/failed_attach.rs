//! After a createRuntime that could not attach the container's VFs (NRI mode):
//! the runtime fails the container, and what devgate held for it goes, so that
//! nothing stays claimed for a container that never ran. The kubelet's retry
//! claims again at its CreateContainer.

use super::HookEnv;
use crate::ledger::{Ledger, LedgerError, NoTeardown};
use crate::netdev::SavedStore;

/// Forgets the container's record and, when it was the only container ever
/// recorded in the pod, releases the pod's claims. Nothing is released while
/// a VF of the pod is still saved (a restore failed): poststop, which runc
/// runs after a failed create, the pod's next network owner or its release
/// restores it first.
/// Best effort: the attach error is what the runtime reports, so a ledger
/// error here is only logged.
pub(super) fn release(env: &HookEnv, container_id: &str) {
    // A record that cannot be read may be this container's: keep the claims.
    match SavedStore::new(&env.state_dir).scan_container(container_id) {
        Ok(scan) if scan.records.is_empty() && scan.unreadable.is_empty() => {}
        Ok(_) => {
            tracing::warn!(container = %container_id, "a vf of the failed container is not restored, or a vf record is unreadable: its pod keeps its claims");
            return;
        }
        Err(e) => {
            tracing::warn!(container = %container_id, error = %nri::ErrorChain(&e), "saved vf state unreadable: the pod keeps its claims");
            return;
        }
    }
    match forget(env, container_id) {
        Ok(Some(sandbox)) => {
            tracing::info!(container = %container_id, sandbox = %sandbox, "failed container forgotten, its pod's claims released")
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(container = %container_id, error = %nri::ErrorChain(&e), "failed container: claims not released")
        }
    }
}

/// The sandbox whose claims went, if any did.
fn forget(env: &HookEnv, container_id: &str) -> Result<Option<String>, LedgerError> {
    let ledger = Ledger::open(&env.state_dir)?;
    let snapshot = ledger.snapshot()?;
    let Some(pod) = snapshot.pod_of(container_id) else {
        return Ok(None);
    };
    let sandbox = pod.pod.sandbox_id.clone();
    ledger.remove_container(&sandbox, container_id, &|p| env.vfs_away(p))?;
    // A VF an earlier container of the pod moved in and did not bring back
    // is still saved: released now, the pod's claims would go with no
    // teardown left to restore it.
    if !SavedStore::new(&env.state_dir).none_moved(pod) {
        tracing::warn!(container = %container_id, sandbox = %sandbox, "a vf of the pod is not restored: its pod keeps its claims");
        return Ok(None);
    }
    // Only with no container left and none before this one, checked under
    // the lock: one the plugin admits meanwhile keeps the pod's claims, and so
    // does a live pod an earlier container ran in (kubelet removes a dead
    // container while its pod lives on): its devices were used, and go with
    // their teardown when its sandbox stops. This container never ran, so
    // its devices need none.
    let released = ledger.release_pod_unjoined(&sandbox, 1, &NoTeardown)?;
    Ok(matches!(released, crate::ledger::GuardedRelease::Released(_)).then_some(sandbox))
}
