//! Hooks-only mode: a pod's network owner whose hook stopped part way (killed
//! during its attach or its restore: podman runs no poststop for a container
//! the runtime did not create) left the pod's VFs cut, or split between the
//! host and the pod, and died. No process finishes that in this mode, so the
//! pod's next container does before it plans: the owner's VFs are restored
//! and its network given up, and this container takes the network over with
//! the VFs home. Given them as they are, it would share a VF perhaps down,
//! not renamed, or with its VLAN reset.

use super::liveness;
use super::standalone::{HooksOnly, HooksOnlyError};
use super::{HookEnv, HookError};
use crate::inventory::PciAddr;
use crate::ledger::{Ledger, LedgerState};
use crate::netdev::SavedStore;

/// Restores the VFs of `sandbox_id`'s network owner when they are left part
/// way ([`SavedStore::left_part_way`]) and the owner's init is gone; whether
/// it did. Decided again and done under the VFs' release turns, which a hook
/// holds for its whole attach: one still at work (its runtime gone, say)
/// finishes first. A failed restore fails the container, its records kept for the
/// next try. The turns are given back before this container's own attach,
/// which takes them again.
pub(super) fn restore_cut_network(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    sandbox_id: &str,
) -> Result<bool, HookError> {
    let snapshot = || ledger.snapshot().map_err(HooksOnlyError::from);
    // Looked at first without the turns, so that a pod whose owner lives,
    // the usual case, waits for no attach or release of its own.
    let Some((_, seen)) = cut_owner(run.env, &snapshot()?, sandbox_id) else {
        return Ok(false);
    };
    let _turns = ledger.lock_vfs(&seen).map_err(HooksOnlyError::from)?;
    let state = snapshot()?;
    let Some((owner, vfs)) = cut_owner(run.env, &state, sandbox_id) else {
        return Ok(false);
    };
    // Claims that changed meanwhile are not the ones whose turns are held.
    if vfs != seen {
        return Ok(false);
    }
    let restored = run.os.detach(&owner, run.checkpoint)?;
    ledger
        .give_up_network(&owner)
        .map_err(HooksOnlyError::from)?;
    tracing::info!(
        sandbox = sandbox_id,
        owner,
        restored,
        "vfs an exited network owner left part way restored: the network goes to this container"
    );
    Ok(true)
}

/// The pod's network owner and its VF claims, when the owner's init is gone
/// and its records among them are left part way.
fn cut_owner(
    env: &HookEnv,
    state: &LedgerState,
    sandbox_id: &str,
) -> Option<(String, Vec<PciAddr>)> {
    let pod = state.pods.get(sandbox_id)?;
    let owner = pod.network_owner.as_deref()?;
    let init = pod.containers.get(owner)?.init.as_ref()?;
    if !liveness::is_gone(&env.roots.proc_root, init) {
        return None;
    }
    let vfs: Vec<PciAddr> = pod.vfs().collect();
    let at_home = |vf| crate::inventory::has_netdev(&env.host_root, vf);
    let left = SavedStore::new(&env.state_dir).left_part_way(owner, &vfs, at_home, false);
    left.then(|| (owner.to_string(), vfs))
}
