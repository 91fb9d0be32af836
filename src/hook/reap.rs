//! Hooks-only reaping of exited pods: a createRuntime releases pods whose
//! containers all exited without a poststop (the runtime or host crashed,
//! the hook was killed) before it admits, since no long-running process
//! reconciles in this mode. Each pod goes through the same guarded release
//! as a poststop's ([`super::release`]).

use std::time::Instant;

use super::kept_network::give_up_holding_turns;
use super::liveness;
use super::release::{quarantine_vfs, release_guarded};
use super::standalone::{HooksOnly, HooksOnlyError};
use super::{HookEnv, HookError};
use crate::ledger::{DeviceLocks, GiveUp, Ledger, LedgerError, PodRecord, PodRef};

/// A pod whose every container has a recorded init that has exited.
fn is_stale(env: &HookEnv, pod: &PodRecord) -> bool {
    !pod.containers.is_empty()
        && pod.containers.values().all(|c| {
            c.init
                .as_ref()
                .is_some_and(|init| liveness::is_gone(&env.roots.proc_root, init))
        })
}

/// The stale `pod`'s network given up under its VFs' release turns, before
/// they go home, as a poststop does ([`super::kept_network::give_up_in_turn`]):
/// a container admitted into the pod to run on them came before (the pod
/// changed, and is left to it) or finds no owner, never the VFs going home
/// under it. The pod as given up (what the release compares) and the turns;
/// `None` where the pod changed or a hook or a release holds a turn (this
/// create waits on neither).
fn give_up(
    ledger: &Ledger,
    mut pod: PodRecord,
) -> Result<Option<(PodRecord, DeviceLocks)>, LedgerError> {
    let vfs: Vec<_> = pod.vfs().collect();
    let owner = pod.network_owner.clone().unwrap_or_default();
    // A container podman started again under a judged id since the
    // snapshot has a record of its own: the pod changed.
    let changed = |now: &PodRecord| now.containers != pod.containers;
    let Some(turns) = ledger.try_lock_vfs(&vfs)? else {
        tracing::debug!(pod = %pod.pod, "stale pod: a hook or a release holds its vfs");
        return Ok(None);
    };
    match give_up_holding_turns(ledger, &pod, &owner, &changed)? {
        GiveUp::Given => {
            pod.give_up_network(&owner);
            Ok(Some((pod, turns)))
        }
        GiveUp::Kept => {
            tracing::debug!(pod = %pod.pod, "stale pod: its containers changed meanwhile");
            Ok(None)
        }
        GiveUp::PodGone => Ok(None),
    }
}

/// Where this hook starts among the other exited pods: the clock's
/// nanoseconds, which differ from one hook to the next.
fn rotation() -> usize {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize)
}

/// Releases pods whose containers are all gone; the pods released. A pod
/// whose teardown fails keeps its claims (its devices quarantined) and does
/// not stop the caller: its own devices are decided by the ledger.
///
/// The creating container's own pod (`own`, its sandbox id) goes first and
/// always: its new container needs what the exited ones held. Others go
/// until [`HooksOnly::reap_until`], at least one tried per call and from a
/// point that moves from call to call, so that successive hooks work through
/// a backlog even past a pod whose release keeps failing; the rest wait for
/// the next hook, and a container that needs their devices is refused until
/// then (kubelet retries).
pub(super) fn reap_stale(
    run: &mut HooksOnly<'_>,
    ledger: &Ledger,
    own: &str,
) -> Result<Vec<PodRef>, HooksOnlyError> {
    let stale: Vec<PodRecord> = ledger
        .snapshot()?
        .pods
        .into_values()
        .filter(|p| is_stale(run.env, p))
        .collect();
    let (mut order, mut others): (Vec<PodRecord>, Vec<PodRecord>) =
        stale.into_iter().partition(|p| p.pod.sandbox_id == own);
    // The others from a point that moves from hook to hook: a pod whose
    // release keeps failing stays exited, and would otherwise take every
    // hook's first turn, leaving those after it for good.
    if !others.is_empty() {
        let turn = rotation() % others.len();
        others.rotate_left(turn);
    }
    order.extend(others);
    let mut released = Vec::new();
    let mut tried = 0;
    let total = order.len();
    for (done, pod) in order.into_iter().enumerate() {
        let mine = pod.pod.sandbox_id == own;
        if !mine && tried > 0 && Instant::now() >= run.reap_until {
            tracing::warn!(
                left = total - done,
                "exited pods left for a later hook: this one's time for them is spent"
            );
            break;
        }
        // Whether to go on with the pod after a look at the ledger that had
        // to say `want`. The creating container's own pod fails its create
        // on a ledger error; another pod's trouble fails no create (logged,
        // left for a later hook).
        let id = pod.pod.clone();
        let kept = |e: LedgerError| {
            if mine {
                return Err(HooksOnlyError::from(e));
            }
            tracing::warn!(pod = %id, error = %nri::ErrorChain(&e), "stale pod kept");
            Ok(())
        };
        let go_on = |read: Result<bool, LedgerError>, want: bool, why: &str| match read {
            Ok(said) if said == want => Ok(true),
            Ok(_) => {
                tracing::debug!(pod = %id, "stale pod: {why}");
                Ok(false)
            }
            Err(e) => kept(e).map(|()| false),
        };
        // Its last container's poststop (or another reap) is releasing it,
        // or a hook holds its VFs' turns to move them: that one finishes,
        // and this create does not wait on it.
        let why = "a release of it, or a move of its vfs, runs";
        if !go_on(ledger.releasing(&pod), false, why)? {
            continue;
        }
        if !mine {
            tried += 1;
        }
        // Read again before its VFs come home: podman may have started a
        // container again under an exited one's id since the snapshot, and
        // its VFs are its own. The release below checks under the lock.
        let why = "its containers changed meanwhile";
        if !go_on(ledger.unchanged_since(&pod), true, why)? {
            continue;
        }
        // Before the network is given up, which makes it no one's.
        let forgotten = pod.forgotten_owner().cloned();
        let given = match give_up(ledger, pod) {
            Ok(given) => given,
            Err(e) => {
                kept(e)?;
                None
            }
        };
        let Some((pod, turns)) = given else {
            continue;
        };
        // Each container's VFs are tried, whichever failed before: one
        // restore failing leaves the others' records for no later round.
        let mut restored: Result<(), HookError> = Ok(());
        for id in pod.containers.keys().chain(forgotten.as_ref()) {
            if let Err(e) = run.os.detach(id, &|_| {}) {
                restored = restored.and(Err(e));
            }
        }
        // The release takes the pod's device locks itself.
        drop(turns);
        if let Err(e) = restored {
            let reason = nri::ErrorChain(&e).to_string();
            tracing::warn!(pod = %pod.pod, error = %reason, "stale pod: vf restore failed");
            quarantine_vfs(ledger, &pod, &reason);
            continue;
        }
        match release_guarded(run, ledger, &pod) {
            Ok(true) => {
                tracing::info!(pod = %pod.pod, "stale pod released");
                released.push(pod.pod);
            }
            // A container joined meanwhile: the pod stays with it, without
            // the exited ones (their VFs are back, their network role free).
            // A container admitted again under an exited one's id keeps its
            // record.
            Ok(false) => {
                for (id, record) in &pod.containers {
                    let away = |p: &PodRecord| run.env.vfs_away(p);
                    if let Err(e) =
                        ledger.remove_container_if(&pod.pod.sandbox_id, id, record, &away)
                    {
                        tracing::warn!(pod = %pod.pod, container = %id, error = %nri::ErrorChain(&e), "exited container not forgotten");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(pod = %pod.pod, error = %nri::ErrorChain(&e), "stale pod kept")
            }
        }
    }
    Ok(released)
}
