//! What a failed teardown left unclean, so that a release keeps and
//! quarantines those devices only and hands the pod's others back.
//!
//! One GPU that fell off the bus, or one VF whose restore failed, must not
//! keep the seven other GPUs of an eight-GPU pod out of service until an
//! operator steps in: each device's teardown stands on its own (a GPU's
//! processes are ended and it is reset by itself; a VF is restored by itself).

use std::collections::BTreeSet;

use super::rules::{drop_claims, lift_restored, quarantine_in};
use super::{Claim, DeviceId, LedgerState};

/// A failed teardown: why, and which of the pod's devices it could not clean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unclean {
    pub reason: String,
    /// The devices left unclean; `None` when the teardown cannot tell, which
    /// keeps every device of the pod.
    pub devices: Option<BTreeSet<DeviceId>>,
    /// The devices whose only fault is the pod's own processes left on them
    /// (they outlived being ended): nothing of the device itself (a reset,
    /// an outside user) is in doubt, so that pod's later successful release
    /// ends the quarantine of such a GPU others still share
    /// (`rules::lift_restored`). Told per device: another device's reset
    /// failing in the same release puts no doubt on this one.
    pub pods_own: BTreeSet<DeviceId>,
}

impl Unclean {
    /// Every device of the pod is in doubt.
    pub fn all(reason: impl Into<String>) -> Unclean {
        Unclean {
            reason: reason.into(),
            devices: None,
            pods_own: BTreeSet::new(),
        }
    }

    /// Only `devices` are in doubt.
    pub fn of(devices: impl IntoIterator<Item = DeviceId>, reason: impl Into<String>) -> Unclean {
        Unclean {
            reason: reason.into(),
            devices: Some(devices.into_iter().collect()),
            pods_own: BTreeSet::new(),
        }
    }

    /// Says which of its devices only the pod's own processes were left on.
    pub fn pods_own(self, devices: impl IntoIterator<Item = DeviceId>) -> Unclean {
        let named = |d: &DeviceId| self.devices.as_ref().is_some_and(|all| all.contains(d));
        let pods_own = devices.into_iter().filter(named).collect();
        Unclean { pods_own, ..self }
    }

    /// Its devices in doubt for more than the pod's own processes; `None`
    /// when it cannot tell which.
    fn doubted(&self) -> Option<BTreeSet<DeviceId>> {
        let devices = self.devices.as_ref()?;
        Some(devices.difference(&self.pods_own).cloned().collect())
    }

    /// Both failures: the reasons joined, the devices of either (all when
    /// either cannot tell); a device is the pod's own processes' alone when
    /// neither puts it in doubt otherwise.
    pub fn and(self, other: Unclean) -> Unclean {
        let pods_own = match (self.doubted(), other.doubted()) {
            (Some(a), Some(b)) => self
                .pods_own
                .union(&other.pods_own)
                .filter(|d| !a.contains(*d) && !b.contains(*d))
                .cloned()
                .collect(),
            _ => BTreeSet::new(),
        };
        let devices = match (self.devices, other.devices) {
            (Some(mut a), Some(b)) => {
                a.extend(b);
                Some(a)
            }
            _ => None,
        };
        Unclean {
            reason: format!("{}; {}", self.reason, other.reason),
            devices,
            pods_own,
        }
    }

    /// The pod's claims split into those kept (unclean) and those freed. A
    /// failure naming none of the claims keeps them all: a teardown that
    /// failed for a device it cannot place cleaned nothing for certain.
    pub fn split(&self, claims: &[Claim]) -> (Vec<Claim>, Vec<Claim>) {
        let Some(devices) = &self.devices else {
            return (claims.to_vec(), Vec::new());
        };
        let (kept, freed): (Vec<Claim>, Vec<Claim>) = claims
            .iter()
            .cloned()
            .partition(|c| devices.contains(&c.device));
        if kept.is_empty() {
            return (claims.to_vec(), Vec::new());
        }
        (kept, freed)
    }
}

impl From<String> for Unclean {
    fn from(reason: String) -> Unclean {
        Unclean::all(reason)
    }
}

impl From<&str> for Unclean {
    fn from(reason: &str) -> Unclean {
        Unclean::all(reason)
    }
}

/// Applies a failed teardown of `sandbox_id` (whose claims were `claims`
/// when it ran): the unclean devices are quarantined and stay the pod's,
/// for the retry; the clean ones leave the pod (`free`, when the pod may
/// give them up) as a successful release would leave them. Returns the
/// devices kept.
pub(super) fn keep_unclean(
    state: &mut LedgerState,
    sandbox_id: &str,
    claims: &[Claim],
    unclean: &Unclean,
    free: bool,
) -> Vec<DeviceId> {
    let (kept, freed) = unclean.split(claims);
    for claim in &kept {
        let by = unclean
            .pods_own
            .contains(&claim.device)
            .then_some(sandbox_id);
        quarantine_in(state, &claim.device, &unclean.reason, by);
    }
    if free && !freed.is_empty() {
        drop_claims(state, sandbox_id, &freed);
        lift_restored(state, sandbox_id, &freed);
    }
    kept.into_iter().map(|c| c.device).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Share;

    fn claim(device: DeviceId) -> Claim {
        Claim {
            device,
            share: Share::Exclusive,
            pf: None,
        }
    }

    fn gpu(uuid: &str) -> DeviceId {
        DeviceId::Gpu(uuid.to_string())
    }

    #[test]
    fn a_failure_keeps_the_devices_it_names() {
        let claims = [
            claim(gpu("GPU-1")),
            claim(gpu("GPU-2")),
            claim(gpu("GPU-3")),
        ];
        let cases: [(Unclean, &[&str], &[&str]); 4] = [
            (Unclean::all("x"), &["GPU-1", "GPU-2", "GPU-3"], &[]),
            (
                Unclean::of([gpu("GPU-2")], "x"),
                &["GPU-2"],
                &["GPU-1", "GPU-3"],
            ),
            // Names no claim of the pod: nothing is freed.
            (
                Unclean::of([gpu("GPU-9")], "x"),
                &["GPU-1", "GPU-2", "GPU-3"],
                &[],
            ),
            (
                Unclean::of([gpu("GPU-1")], "x").and(Unclean::of([gpu("GPU-3")], "y")),
                &["GPU-1", "GPU-3"],
                &["GPU-2"],
            ),
        ];
        for (unclean, kept, freed) in cases {
            let (k, f) = unclean.split(&claims);
            let names = |cs: &[Claim]| -> Vec<String> {
                cs.iter()
                    .map(|c| match &c.device {
                        DeviceId::Gpu(u) => u.clone(),
                        other => other.to_string(),
                    })
                    .collect()
            };
            assert_eq!(names(&k), kept, "{unclean:?}");
            assert_eq!(names(&f), freed, "{unclean:?}");
        }
    }

    /// A quarantine names the pod that set it only where its own processes
    /// alone were left, and no one pod once another cause joined it.
    #[test]
    fn a_quarantine_names_its_pod_only_for_that_pods_own_processes() {
        let claims = [claim(gpu("GPU-1"))];
        let set_by = |state: &LedgerState| {
            let q = state.devices["gpu GPU-1"].quarantine.clone();
            q.expect("quarantined").set_by
        };
        let stuck = |pods_own: bool| {
            let own = pods_own.then(|| gpu("GPU-1"));
            Unclean::of([gpu("GPU-1")], "x").pods_own(own)
        };
        for (pods_own, want) in [(true, Some("a")), (false, None)] {
            let mut state = LedgerState::default();
            keep_unclean(&mut state, "a", &claims, &stuck(pods_own), true);
            assert_eq!(set_by(&state).as_deref(), want);
            keep_unclean(&mut state, "a", &claims, &stuck(pods_own), true);
            assert_eq!(set_by(&state).as_deref(), want, "the same pod again");
            keep_unclean(&mut state, "b", &claims, &stuck(true), true);
            assert_eq!(set_by(&state), None, "another pod's failure joined it");
        }
        let mixed = stuck(true).and(Unclean::all("y"));
        assert!(mixed.pods_own.is_empty(), "the other side cannot tell");
    }

    /// Told per device: a GPU only the pod's own processes were left on keeps
    /// the pod's name on its quarantine, whatever failed on another device
    /// of the same release (a VF's restore, another GPU's reset); one that a
    /// second failure also names does not.
    #[test]
    fn another_devices_failure_leaves_a_gpu_the_pods_own() {
        let (x, y) = (gpu("GPU-X"), gpu("GPU-Y"));
        let claims = [claim(x.clone()), claim(y.clone())];
        let own_x = Unclean::of([x.clone()], "x survived").pods_own([x.clone()]);
        let y_reset = Unclean::of([y.clone()], "y reset failed");
        let both = own_x.clone().and(y_reset);
        assert_eq!(both.pods_own, BTreeSet::from([x.clone()]));
        let mut state = LedgerState::default();
        keep_unclean(&mut state, "a", &claims, &both, true);
        let set_by = |id: &str| state.devices[id].quarantine.clone().unwrap().set_by;
        assert_eq!(set_by("gpu GPU-X").as_deref(), Some("a"));
        assert_eq!(set_by("gpu GPU-Y"), None);
        let x_reset = Unclean::of([x.clone()], "x reset failed");
        assert!(own_x.and(x_reset).pods_own.is_empty());
    }

    #[test]
    fn either_side_that_cannot_tell_keeps_all() {
        let both = Unclean::of([gpu("GPU-1")], "gpu stuck").and(Unclean::all("vf stuck"));
        assert_eq!(both.devices, None);
        assert_eq!(both.reason, "gpu stuck; vf stuck");
        let both = Unclean::all("a").and(Unclean::of([gpu("GPU-1")], "b"));
        assert_eq!(both.devices, None);
    }
}
