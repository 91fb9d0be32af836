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
use super::HookError;
use crate::ledger::{DeviceId, Ledger};
use crate::netdev::SavedStore;

/// Restores the VFs of `sandbox_id`'s network owner when they are left part
/// way ([`SavedStore::left_part_way`]) and the owner's init is gone; whether
/// it did. Decided and done under the VFs' release turns, which a hook holds
/// for its whole attach: one still at work (its runtime gone, say) finishes
/// first. A failed restore fails the container, its records kept for the
/// next try. The turns are given back before this container's own attach,
/// which takes them again.
pub(super) fn restore_cut_network(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    sandbox_id: &str,
) -> Result<bool, HookError> {
    let claims = |state: &crate::ledger::LedgerState| -> Vec<DeviceId> {
        state.pods.get(sandbox_id).map_or_else(Vec::new, |pod| {
            let vfs = pod.claims.iter().map(|c| &c.device);
            vfs.filter(|d| matches!(d, DeviceId::Vf(_)))
                .cloned()
                .collect()
        })
    };
    let seen = claims(&ledger.snapshot().map_err(HooksOnlyError::from)?);
    if seen.is_empty() {
        return Ok(false);
    }
    let _turns = ledger
        .lock_devices(seen.iter())
        .map_err(HooksOnlyError::from)?;
    let state = ledger.snapshot().map_err(HooksOnlyError::from)?;
    let Some(pod) = state.pods.get(sandbox_id) else {
        return Ok(false);
    };
    let Some(owner) = pod.network_owner.as_deref() else {
        return Ok(false);
    };
    let vfs: Vec<_> = claims(&state)
        .into_iter()
        .filter_map(|d| match d {
            DeviceId::Vf(vf) if seen.contains(&d) => Some(vf),
            _ => None,
        })
        .collect();
    let host_root = &run.env.host_root;
    let at_home = |vf| !crate::inventory::netdevs_of(host_root, vf).is_empty();
    if !SavedStore::new(&run.env.state_dir).left_part_way(owner, &vfs, at_home) {
        return Ok(false);
    }
    let gone = pod
        .containers
        .get(owner)
        .and_then(|c| c.init.as_ref())
        .is_some_and(|init| liveness::is_gone(&run.env.roots.proc_root, init));
    if !gone {
        return Ok(false);
    }
    let restored = run.os.detach(owner, run.checkpoint)?;
    ledger
        .give_up_network(owner)
        .map_err(HooksOnlyError::from)?;
    tracing::info!(pod = %pod.pod, owner, restored, "vfs an exited network owner left part way restored: the network goes to this container");
    Ok(true)
}
