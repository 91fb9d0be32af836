//! Hooks-only mode: a pod's network owner that stops while another container
//! of the pod runs on leaves the VFs in the pod. The namespace is the pod's,
//! so the owner's poststop giving them back would take `net1` (and, in
//! exclusive mode, the RDMA device) from a sidecar or a second app container
//! (CRI-O without an infra container, `drop_infra_ctr`, makes the first app
//! container the owner; a podman pod's containers share its namespace). No
//! process sees the pod stop in this mode, so the VFs stay with the owner's
//! record, its network kept, and a later container of the pod that leaves
//! (its poststop, or its failed creation) and finds none of the others
//! running in that namespace restores them and forgets the owner, before it
//! decides whether it is the pod's last. Where nothing of the pod leaves
//! through a hook (podman runs poststop only at a container's removal), the
//! reap of exited pods at a later createRuntime restores them, as for any
//! exited owner.
//!
//! Only containers the hook ran for count (those carrying the allocation
//! annotation, which CRI-O copies into each container of the pod), told by
//! the inits recorded at createRuntime ([`siblings::init_beside`]); an init
//! that cannot be read counts as not running, so the VFs go home, as they
//! always did.

use std::collections::BTreeSet;

use super::standalone::{HooksOnly, HooksOnlyError};
use super::{liveness, siblings, HookEnv, HookError};
use crate::ledger::{DeviceLocks, GiveUp, Ledger, LedgerError, PodRecord};
use crate::netdev::{NetnsId, SavedStore, SavedVf};

/// The readable records saved for the VFs `pod` claims: each read by its
/// VF (a stop looks at its pod's few, not at the node's); one that cannot
/// be read is left to the restores that name its VF.
fn pod_records(env: &HookEnv, pod: &PodRecord) -> Vec<SavedVf> {
    let store = SavedStore::new(&env.state_dir);
    pod.vfs()
        .filter_map(|vf| store.load(vf).ok().flatten())
        .collect()
}

/// The records among `records` that `container_id` saved.
fn of(records: &[SavedVf], container_id: &str) -> Vec<SavedVf> {
    let mine = records.iter().filter(|r| r.container_id == container_id);
    mine.cloned().collect()
}

/// Another container of `pod` whose init runs in a namespace one of
/// `records` moved a VF into, other than those in `except`.
fn running_beside(
    env: &HookEnv,
    pod: &PodRecord,
    records: &[SavedVf],
    except: &[&str],
) -> Option<(String, u32)> {
    let mut seen: Vec<NetnsId> = Vec::new();
    records.iter().find_map(|r| {
        if seen.contains(&r.netns.id) {
            return None;
        }
        seen.push(r.netns.id);
        siblings::init_beside(&env.roots.proc_root, r.netns.id, pod, except)
            .map(|(id, pid)| (id.to_string(), pid))
    })
}

/// At the poststop of `container_id`, the network owner of `pod`: another
/// container of the pod whose init runs in the namespace its VFs moved into
/// whole; its id and pid. The VFs then stay for it. A VF cut part way is
/// finished now, whoever runs on, and an owner whose init was not recorded
/// could never be proven exited: their VFs go home.
pub(super) fn kept_for(
    env: &HookEnv,
    pod: &PodRecord,
    container_id: &str,
) -> Option<(String, u32)> {
    if pod.network_owner.as_deref() != Some(container_id) {
        return None;
    }
    pod.containers.get(container_id)?.init.as_ref()?;
    let records = of(&pod_records(env, pod), container_id);
    if records.iter().any(SavedVf::cut) {
        return None;
    }
    running_beside(env, pod, &records, &[container_id])
}

/// The poststop of `container_id`, a container of `seen` (its pod as first
/// read) that found no other container of the pod running beside its VFs:
/// gives its network up and restores its VFs; how many came home, `None`
/// where they stay. Decided again under the VFs' release turns and the
/// ledger's lock, as [`restore_left`] does: a container admitted into the
/// pod's network since the first look, or running beside the VFs now,
/// keeps them there, the owner's record kept for the pod's last container
/// to leave; one admitted after the network was given up finds no owner and
/// takes it over once the VFs are home, instead of starting without them.
pub(super) fn restore_own(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    seen: &PodRecord,
    container_id: &str,
) -> Result<Option<usize>, HookError> {
    if seen.network_owner.as_deref() != Some(container_id) {
        // It owns no network to keep or give up (ownership goes only to a
        // container being admitted): whatever it saved goes home.
        return detach_or_quarantine(run, ledger, seen, container_id).map(Some);
    }
    let vfs: Vec<_> = seen.vfs().collect();
    let env = run.env;
    let kept = |now: &PodRecord| kept_for(env, now, container_id).is_some();
    let (given, _turns) = give_up_in_turn(ledger, seen, container_id, &vfs, run.checkpoint, &kept)
        .map_err(HooksOnlyError::from)?;
    if given == GiveUp::Kept {
        return Ok(None);
    }
    detach_or_quarantine(run, ledger, seen, container_id).map(Some)
}

/// The release turns of `vfs` taken, for the caller to hold through their
/// restore (an attach of a container that takes the network over waits for
/// the VFs to be home), then the network of `seen` (the pod as first read)
/// given up by its owner `container_id` before they move, decided again
/// under the ledger's lock: a container admitted into the pod since the
/// first look, or one `keep` finds running beside the VFs now, keeps them
/// in the pod. A container that owns no network gives nothing up.
pub(super) fn give_up_in_turn(
    ledger: &Ledger,
    seen: &PodRecord,
    container_id: &str,
    vfs: &[crate::inventory::PciAddr],
    checkpoint: &dyn Fn(&'static str),
    keep: &dyn Fn(&PodRecord) -> bool,
) -> Result<(GiveUp, DeviceLocks), LedgerError> {
    let turns = ledger.lock_vfs(vfs)?;
    checkpoint("restore-turns");
    let given = give_up_holding_turns(ledger, seen, container_id, keep)?;
    Ok((given, turns))
}

/// [`give_up_in_turn`]'s decision, for a caller that holds the VFs' turns.
pub(super) fn give_up_holding_turns(
    ledger: &Ledger,
    seen: &PodRecord,
    container_id: &str,
    keep: &dyn Fn(&PodRecord) -> bool,
) -> Result<GiveUp, LedgerError> {
    if seen.network_owner.as_deref() != Some(container_id) {
        return Ok(GiveUp::Given);
    }
    let known: BTreeSet<String> = seen.containers.keys().cloned().collect();
    let given = ledger.give_up_network_unless(&seen.pod.sandbox_id, container_id, &known, keep)?;
    if given == GiveUp::Kept {
        tracing::info!(pod = %seen.pod, container = %container_id, "vfs stay in the pod: a container joined it or runs beside them since the first look");
    }
    Ok(given)
}

/// Restores the VFs `container_id` saved; a failure quarantines the pod's
/// VFs (they may sit half configured), its record and claims kept: the pod's
/// next container takes the network over and finishes the restore, or the
/// reap of exited pods does.
fn detach_or_quarantine(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    seen: &PodRecord,
    container_id: &str,
) -> Result<usize, HookError> {
    run.os
        .detach(container_id, run.checkpoint)
        .inspect_err(|e| {
            let reason = nri::ErrorChain(e).to_string();
            super::release::quarantine_pod_vfs(ledger, &seen.pod.sandbox_id, &reason);
        })
}

/// The exited containers of `pod`, other than `leaving`, with VFs saved
/// and no other container of the pod, `leaving` aside, running beside them.
/// A network owner forgotten with its VFs away counts as exited.
fn left_behind(env: &HookEnv, pod: &PodRecord, leaving: &str) -> Vec<String> {
    let exited: Vec<&String> = pod
        .containers
        .iter()
        .filter(|(id, record)| {
            let init = record.init.as_ref();
            id.as_str() != leaving
                && init.is_some_and(|init| liveness::is_gone(&env.roots.proc_root, init))
        })
        .map(|(id, _)| id)
        .chain(pod.forgotten_owner().filter(|id| id.as_str() != leaving))
        .collect();
    if exited.is_empty() {
        return Vec::new();
    }
    let records = pod_records(env, pod);
    exited
        .into_iter()
        .filter(|id| {
            let theirs = of(&records, id);
            !theirs.is_empty() && running_beside(env, pod, &theirs, &[id, leaving]).is_none()
        })
        .cloned()
        .collect()
}

/// As `leaving`, a container of the pod `seen`, goes (its poststop after its
/// own restore, or its failed creation): restores the VFs exited containers
/// kept for others that no longer run, and forgets those containers; how
/// many VFs came home. Decided again under the VFs' release turns, and each
/// container's network given up before its VFs move, unless a container
/// joined the pod meanwhile ([`Ledger::give_up_network_unless_joined`]),
/// which keeps the VFs. A failed restore quarantines the pod's VFs and fails
/// the caller, the records kept: the pod's next container takes the network
/// over and finishes the restore before it moves them in, or the reap of
/// exited pods restores them.
pub(super) fn restore_left(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    seen: &PodRecord,
    leaving: &str,
) -> Result<usize, HookError> {
    if seen.vfs().next().is_none() || left_behind(run.env, seen, leaving).is_empty() {
        return Ok(0);
    }
    let vfs: Vec<_> = seen.vfs().collect();
    let _turns = ledger.lock_vfs(&vfs).map_err(HooksOnlyError::from)?;
    let sandbox_id = &seen.pod.sandbox_id;
    let state = ledger.snapshot().map_err(HooksOnlyError::from)?;
    // Claims that changed meanwhile are not the ones whose turns are held.
    let Some(pod) = state
        .pods
        .get(sandbox_id)
        .filter(|p| p.vfs().eq(vfs.iter().copied()))
    else {
        return Ok(0);
    };
    let known: BTreeSet<String> = pod.containers.keys().cloned().collect();
    let mut restored = 0;
    for id in left_behind(run.env, pod, leaving) {
        if !ledger
            .give_up_network_unless_joined(sandbox_id, &id, &known)
            .map_err(HooksOnlyError::from)?
        {
            tracing::info!(pod = %pod.pod, container = %id, "vfs kept: a container joined the pod meanwhile");
            break;
        }
        match run.os.detach(&id, run.checkpoint) {
            Ok(n) => restored += n,
            Err(e) => {
                let reason = nri::ErrorChain(&e).to_string();
                super::release::quarantine_pod_vfs(ledger, sandbox_id, &reason);
                return Err(e);
            }
        }
        // Only the record judged exited: an id admitted again keeps its own.
        if let Some(stale) = pod.containers.get(&id) {
            ledger
                .remove_container_if(sandbox_id, &id, stale, &|p| run.env.vfs_away(p))
                .map_err(HooksOnlyError::from)?;
        }
        tracing::info!(pod = %pod.pod, container = %id, leaving, "vfs an exited container kept for its pod restored: no other container of the pod runs");
    }
    Ok(restored)
}

/// [`restore_left`] for `leaving`, whose creation failed after its
/// admission: it held the pod's other containers' VFs in place while its
/// init ran, and no poststop of its own may follow. A failure is logged
/// (the VFs quarantined): the creation fails anyway.
pub(super) fn restore_left_at_failure(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    sandbox_id: &str,
    leaving: &str,
) {
    let restored = ledger
        .snapshot()
        .map_err(|e| HookError::from(HooksOnlyError::from(e)))
        .and_then(|mut state| match state.pods.remove(sandbox_id) {
            Some(pod) => restore_left(run, ledger, &pod, leaving),
            None => Ok(0),
        });
    if let Err(e) = restored {
        tracing::error!(sandbox = sandbox_id, container = leaving, error = %nri::ErrorChain(&e), "vfs kept for the pod not restored");
    }
}
