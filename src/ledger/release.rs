//! Releasing pods: their teardown first, outside the lock, then their claims.

use std::collections::{HashMap, HashSet};

use super::rules::{drop_pod, lift_restored, prune_empty};
use super::unclean::keep_unclean;
use super::{
    release_lock, ContainerRecord, Failed, Ledger, LedgerError, LedgerState, PodRecord, Released,
    Teardown,
};

/// Pods taken for gone, each with the containers ever admitted into it when
/// so taken ([`PodRecord::admitted`]; `None` where the ledger could not tell).
pub type Gone = HashMap<String, Option<u32>>;

impl Ledger {
    /// Releases one pod after its teardown ran. Unknown pods are a no-op.
    pub fn release_pod(
        &self,
        sandbox_id: &str,
        teardown: &dyn Teardown,
    ) -> Result<Released, LedgerError> {
        self.release_where(teardown, |p| p.pod.sandbox_id == sandbox_id)
    }

    /// Releases pods taken for gone (by a Synchronize, or whose release
    /// failed before), each only while no container was admitted into it
    /// since: `pods` maps each to its [`PodRecord::admitted`] when so taken
    /// (`None` where unknown). A pod taken for gone that was not (a
    /// containerd 1.7 sandbox reported with pid 0) may have admitted one; it
    /// is live, and its stop releases it. Ids the ledger does not hold are
    /// skipped.
    pub fn release_pods(
        &self,
        pods: &Gone,
        teardown: &dyn Teardown,
    ) -> Result<Released, LedgerError> {
        self.release_where(teardown, |p| match pods.get(&p.pod.sandbox_id) {
            Some(Some(then)) => p.admitted() <= *then,
            Some(None) => true,
            None => false,
        })
    }

    /// The pods the ledger holds that the runtime no longer reports (`live` =
    /// sandbox ids it has), each with the containers admitted into it at this
    /// read, so that a pod admitted afterwards, or one a container joins
    /// afterwards, is never released as one of them. Pods of hooks-only mode (podman, or CRI-O
    /// without NRI on the same node) are never among them: no NRI runtime
    /// reports them, and their own hooks release them when their inits exit.
    pub fn stale_pods(&self, live: &HashSet<String>) -> Result<Gone, LedgerError> {
        self.stale_pods_and(live, |_| ()).map(|(stale, ())| stale)
    }

    /// [`Ledger::stale_pods`], and `also` of the same read of the ledger
    /// (Synchronize's report of containers running without their allocation).
    pub fn stale_pods_and<R>(
        &self,
        live: &HashSet<String>,
        also: impl FnOnce(&LedgerState) -> R,
    ) -> Result<(Gone, R), LedgerError> {
        self.store.peek(|s| {
            let stale = s
                .pods
                .values()
                // A pod with any container the plugin admitted is the
                // plugin's (a hooks-only reap needs every init recorded).
                .filter(|p| {
                    p.containers.is_empty() || p.containers.values().any(ContainerRecord::by_plugin)
                })
                .filter(|p| !live.contains(p.pod.sandbox_id.as_str()))
                .map(|p| (p.pod.sandbox_id.clone(), Some(p.admitted())))
                .collect();
            (stale, also(s))
        })
    }

    /// Writes the whole document when the journal holds lines, so that the
    /// document alone is the ledger.
    pub fn fold_journal(&self) -> Result<(), LedgerError> {
        let txn = self.store.begin()?;
        if txn.has_journal() {
            txn.commit()
        } else {
            txn.unchanged();
            Ok(())
        }
    }

    /// Releases the selected pods. Teardown runs outside the ledger lock (it may
    /// wait seconds for processes to exit, while container creation must answer
    /// the runtime within its request timeout); the pods keep their claims until
    /// it is done, so nobody can take a device before it is clean.
    fn release_where(
        &self,
        teardown: &dyn Teardown,
        select: impl Fn(&PodRecord) -> bool,
    ) -> Result<Released, LedgerError> {
        let chosen_now = || {
            self.store.peek(|s| {
                let pods = s.pods.values().filter(|p| select(p));
                pods.cloned().collect::<Vec<PodRecord>>()
            })
        };
        let chosen = chosen_now()?;
        if chosen.is_empty() {
            return Ok(Released::default());
        }
        // Held until the commit below; read again once held, since a release
        // of a pod sharing a device may have committed while this one waited.
        let _held = release_lock::lock_claimed(self.store.dir(), &chosen)?;
        // Only pods of the first read: one selected now that was not then
        // (its claim made while this release waited) holds devices not locked.
        let locked: HashSet<String> = chosen.into_iter().map(|p| p.pod.sandbox_id).collect();
        let mut chosen = chosen_now()?;
        chosen.retain(|p| locked.contains(&p.pod.sandbox_id));
        // Each pod is looked up again just before its teardown: one released
        // by another release while an earlier pod's teardown ran may have its
        // devices in a new pod's hands by now, and one a container joined
        // meanwhile is live (its processes are that container's).
        let mut outcomes: Vec<(PodRecord, Result<(), super::Unclean>)> = Vec::new();
        let mut joined_before = Vec::new();
        for pod in chosen {
            let id = &pod.pod.sandbox_id;
            match self
                .store
                .peek(|s| s.pods.get(id).map(|now| joined(&pod, now)))?
            {
                None => {}
                Some(true) => joined_before.push(pod),
                Some(false) => {
                    let outcome = teardown.teardown(&pod);
                    outcomes.push((pod, outcome));
                }
            }
        }
        let mut committed = self.commit_released(&outcomes);
        match &mut committed {
            // The pods keep their claims: their teardown's notes are undone.
            Err(_) => outcomes.iter().for_each(|(pod, _)| teardown.kept(pod)),
            Ok(released) => {
                released.joined.iter().for_each(|pod| {
                    tracing::warn!(pod = %pod.pod, sandbox = %pod.pod.sandbox_id, "a container joined the pod during its release: its claims stay");
                    teardown.kept(pod);
                });
                for pod in joined_before {
                    tracing::warn!(pod = %pod.pod, sandbox = %pod.pod.sandbox_id, "a container joined the pod before its teardown: its claims stay, nothing torn down");
                    released.joined.push(pod);
                }
            }
        }
        committed
    }

    /// The ledger's side of [`Self::release_where`], under the lock: each pod
    /// torn down, as its teardown went.
    fn commit_released(
        &self,
        outcomes: &[(PodRecord, Result<(), super::Unclean>)],
    ) -> Result<Released, LedgerError> {
        let mut txn = self.store.begin()?;
        let mut out = Released::default();
        for (pod, outcome) in outcomes {
            // A container admitted while the teardown ran (a pod the runtime
            // reported gone at Synchronize that was not: a containerd 1.7
            // sandbox whose task it could not look up has pid 0) uses the
            // claims: dropped, its devices would go to the next pod under
            // it. As a guarded release does (`commit_guarded`), such a pod
            // keeps every claim, the clean ones of a failed teardown too.
            let joined = txn
                .state
                .pods
                .get(&pod.pod.sandbox_id)
                .is_some_and(|now| joined(pod, now));
            if joined {
                out.joined.push(pod.clone());
            }
            match outcome {
                Ok(()) if joined => {}
                Ok(()) => {
                    drop_pod(&mut txn.state, &pod.pod.sandbox_id);
                    lift_restored(&mut txn.state, &pod.pod.sandbox_id, &pod.claims);
                    out.pods.push(pod.pod.clone());
                }
                // Released meanwhile by another release that succeeded: its
                // devices are clean, and a quarantine now would hold none.
                Err(_) if !txn.state.pods.contains_key(&pod.pod.sandbox_id) => {}
                // The devices it could not clean stay the pod's, quarantined,
                // for the retry; the others are handed back now.
                Err(unclean) => {
                    let sandbox = &pod.pod.sandbox_id;
                    let kept = keep_unclean(&mut txn.state, sandbox, &pod.claims, unclean, !joined);
                    out.failed.push(Failed {
                        pod: pod.pod.clone(),
                        reason: unclean.reason.clone(),
                        kept,
                        admitted: pod.admitted(),
                    });
                }
            }
        }
        prune_empty(&mut txn.state);
        txn.commit()?;
        Ok(out)
    }
}

/// Whether a container joined the pod since its record `then` was read: its
/// record `now` counts more admissions, or holds a container `then` did not.
/// The count also catches one admitted and removed in between (a creation
/// that failed after the plugins answered): it proved the pod live.
fn joined(then: &PodRecord, now: &PodRecord) -> bool {
    now.admitted() > then.admitted()
        || now
            .containers
            .keys()
            .any(|c| !then.containers.contains_key(c))
}

/// These ids taken for gone with no count: released whatever joined them.
#[cfg(test)]
pub fn gone(ids: &[&str]) -> Gone {
    ids.iter().map(|id| (id.to_string(), None)).collect()
}
