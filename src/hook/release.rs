//! Hooks-only release: poststop of a container, and the guarded release
//! that [`super::reap`] also takes for pods whose containers are all gone
//! without a poststop.
//!
//! Like the plugin's release, a pod's claims go only after its teardown: VF
//! restore, then GPU cleanup ([`crate::gpu::GpuTeardown`] through
//! [`ContainerOs::gpu_teardown`]). What cannot be cleaned is quarantined in
//! the ledger instead of being handed to the next pod. Hooks of one pod run
//! concurrently, so a pod goes only if its container set is still what the
//! decision was based on ([`Ledger::release_pod_if_unchanged`]).

use super::standalone::{HooksOnly, HooksOnlyError};
use super::{HookEnv, HookError, Outcome, State};
use crate::ledger::{Claim, DeviceId, GuardedRelease, Ledger, PodRecord, Removal};

/// Quarantines the pod's VFs after a failed restore: they may sit half
/// configured in a namespace, so they stay out of service until someone looks.
pub(super) fn quarantine_vfs(ledger: &Ledger, pod: &PodRecord, reason: &str) {
    for claim in &pod.claims {
        if let DeviceId::Vf(_) = claim.device {
            match ledger.quarantine(&claim.device, reason) {
                Ok(()) => {
                    tracing::warn!(pod = %pod.pod, device = %claim.device, reason, "vf quarantined")
                }
                Err(e) => {
                    tracing::error!(pod = %pod.pod, device = %claim.device, error = %nri::ErrorChain(&e), "vf not quarantined")
                }
            }
        }
    }
}

/// [`quarantine_vfs`] for the pod as the ledger holds it now.
pub(super) fn quarantine_pod_vfs(ledger: &Ledger, sandbox_id: &str, reason: &str) {
    match ledger.snapshot() {
        Ok(mut state) => {
            if let Some(pod) = state.pods.remove(sandbox_id) {
                quarantine_vfs(ledger, &pod, reason);
            }
        }
        Err(e) => {
            tracing::error!(sandbox = sandbox_id, error = %nri::ErrorChain(&e), "vfs not quarantined")
        }
    }
}

/// Whether a VF of the container is still saved, or a saved record cannot be
/// read (it may be this container's): its restore has not happened.
pub(super) fn vfs_still_saved(env: &HookEnv, container_id: &str) -> bool {
    match crate::netdev::SavedStore::new(&env.state_dir).scan_container(container_id) {
        Ok(scan) => !scan.records.is_empty() || !scan.unreadable.is_empty(),
        Err(e) => {
            tracing::warn!(container = container_id, error = %nri::ErrorChain(&e), "saved vf state unlistable");
            true
        }
    }
}

/// Releases the pod after its GPU teardown if its containers are still
/// those of `seen`, records and all, when the ledger commits; true when
/// released. `seen` is the
/// pod as the caller read it: its containers' recorded cgroups, the one
/// being forgotten included, tell the teardown which processes are the pod's.
pub(super) fn release_guarded(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    seen: &PodRecord,
) -> Result<bool, HooksOnlyError> {
    let mut cgroups: Vec<String> = Vec::new();
    for path in seen.containers.values().flat_map(|c| &c.cgroups) {
        if !cgroups.contains(path) {
            cgroups.push(path.clone());
        }
    }
    let sandbox_id = &seen.pod.sandbox_id;
    let teardown = run
        .os
        .gpu_teardown(run.config, ledger, sandbox_id, &cgroups);
    match ledger.release_pod_if_unchanged(sandbox_id, &seen.containers, teardown.as_ref())? {
        GuardedRelease::Released(_) => Ok(true),
        GuardedRelease::Changed => {
            tracing::info!(pod = %seen.pod, "pod kept: its containers changed meanwhile");
            Ok(false)
        }
        GuardedRelease::Absent | GuardedRelease::Busy => Ok(false),
        // The claims stay and the devices are quarantined.
        GuardedRelease::Failed { pod, reason } => Err(HooksOnlyError::Teardown {
            pod: pod.pod.to_string(),
            reason,
        }),
    }
}

/// Rounds of [`forget`] that find the pod changed by its other containers'
/// hooks before it keeps the record for the reap of exited pods.
const FORGET_ROUNDS: usize = 4;

/// Forgets the container and releases the pod when it was its last. Used
/// when a create fails after the claim: nothing reached a GPU yet, but the
/// teardown is cheap and keeps one path.
///
/// A pod's last record goes with its claims, in the release's one commit: a
/// hook killed before it (the runtime's hook timeout) leaves the record, by
/// whose init the reap of exited pods knows the pod; a pod left with claims
/// and no container would never be reaped. Whether this container is the
/// last is decided under the ledger's lock, since its pod's other
/// containers' hooks may be forgetting theirs at the same moment.
pub(super) fn forget(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    sandbox_id: &str,
    container_id: &str,
) -> Result<bool, HooksOnlyError> {
    for _ in 0..FORGET_ROUNDS {
        let Some(seen) = ledger.snapshot()?.pods.remove(sandbox_id) else {
            ledger.remove_container(sandbox_id, container_id, &|p| run.env.vfs_away(p))?;
            return Ok(false);
        };
        if seen.containers.keys().all(|c| c == container_id) {
            if release_guarded(run, ledger, &seen)? {
                return Ok(true);
            }
            // A container joined meanwhile, or the pod went: look again.
            continue;
        }
        // Other containers remain (no teardown to build: discovery, NVML),
        // unless they left since the snapshot, which makes this one the last.
        let removal = ledger
            .remove_container_unless_last(sandbox_id, container_id, &|p| run.env.vfs_away(p))?;
        if removal == Removal::Removed {
            return Ok(false);
        }
    }
    // The pod kept changing: the record stays, and the reap of exited pods
    // releases the pod once every container's init is gone.
    tracing::warn!(sandbox = sandbox_id, container = container_id, "pod changing while its container is forgotten: its record is left to the reap of exited pods");
    Ok(false)
}

/// poststop with a ledger it cannot read (corrupt, or written by a newer
/// devgate after a rollback): the container's VFs go back whatever else is
/// missing, since a VF left in a dead pod keeps its tenant's MAC, VLAN and
/// trust. A restore is idempotent and locked per record, so one the NRI
/// plugin's own hook makes as well finds nothing left. The claims stay
/// until a release can read the ledger.
fn restore_without_ledger(
    run: &mut HooksOnly<'_>,
    state: &State,
    e: crate::ledger::LedgerError,
) -> Result<Outcome, HookError> {
    if let Err(restore) = run.os.detach(&state.id, run.checkpoint) {
        tracing::error!(container = %state.id, error = %nri::ErrorChain(&restore), "vf restore failed with the ledger unreadable");
    }
    Err(HooksOnlyError::from(e).into())
}

/// What a poststop's network part leaves to the rest of the stop.
pub(super) struct Left {
    /// VFs that came home.
    pub(super) networks: usize,
    pod: Option<PodRecord>,
    ledger: Ledger,
}

/// poststop's network part, which reads no config: restores the container's
/// VFs, unless another container of the pod runs in their namespace
/// ([`super::kept_network`]), and those exited containers of the pod kept
/// for it. `None` where the container leaves nothing to do: the NRI plugin
/// admitted it, or its VFs stay in the pod.
pub(super) fn leave_network(
    run: &mut HooksOnly<'_>,
    state: &State,
) -> Result<Option<Left>, HookError> {
    // The pod is found by the container, not by annotations: poststop may see fewer.
    let read = Ledger::open(&run.env.state_dir)
        .and_then(|ledger| Ok((ledger.snapshot()?.pod_of(&state.id).cloned(), ledger)));
    let (pod, ledger) = match read {
        Ok(read) => read,
        Err(e) => return restore_without_ledger(run, state, e).map(|_| None),
    };
    if pod
        .as_ref()
        .is_some_and(|p| p.containers[&state.id].by_plugin())
    {
        // The NRI plugin admitted it: its hook and its release do the work.
        return Ok(None);
    }
    if let Some((other, pid)) = pod
        .as_ref()
        .and_then(|p| super::kept_network::kept_for(run.env, p, &state.id))
    {
        tracing::info!(container = %state.id, other = %other, pid, "vfs stay in the pod: another of its containers runs in its network namespace; a later container of the pod that leaves with none of the others running restores them");
        return Ok(None);
    }
    let restored = match &pod {
        // A failed restore there quarantines the pod's VFs, the record and
        // claims kept for a later release.
        Some(pod) => super::kept_network::restore_own(run, &ledger, pod, &state.id)?,
        None => Some(run.os.detach(&state.id, run.checkpoint)?),
    };
    let Some(mut networks) = restored else {
        return Ok(None);
    };
    if let Some(pod) = &pod {
        // Before the decision whether this container is the pod's last:
        // an owner that kept its VFs for this one goes with them.
        networks += super::kept_network::restore_left(run, &ledger, pod, &state.id)?;
    }
    Ok(Some(Left {
        networks,
        pod,
        ledger,
    }))
}

/// A poststop whose config cannot be read: its network part, which needs
/// none, so that a typo or a key newer than this binary neither leaves VFs
/// in a pod nor takes them from a container still running beside them. The
/// claims stay, so the GPU teardown and the release wait for a config that
/// loads.
pub(super) fn leave_without_config(run: &mut HooksOnly<'_>, state: &State) {
    match leave_network(run, state) {
        Ok(left) => {
            let restored = left.map_or(0, |l| l.networks);
            tracing::warn!(
                restored,
                "config unreadable: vfs restored unless the pod runs on them, claims kept"
            );
        }
        Err(e) => {
            tracing::error!(error = %nri::ErrorChain(&e), "config unreadable and vfs not restored")
        }
    }
}

/// poststop: [`leave_network`], then forget the container, and release the
/// pod with its last container.
pub(super) fn stop(run: &mut HooksOnly<'_>, state: &State) -> Result<Outcome, HookError> {
    let Some(Left {
        networks,
        pod,
        ledger,
    }) = leave_network(run, state)?
    else {
        return Ok(Outcome::Nothing);
    };
    let pod_released = match pod {
        Some(pod) => forget(run, &ledger, &pod.pod.sandbox_id, &state.id)?,
        None => false,
    };
    if networks == 0 && !pod_released {
        return Ok(Outcome::Nothing);
    }
    Ok(Outcome::Released {
        networks,
        pod_released,
    })
}

/// Retries the quarantined GPUs among `claims` that no pod holds, so that a
/// GPU whose teardown once failed (a process slow to exit) serves again once
/// it is clean. What stays quarantined is refused by the admission after it,
/// with the quarantine's reason.
pub(super) fn retry_quarantined(run: &mut HooksOnly<'_>, ledger: &Ledger, claims: &[Claim]) {
    let state = match ledger.snapshot() {
        Ok(state) => state,
        Err(e) => {
            tracing::warn!(error = %nri::ErrorChain(&e), "quarantined gpus not retried");
            return;
        }
    };
    let stuck: Vec<String> = claims
        .iter()
        .filter_map(|c| match &c.device {
            DeviceId::Gpu(uuid) => Some(uuid),
            _ => None,
        })
        .filter(|uuid| {
            state
                .devices
                .get(&DeviceId::Gpu(uuid.to_string()).to_string())
                .is_some_and(crate::ledger::DeviceRecord::quarantined_unheld)
        })
        .cloned()
        .collect();
    if stuck.is_empty() {
        return;
    }
    match run.os.retry_quarantined(run.config, ledger, &stuck) {
        Ok(cleared) => {
            for uuid in &cleared {
                tracing::info!(gpu = %uuid, "gpu back in service");
            }
            for uuid in stuck.iter().filter(|u| !cleared.contains(u)) {
                tracing::info!(gpu = %uuid, "gpu stays quarantined");
            }
        }
        Err(e) => {
            tracing::warn!(gpus = ?stuck, error = %nri::ErrorChain(&e), "quarantined gpus not retried")
        }
    }
}
