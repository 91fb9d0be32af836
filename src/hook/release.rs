//! Hooks-only release: poststop of a container, and pods whose containers
//! are all gone without a poststop (the runtime or host crashed, the hook was
//! killed). No long-running process reconciles in this mode, so each
//! createRuntime releases such pods before it admits.
//!
//! Like the plugin's release, a pod's claims go only after its teardown: VF
//! restore, then GPU cleanup ([`crate::gpu::GpuTeardown`] through
//! [`ContainerOs::gpu_teardown`]). What cannot be cleaned is quarantined in
//! the ledger instead of being handed to the next pod.

use super::liveness;
use super::standalone::{ContainerOs, HooksOnlyError};
use super::{HookEnv, HookError, Outcome, State};
use crate::config::Config;
use crate::ledger::{DeviceId, Ledger, PodRecord, PodRef};

/// Quarantines the pod's VFs after a failed restore: they may sit half
/// configured in a namespace, so they stay out of service until someone looks.
fn quarantine_vfs(ledger: &Ledger, pod: &PodRecord, reason: &str) {
    for claim in &pod.claims {
        if let DeviceId::Vf(_) = claim.device {
            match ledger.quarantine(&claim.device, reason) {
                Ok(()) => {
                    tracing::warn!(pod = %pod.pod, device = %claim.device, reason, "vf quarantined")
                }
                Err(e) => {
                    tracing::error!(pod = %pod.pod, device = %claim.device, error = %e, "vf not quarantined")
                }
            }
        }
    }
}

/// Releases the pod when no container of it is left; true when released.
fn release_if_empty(
    ledger: &Ledger,
    config: &Config,
    os: &mut dyn ContainerOs,
    sandbox_id: &str,
) -> Result<bool, HooksOnlyError> {
    let empty = ledger
        .snapshot()?
        .pods
        .get(sandbox_id)
        .is_some_and(|p| p.containers.is_empty());
    if !empty {
        return Ok(false);
    }
    release_pod(ledger, config, os, sandbox_id)
}

fn release_pod(
    ledger: &Ledger,
    config: &Config,
    os: &mut dyn ContainerOs,
    sandbox_id: &str,
) -> Result<bool, HooksOnlyError> {
    let teardown = os.gpu_teardown(config, ledger);
    let released = ledger.release_pod(sandbox_id, teardown.as_ref())?;
    // A failed teardown left the claims in place and quarantined the devices.
    if let Some((pod, reason)) = released.failed.into_iter().next() {
        return Err(HooksOnlyError::Teardown {
            pod: pod.to_string(),
            reason,
        });
    }
    Ok(!released.pods.is_empty())
}

/// Forgets the container and releases the pod when it was its last. Used
/// when a create fails after the claim: nothing reached a GPU yet, but the
/// teardown is cheap and keeps one path.
pub(super) fn forget(
    ledger: &Ledger,
    config: &Config,
    os: &mut dyn ContainerOs,
    sandbox_id: &str,
    container_id: &str,
) -> Result<bool, HooksOnlyError> {
    ledger.remove_container(sandbox_id, container_id)?;
    release_if_empty(ledger, config, os, sandbox_id)
}

/// poststop: restore the container's VFs, forget it, and release the pod
/// with its last container.
pub(super) fn stop(
    state: &State,
    env: &HookEnv,
    config: &Config,
    os: &mut dyn ContainerOs,
    checkpoint: &dyn Fn(&'static str),
) -> Result<Outcome, HookError> {
    let ledger = Ledger::open(&env.state_dir).map_err(HooksOnlyError::from)?;
    // The pod is found by the container, not by annotations: poststop may see fewer.
    let pod = ledger
        .snapshot()
        .map_err(HooksOnlyError::from)?
        .pods
        .into_values()
        .find(|p| p.containers.contains_key(&state.id));
    let networks = match os.detach(&state.id, checkpoint) {
        Ok(n) => n,
        Err(e) => {
            // The record and claims stay, so a later release retries.
            if let Some(pod) = &pod {
                quarantine_vfs(&ledger, pod, &crate::netdev::chain(&e));
            }
            return Err(e);
        }
    };
    let pod_released = match pod {
        Some(pod) => forget(&ledger, config, os, &pod.pod.sandbox_id, &state.id)?,
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

/// A pod whose every container has a recorded init that has exited.
fn is_stale(env: &HookEnv, pod: &PodRecord) -> bool {
    !pod.containers.is_empty()
        && pod.containers.values().all(|c| {
            c.init
                .as_ref()
                .is_some_and(|init| liveness::is_gone(&env.roots.proc_root, init))
        })
}

/// Releases pods whose containers are all gone; the pods released. A pod
/// whose teardown fails keeps its claims (its devices quarantined) and does
/// not stop the caller: its own devices are decided by the ledger.
pub(super) fn reap_stale(
    env: &HookEnv,
    config: &Config,
    os: &mut dyn ContainerOs,
    ledger: &Ledger,
) -> Result<Vec<PodRef>, HooksOnlyError> {
    let stale: Vec<PodRecord> = ledger
        .snapshot()?
        .pods
        .into_values()
        .filter(|p| is_stale(env, p))
        .collect();
    let mut released = Vec::new();
    for pod in stale {
        let restored: Result<Vec<usize>, HookError> = pod
            .containers
            .keys()
            .map(|id| os.detach(id, &|_| {}))
            .collect();
        if let Err(e) = restored {
            let reason = crate::netdev::chain(&e);
            tracing::warn!(pod = %pod.pod, error = %reason, "stale pod: vf restore failed");
            quarantine_vfs(ledger, &pod, &reason);
            continue;
        }
        match release_pod(ledger, config, os, &pod.pod.sandbox_id) {
            Ok(_) => {
                tracing::info!(pod = %pod.pod, "stale pod released");
                released.push(pod.pod);
            }
            Err(e) => tracing::warn!(pod = %pod.pod, error = %e, "stale pod kept"),
        }
    }
    Ok(released)
}
