//! The pods whose release failed, for the retry round.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::Release;
use crate::ledger::Released;

/// Pods whose teardown failed: they keep their claims, quarantined, and the
/// retry thread tries them again, since no further event may come for them
/// (RemovePodSandbox was their last). A restart finds them at Synchronize.
/// Each with the containers ever admitted into it when its release failed
/// (`None` where the ledger could not tell): a retry leaves a pod that
/// admitted one since, which is live (taken for gone, it was not) and is
/// released by its stop.
#[derive(Default)]
pub struct Unreleased(Mutex<HashMap<String, Option<u32>>>);

impl Unreleased {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<u32>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the outcome of a release of `which`: `None` when the ledger
    /// could not be read or written, so that every pod of it is tried again.
    pub fn update(&self, which: &Release, released: Option<&Released>) {
        let mut pods = self.lock();
        let Some(released) = released else {
            for (id, admitted) in which.pods() {
                match admitted {
                    // A release no count guards (a stop's or a removal's):
                    // the pod is gone whatever it admitted, so no count
                    // kept from an earlier release may guard its retry.
                    None => {
                        pods.insert(id.clone(), None);
                    }
                    Some(_) => {
                        pods.entry(id.clone()).or_insert(admitted);
                    }
                }
            }
            return;
        };
        which.ids().for_each(|id| {
            pods.remove(id);
        });
        // A pod a container joined is live: its stop's release tears it
        // down, never a retry that would drop it under that container.
        let joined = |id: &str| released.joined.iter().any(|p| p.pod.sandbox_id == id);
        pods.extend(
            released
                .failed
                .iter()
                .filter(|f| !joined(&f.pod.sandbox_id))
                .map(|f| (f.pod.sandbox_id.clone(), Some(f.admitted))),
        );
    }

    /// A release of `id` failed, the pod having admitted `admitted`
    /// containers then.
    pub fn failed(&self, id: &str, admitted: u32) {
        self.lock().insert(id.to_string(), Some(admitted));
    }

    #[cfg(test)]
    pub fn pending(&self) -> std::collections::HashSet<String> {
        self.lock().keys().cloned().collect()
    }

    /// The release that tries every pending pod again, if any.
    pub fn retry(&self) -> Option<Release> {
        let pods = self.lock();
        (!pods.is_empty()).then(|| Release::Pods(pods.clone()))
    }
}
