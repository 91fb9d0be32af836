//! Hooks-only mode: a pod's network owner that stops while another container
//! of the pod runs on leaves the VFs in the pod. The namespace is the pod's,
//! so the owner's poststop giving them back would take `net1` (and, in
//! exclusive mode, the RDMA device) from a sidecar or a second app container
//! (CRI-O without an infra container, `drop_infra_ctr`, makes the first app
//! container the owner). No process stops the pod in this mode, so the VFs
//! stay with the owner's record, its network kept, and the poststop of a
//! later container of the pod that finds none of the others running in
//! that namespace restores them and forgets the owner, before it decides
//! whether it is the pod's last. Where no poststop runs (podman's runtime
//! did not create the container), the reap of exited pods restores them,
//! as for any exited owner.
//!
//! Which containers run is told by the inits the hook records at
//! createRuntime ([`siblings::init_beside`]); what cannot be read counts as
//! not running, so the VFs go home, as they always did.

use super::standalone::{HooksOnly, HooksOnlyError};
use super::{liveness, siblings, HookEnv, HookError};
use crate::ledger::{Ledger, PodRecord};
use crate::netdev::{NetnsId, SavedStore};

/// The namespace every VF saved for `container_id` moved into whole; `None`
/// when it has none, or a record is cut part way, unreadable, or names
/// another namespace: such VFs are restored now, whoever runs on.
fn moved_whole_into(env: &HookEnv, container_id: &str) -> Option<NetnsId> {
    let scan = SavedStore::new(&env.state_dir)
        .scan_container(container_id)
        .ok()?;
    if !scan.unreadable.is_empty() {
        return None;
    }
    let netns = scan.records.first()?.netns.id;
    let whole = scan.records.iter().all(|r| !r.cut() && r.netns.id == netns);
    whole.then_some(netns)
}

/// Another container of `pod` whose init runs in the namespace the VFs of
/// `container_id` moved into: its id and pid. The VFs then stay for it.
pub(super) fn kept_for(
    env: &HookEnv,
    pod: &PodRecord,
    container_id: &str,
) -> Option<(String, u32)> {
    // An owner whose init was not recorded could never be proven exited,
    // and its VFs would wait for a restore that never comes.
    pod.containers.get(container_id)?.init.as_ref()?;
    let netns = moved_whole_into(env, container_id)?;
    siblings::init_beside(&env.roots.proc_root, netns, pod, container_id)
        .map(|(id, pid)| (id.to_string(), pid))
}

/// The exited containers of `pod`, other than `stopping`, with VFs saved
/// and no container of the pod running beside them any more.
fn left_behind(env: &HookEnv, pod: &PodRecord, stopping: &str) -> Vec<String> {
    let has_saved = |id: &str| {
        SavedStore::new(&env.state_dir)
            .scan_container(id)
            .map_or(true, |s| !s.records.is_empty() || !s.unreadable.is_empty())
    };
    pod.containers
        .iter()
        .filter(|(id, _)| id.as_str() != stopping)
        .filter(|(_, record)| {
            record
                .init
                .as_ref()
                .is_some_and(|init| liveness::is_gone(&env.roots.proc_root, init))
        })
        .map(|(id, _)| id.clone())
        .filter(|id| has_saved(id) && kept_for(env, pod, id).is_none())
        .collect()
}

/// At the poststop of `stopping`, a container of the pod `seen` (as read
/// before its own restore): restores the VFs exited containers kept for
/// others that no longer run, gives up their network and forgets them; how
/// many VFs came home. Decided again under the VFs' release turns, so that a
/// container of the pod admitted meanwhile, running in the namespace, keeps
/// them. A failed restore quarantines the pod's VFs and fails the stage,
/// the records kept for the reap of exited pods.
pub(super) fn restore_left(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    seen: &PodRecord,
    stopping: &str,
) -> Result<usize, HookError> {
    if left_behind(run.env, seen, stopping).is_empty() {
        return Ok(0);
    }
    let vfs: Vec<_> = seen.vfs().collect();
    let _turns = ledger.lock_vfs(&vfs).map_err(HooksOnlyError::from)?;
    let sandbox_id = &seen.pod.sandbox_id;
    let Some(pod) = ledger
        .snapshot()
        .map_err(HooksOnlyError::from)?
        .pods
        .remove(sandbox_id)
    else {
        return Ok(0);
    };
    let mut restored = 0;
    for id in left_behind(run.env, &pod, stopping) {
        match run.os.detach(&id, run.checkpoint) {
            Ok(n) => restored += n,
            Err(e) => {
                let reason = nri::ErrorChain(&e).to_string();
                super::release::quarantine_pod_vfs(ledger, sandbox_id, &reason);
                return Err(e);
            }
        }
        ledger.give_up_network(&id).map_err(HooksOnlyError::from)?;
        ledger
            .remove_container(sandbox_id, &id, &|p| run.env.vfs_away(p))
            .map_err(HooksOnlyError::from)?;
        tracing::info!(pod = %pod.pod, container = %id, stopping, "vfs an exited network owner kept for its pod restored: no other container of the pod runs");
    }
    Ok(restored)
}
