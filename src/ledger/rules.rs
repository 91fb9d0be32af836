//! The rules of the ledger document, applied inside a transaction: who may
//! claim what, quarantine, and dropping a pod's holds.

use super::model::*;
use super::{now_unix, LedgerError};

/// Claims in `state`; the claimed devices' keys when this call made the claim
/// (for its journal line), `None` when nothing changed. An empty claim list
/// records nothing: pods without devices leave no trace.
pub(super) fn claim_in(
    state: &mut LedgerState,
    pod: &PodRef,
    claims: &[Claim],
) -> Result<Option<Vec<String>>, LedgerError> {
    if claims.is_empty() {
        return Ok(None);
    }
    if let Some(c) = duplicate(claims) {
        return Err(LedgerError::DuplicateClaim {
            device: c.device.clone(),
        });
    }
    if let Some(existing) = state.pods.get(&pod.sandbox_id) {
        if same_claims(&existing.claims, claims) {
            return Ok(None);
        }
        return Err(mismatch(state, existing, pod, claims));
    }
    // Each device's key formatted once, for the checks, the records and the line.
    let keys: Vec<String> = claims.iter().map(|c| c.device.to_string()).collect();
    for (claim, key) in claims.iter().zip(&keys) {
        check_claim(state, claim, key)?;
    }
    for (claim, key) in claims.iter().zip(&keys) {
        let record = state
            .devices
            .entry(key.clone())
            .or_insert_with(|| DeviceRecord {
                device: claim.device.clone(),
                holders: Vec::new(),
                quarantine: None,
            });
        record.holders.push(Holder {
            sandbox_id: pod.sandbox_id.clone(),
            share: claim.share,
        });
    }
    state.pods.insert(
        pod.sandbox_id.clone(),
        PodRecord {
            pod: pod.clone(),
            claims: claims.to_vec(),
            claimed_unix: now_unix(),
            containers: Default::default(),
            network_owner: None,
            admitted: 0,
        },
    );
    Ok(Some(keys))
}

/// Why a pod's claims differ from the record's: a partial release (every
/// recorded device among the asked and quarantined) is said as such.
fn mismatch(
    state: &LedgerState,
    existing: &PodRecord,
    pod: &PodRef,
    claims: &[Claim],
) -> LedgerError {
    let quarantine = |c: &Claim| {
        let rec = state.devices.get(&c.device.to_string())?;
        rec.quarantine.as_ref().map(|q| q.reason.clone())
    };
    let kept = existing
        .claims
        .iter()
        .all(|c| claims.iter().any(|n| n.device == c.device) && quarantine(c).is_some());
    match existing.claims.first().and_then(quarantine) {
        Some(reason) if kept && existing.claims.len() < claims.len() => {
            LedgerError::ReleaseFailed {
                pod: pod.to_string(),
                devices: existing
                    .claims
                    .iter()
                    .map(|c| c.device.to_string())
                    .collect(),
                reason,
            }
        }
        _ => {
            let (device, held) = match first_missing(claims, &existing.claims) {
                Some(c) => (c.device.clone(), false),
                None => {
                    let held_only = first_missing(&existing.claims, claims);
                    // Not reached (`same_claims` compares devices alone, and
                    // a device named twice is refused before): the first.
                    let c = held_only.or(claims.first()).or(existing.claims.first());
                    (
                        c.map(|c| c.device.clone())
                            .unwrap_or(DeviceId::Gpu(String::new())),
                        held_only.is_some(),
                    )
                }
            };
            LedgerError::ClaimMismatch {
                pod: pod.to_string(),
                device,
                held,
            }
        }
    }
}

/// The first of `claims` whose device `others` does not name.
fn first_missing<'a>(claims: &'a [Claim], others: &[Claim]) -> Option<&'a Claim> {
    claims
        .iter()
        .find(|c| !others.iter().any(|o| o.device == c.device))
}

/// The same devices; their shares are the recorded ones. A pod's annotation
/// does not change, so shares differ only where a release of devgate counts
/// them otherwise than the one that admitted the pod (a memory-only GPU entry
/// counts no core since 0.1): its further containers are admitted as before.
fn same_claims(a: &[Claim], b: &[Claim]) -> bool {
    // A pod's containers take their claims from one plan, so the lists come
    // in the same order: compared as they are first, without sorting copies.
    a.len() == b.len()
        && (a.iter().zip(b).all(|(x, y)| x.device == y.device)
            || sorted_devices(a) == sorted_devices(b))
}

/// A claim naming a device an earlier one names. Claim lists are a pod's
/// devices (at most the annotation's `MAX_ENTRIES` of them, usually a few):
/// short lists are compared pairwise, which allocates and hashes nothing.
fn duplicate(claims: &[Claim]) -> Option<&Claim> {
    const PAIRWISE: usize = 32;
    if claims.len() <= PAIRWISE {
        return claims
            .iter()
            .enumerate()
            .find(|(i, c)| claims[..*i].iter().any(|e| e.device == c.device))
            .map(|(_, c)| c);
    }
    let mut seen = std::collections::HashSet::with_capacity(claims.len());
    claims.iter().find(|c| !seen.insert(&c.device))
}

fn sorted_devices(claims: &[Claim]) -> Vec<&DeviceId> {
    let mut d: Vec<&DeviceId> = claims.iter().map(|c| &c.device).collect();
    d.sort();
    d
}

/// `key`: the device's key in `state.devices`.
fn check_claim(state: &LedgerState, claim: &Claim, key: &str) -> Result<(), LedgerError> {
    check_pf_and_vfs(state, claim)?;
    let record = state.devices.get(key);
    // A share is held to 100 even where the device has no holder yet: the
    // parser bounds each share, and the ledger keeps its own rule.
    let holders = record.map_or(&[][..], |r| r.holders.as_slice());
    if let Some(q) = record.and_then(|r| r.quarantine.as_ref()) {
        return Err(LedgerError::Quarantined {
            device: claim.device.clone(),
            reason: q.reason.clone(),
        });
    }
    let other = |h: &Holder| -> String {
        state
            .pods
            .get(&h.sandbox_id)
            .map(|p| p.pod.to_string())
            .unwrap_or_else(|| h.sandbox_id.clone())
    };
    let (mut core, mut mem) = match claim.share {
        Share::Exclusive => {
            if let Some(h) = holders.first() {
                return Err(LedgerError::Held {
                    device: claim.device.clone(),
                    holder: other(h),
                });
            }
            return Ok(());
        }
        Share::Shared { core, memory_ratio } => (core, memory_ratio),
    };
    for h in holders {
        match h.share {
            Share::Exclusive => {
                return Err(LedgerError::Held {
                    device: claim.device.clone(),
                    holder: other(h),
                })
            }
            Share::Shared {
                core: c,
                memory_ratio: m,
            } => {
                core = core.saturating_add(c);
                mem = mem.saturating_add(m);
            }
        }
    }
    if core > 100 || mem > 100 {
        return Err(LedgerError::Overcommitted {
            device: claim.device.clone(),
            core,
            memory_ratio: mem,
        });
    }
    Ok(())
}

/// A VF whose PF another pod holds whole, or a PF to be held whole one of
/// whose VFs another pod holds: the scheduler never gives both (the whole PF
/// is its `koordinator.sh/rdma` 100), so an annotation asking for it is stale
/// or forged. Shared PFs (below 100) and VFs add up in the scheduler only.
fn check_pf_and_vfs(state: &LedgerState, claim: &Claim) -> Result<(), LedgerError> {
    let conflict = |other: DeviceId, sandbox_id: &str| LedgerError::HeldWithPf {
        device: claim.device.clone(),
        other,
        holder: state.holder_name(sandbox_id),
    };
    match (&claim.device, claim.share, claim.pf) {
        (DeviceId::Vf(_), _, Some(pf)) => {
            let whole = DeviceId::Pf(pf);
            let held = state
                .devices
                .get(&whole.to_string())
                .and_then(|r| r.holders.iter().find(|h| h.share == Share::Exclusive));
            match held {
                Some(h) => Err(conflict(whole, &h.sandbox_id)),
                None => Ok(()),
            }
        }
        (DeviceId::Pf(pf), Share::Exclusive, _) => {
            for (sandbox_id, rec) in &state.pods {
                if let Some(vf) = rec.claims.iter().find(|c| c.pf == Some(*pf)) {
                    return Err(conflict(vf.device.clone(), sandbox_id));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Names the PF of each VF claim recorded without one (claims made before
/// `Claim::pf` existed), from `pf_of`; how many it named.
pub(super) fn backfill_pfs(
    state: &mut LedgerState,
    pf_of: &dyn Fn(crate::inventory::PciAddr) -> Option<crate::inventory::PciAddr>,
) -> usize {
    let mut named = 0;
    for claim in state.pods.values_mut().flat_map(|p| p.claims.iter_mut()) {
        match claim.device {
            DeviceId::Vf(vf) if claim.lacks_pf() => {
                claim.pf = pf_of(vf);
                named += usize::from(claim.pf.is_some());
            }
            _ => {}
        }
    }
    named
}

/// The pods `gone` names whose leaving lets `pod` claim `claims`, found by
/// a dry run on a copy of `state` without them: the dry run's refusal where
/// the claim is refused even then (a live holder, a quarantine, another set
/// of devices), empty where it fits now. Only pods holding a device of the claims, the PF
/// of one of its VFs or a VF of one of its PFs are taken out: no other hold
/// refuses it (see `check_claim`).
pub(super) fn fits_without(
    state: &LedgerState,
    pod: &PodRef,
    claims: &[Claim],
    gone: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>, LedgerError> {
    let touches = |rec: &PodRecord| {
        rec.claims.iter().any(|held| {
            claims.iter().any(|c| {
                held.device == c.device
                    || held.pf.is_some_and(|pf| c.device == DeviceId::Pf(pf))
                    || c.pf.is_some_and(|pf| held.device == DeviceId::Pf(pf))
            })
        })
    };
    let leaving: Vec<String> = state
        .pods
        .iter()
        .filter(|(id, rec)| **id != pod.sandbox_id && gone(id) && touches(rec))
        .map(|(id, _)| id.clone())
        .collect();
    let mut without = state.clone();
    for id in &leaving {
        drop_pod(&mut without, id);
    }
    claim_in(&mut without, pod, claims).map(|_| leaving)
}

/// Why `claim` could not be made beside what `state` holds, for the
/// PF-and-VF rule alone (a dry run, for `devgate plan`).
pub fn pf_vf_conflict(state: &LedgerState, claim: &Claim) -> Option<LedgerError> {
    check_pf_and_vfs(state, claim).err()
}

/// Quarantines `device` for `reason`: pod `by`'s own processes that
/// outlived its teardown, or (`None`) anything else; a quarantine in force
/// keeps its reason, and stays set by one pod only while no other cause
/// joined it.
pub(super) fn quarantine_in(
    state: &mut LedgerState,
    device: &DeviceId,
    reason: &str,
    by: Option<&str>,
) {
    let rec = state
        .devices
        .entry(device.to_string())
        .or_insert_with(|| DeviceRecord {
            device: device.clone(),
            holders: Vec::new(),
            quarantine: None,
        });
    match &mut rec.quarantine {
        None => {
            rec.quarantine = Some(Quarantine {
                reason: reason.to_string(),
                since_unix: now_unix(),
                set_by: by.map(str::to_string),
            });
        }
        Some(q) if q.set_by.as_deref() != by => q.set_by = None,
        Some(_) => {}
    }
}

pub(super) fn drop_pod(state: &mut LedgerState, sandbox_id: &str) {
    state.pods.remove(sandbox_id);
    for rec in state.devices.values_mut() {
        rec.holders.retain(|h| h.sandbox_id != sandbox_id);
    }
}

/// Takes `claims` from the pod: their devices were cleaned while others of
/// the pod were not (see `unclean`), so they go back as a release returns them.
pub(super) fn drop_claims(state: &mut LedgerState, sandbox_id: &str, claims: &[Claim]) {
    let gone = |d: &DeviceId| claims.iter().any(|c| &c.device == d);
    if let Some(pod) = state.pods.get_mut(sandbox_id) {
        pod.claims.retain(|c| !gone(&c.device));
    }
    for rec in state.devices.values_mut().filter(|r| gone(&r.device)) {
        rec.holders.retain(|h| h.sandbox_id != sandbox_id);
    }
}

/// Pod `sandbox_id`'s teardown of `claims` succeeded (the pod, or these
/// claims, already dropped): its NICs (VFs, PFs) are back as they were, so a
/// quarantine a failed earlier attempt put on them ends with it, once nobody
/// holds them. A GPU nobody holds stays quarantined: the GPU retry cleans it
/// first (`gpu::GpuTeardown::retry_quarantined`), since a GPU can also be
/// quarantined for what the teardown found on it. A GPU other pods still
/// share, quarantined by this pod's failure alone (its leftover process),
/// is as a first successful release would have left it, the last holder's
/// release cleaning it: it goes back to them, rather than stay refused to
/// new shares until they all end.
pub(super) fn lift_restored(state: &mut LedgerState, sandbox_id: &str, claims: &[Claim]) {
    for claim in claims {
        let Some(rec) = state.devices.get_mut(&claim.device.to_string()) else {
            continue;
        };
        let lift = match claim.device {
            DeviceId::Gpu(_) => {
                !rec.holders.is_empty()
                    && rec
                        .quarantine
                        .as_ref()
                        .is_some_and(|q| q.set_by.as_deref() == Some(sandbox_id))
            }
            _ => rec.holders.is_empty(),
        };
        if lift {
            rec.quarantine = None;
        }
    }
}

pub(super) fn prune_empty(state: &mut LedgerState) {
    state
        .devices
        .retain(|_, r| !r.holders.is_empty() || r.quarantine.is_some());
}
