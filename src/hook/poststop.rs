//! NRI mode's poststop: a container's saved VFs go home, unless another
//! container of its pod runs on them or joined the pod's network meanwhile.

use super::kept_network::give_up_in_turn;
use super::{restore_listed, siblings, HookEnv, HookError, Outcome, State};
use crate::ledger::{GiveUp, Ledger, PodRecord};
use crate::netdev::{SavedStore, SavedVf, VfError};

pub(super) fn detach(
    state: &State,
    env: &HookEnv,
    checkpoint: &dyn Fn(&'static str),
) -> Result<Outcome, HookError> {
    // Read once here: the common case, a container without VFs, stops at it.
    let scan = SavedStore::new(&env.state_dir)
        .scan_container(&state.id)
        .map_err(VfError::Records)?;
    for e in &scan.unreadable {
        tracing::error!(container = %state.id, error = %nri::ErrorChain(e), "saved vf record skipped");
    }
    if scan.records.is_empty() {
        return Ok(Outcome::Nothing);
    }
    let seen = Ledger::read(&env.state_dir)
        .ok()
        .and_then(|l| l.pod_of(&state.id).cloned());
    if let Some((sandbox, pid)) = seen
        .as_ref()
        .and_then(|pod| runs_beside(env, pod, &state.id, &scan.records))
    {
        tracing::info!(container = %state.id, sandbox = %sandbox, pid, "vfs stay in the pod: another of its containers runs in its network namespace; the pod's stop restores them");
        return Ok(Outcome::Nothing);
    }
    // The records just read name the VFs: each is read again under its lock.
    let vfs: Vec<_> = scan.records.iter().map(SavedVf::vf).collect();
    let Some(seen) = seen else {
        // No record of the container to decide on (a ledger unreadable, or
        // the pod released): the VFs go home all the same.
        return restore_unseen(env, &state.id, &vfs, checkpoint);
    };
    let ledger = Ledger::open(&env.state_dir).map_err(HookError::Ledger)?;
    // A container admitted into the pod since the first look relies on the
    // VFs the owner moved in (the plugin admitted it without moving any),
    // and one running beside them now uses them: both keep them in the pod,
    // its stop restoring them. One admitted after finds no owner and is
    // refused, or takes the network over once the VFs are home.
    let keep = |now: &PodRecord| runs_beside(env, now, &state.id, &scan.records).is_some();
    let (given, _turns) = give_up_in_turn(&ledger, &seen, &state.id, &vfs, checkpoint, &keep)
        .map_err(HookError::Ledger)?;
    if given == GiveUp::Kept {
        return Ok(Outcome::Nothing);
    }
    // The network was given up first. A restore that fails takes it back
    // (the VFs may sit in the pod, where the pod's next container relies on
    // them) unless a container took it over meanwhile, once they were home.
    match restore_listed(env, &state.id, &vfs, checkpoint) {
        Ok(0) => Ok(Outcome::Nothing),
        Ok(n) => Ok(Outcome::Detached(n)),
        Err(e) => {
            take_back(&ledger, &seen, &state.id);
            Err(e)
        }
    }
}

/// After a failed restore, the network `container_id` owned in `seen` taken
/// back; its own failure is logged, the restore's error being the one told.
fn take_back(ledger: &Ledger, seen: &PodRecord, container_id: &str) {
    if seen.network_owner.as_deref() != Some(container_id) {
        return;
    }
    let Some(before) = seen.containers.get(container_id) else {
        return;
    };
    match ledger.take_network_back(&seen.pod.sandbox_id, container_id, before) {
        Ok(true) => {
            tracing::warn!(pod = %seen.pod, container = %container_id, "vf restore failed: the container keeps the pod's network, its vfs perhaps in the pod")
        }
        Ok(false) => {
            tracing::warn!(pod = %seen.pod, container = %container_id, "vf restore failed: the pod's network was taken over or the pod released meanwhile")
        }
        Err(e) => {
            tracing::error!(pod = %seen.pod, container = %container_id, error = %nri::ErrorChain(&e), "vf restore failed and the network could not be taken back")
        }
    }
}

/// The restore of a container the ledger could not place in a pod: its VFs
/// first, then whatever network it still owns is given up.
fn restore_unseen(
    env: &HookEnv,
    container_id: &str,
    vfs: &[crate::inventory::PciAddr],
    checkpoint: &dyn Fn(&'static str),
) -> Result<Outcome, HookError> {
    match restore_listed(env, container_id, vfs, checkpoint)? {
        0 => Ok(Outcome::Nothing),
        n => {
            let ledger = Ledger::open(&env.state_dir).map_err(HookError::Ledger)?;
            ledger
                .give_up_network(container_id)
                .map_err(HookError::Ledger)?;
            Ok(Outcome::Detached(n))
        }
    }
}

/// The pod's sandbox and a process of another of its containers, while one
/// runs in the namespace the container's VFs (`records`) were moved into
/// (see [`siblings`]). `None` wherever the answer cannot be read: poststop
/// then restores, as it always did.
fn runs_beside(
    env: &HookEnv,
    pod: &PodRecord,
    container_id: &str,
    records: &[SavedVf],
) -> Option<(String, u32)> {
    // A VF an attach or restore left part way (it may sit in the pod
    // untagged, its PF settings reset) is finished now, whoever runs on:
    // only whole moves stay.
    if records.iter().any(|r| r.cut()) {
        return None;
    }
    let netns = records.first()?.netns.id;
    let others: Vec<&str> = pod
        .containers
        .keys()
        .map(String::as_str)
        .filter(|id| *id != container_id)
        .collect();
    let pid = siblings::running_beside(&env.roots.proc_root, netns, &others)?;
    Some((pod.pod.sandbox_id.clone(), pid))
}

/// [`runs_beside`] for the pod the ledger holds `container_id` in now.
#[cfg(test)]
pub(super) fn pod_runs_on(
    env: &HookEnv,
    container_id: &str,
    records: &[SavedVf],
) -> Option<(String, u32)> {
    let ledger = Ledger::read(&env.state_dir).ok()?;
    runs_beside(env, ledger.pod_of(container_id)?, container_id, records)
}
