//! The ledger's records of a pod's containers: what was applied to which
//! container, and which container owns the pod's network (moved its VFs in).

use super::{ContainerRecord, Ledger, LedgerError, LedgerState, PodRecord};

impl Ledger {
    /// The container that moved (or is to move) the pod's VFs into its netns,
    /// if any; read without the lock.
    pub fn network_owner(&self, sandbox_id: &str) -> Result<Option<String>, LedgerError> {
        self.store
            .peek(|s| s.pods.get(sandbox_id).and_then(|p| p.network_owner.clone()))
    }

    /// The pod whose network `container_id` owns has it back on the host
    /// (poststop restored its VFs): no container owns it until the next one
    /// created moves the VFs in again. The container's record is kept, no
    /// longer vouching for a network.
    pub fn give_up_network(&self, container_id: &str) -> Result<(), LedgerError> {
        let owns = |s: &LedgerState| {
            s.pods
                .values()
                .any(|p| p.network_owner.as_deref() == Some(container_id))
        };
        if !self.store.peek(owns)? {
            return Ok(());
        }
        let mut txn = self.store.begin()?;
        let Some(pod) = txn
            .state
            .pods
            .values_mut()
            .find(|p| p.network_owner.as_deref() == Some(container_id))
        else {
            return Ok(());
        };
        pod.give_up_network(container_id);
        let sandbox_id = pod.pod.sandbox_id.clone();
        txn.commit_pod(&sandbox_id, &[container_id])
    }

    /// [`Ledger::give_up_network`] of `container_id` in the pod `sandbox_id`,
    /// unless a container not in `seen` joined the pod; whether none did
    /// (`Ok(true)` also where the container owned nothing). Containers that
    /// left meanwhile change nothing. A restore decided on `seen` gives the
    /// network up before it moves anything: a container admitted into the
    /// pod's network before this is found, and the caller leaves the VFs to
    /// it; one admitted after finds no owner, and is refused
    /// ([`LedgerError::NetworkReturned`]) or takes the network over, moving
    /// the VFs in once they are home.
    pub fn give_up_network_unless_joined(
        &self,
        sandbox_id: &str,
        container_id: &str,
        seen: &std::collections::BTreeSet<String>,
    ) -> Result<bool, LedgerError> {
        let given = self.give_up_network_unless(sandbox_id, container_id, seen, &|_| false)?;
        Ok(given == GiveUp::Given)
    }

    /// [`Ledger::give_up_network_unless_joined`], where `keep`, asked under
    /// the lock of the pod as it stands, can also keep the network (another
    /// of its containers runs on it), and a pod gone is told apart.
    pub fn give_up_network_unless(
        &self,
        sandbox_id: &str,
        container_id: &str,
        seen: &std::collections::BTreeSet<String>,
        keep: &dyn Fn(&PodRecord) -> bool,
    ) -> Result<GiveUp, LedgerError> {
        let mut txn = self.store.begin()?;
        let Some(pod) = txn.state.pods.get_mut(sandbox_id) else {
            return Ok(GiveUp::PodGone);
        };
        if !pod.containers.keys().all(|id| seen.contains(id)) || keep(pod) {
            return Ok(GiveUp::Kept);
        }
        if pod.network_owner.as_deref() != Some(container_id) {
            return Ok(GiveUp::Given);
        }
        pod.give_up_network(container_id);
        txn.commit_pod(sandbox_id, &[container_id])?;
        Ok(GiveUp::Given)
    }

    /// The network `container_id` gave up before a restore of its VFs that
    /// failed, taken back, its record vouching again for what it did
    /// (`before`), unless a container took the network over meanwhile: the
    /// VFs may sit in the pod, where its next container relies on them as
    /// the owner's, as [`Ledger::remove_container`] keeps an owner whose VFs
    /// are away. Whether it took the network back.
    pub fn take_network_back(
        &self,
        sandbox_id: &str,
        container_id: &str,
        before: &ContainerRecord,
    ) -> Result<bool, LedgerError> {
        let mut txn = self.store.begin()?;
        let Some(pod) = txn.state.pods.get_mut(sandbox_id) else {
            return Ok(false);
        };
        if pod.network_owner.is_some() {
            return Ok(false);
        }
        let Some(rec) = pod.containers.get_mut(container_id) else {
            return Ok(false);
        };
        rec.resolved.clone_from(&before.resolved);
        rec.resolved_sha256.clone_from(&before.resolved_sha256);
        pod.network_owner = Some(container_id.to_string());
        txn.commit_pod(sandbox_id, &[container_id])?;
        Ok(true)
    }

    /// Records what was applied to a container of a pod that holds claims.
    pub fn record_container(
        &self,
        sandbox_id: &str,
        container_id: &str,
        record: ContainerRecord,
    ) -> Result<(), LedgerError> {
        let mut txn = self.store.begin()?;
        let Some(pod) = txn.state.pods.get_mut(sandbox_id) else {
            return Ok(());
        };
        pod.put_container(container_id.to_string(), record);
        txn.commit_pod(sandbox_id, &[container_id])
    }

    /// Forgets a container record; the pod keeps its claims. The pod's
    /// network owner stays its owner while `vfs_away` says a VF it moved is
    /// still away from the host (its restore failed, or the hook was killed):
    /// the next container of the pod then finds them in the pod as the
    /// owner's, instead of being refused for a network no one holds until the
    /// pod goes (kubelet removes a dead container while its pod lives on).
    pub fn remove_container(
        &self,
        sandbox_id: &str,
        container_id: &str,
        vfs_away: &dyn Fn(&PodRecord) -> bool,
    ) -> Result<(), LedgerError> {
        // Most containers are not devgate's: answer those without the lock.
        let known = |s: &LedgerState| {
            s.pods.get(sandbox_id).is_some_and(|p| {
                p.containers.contains_key(container_id)
                    || p.network_owner.as_deref() == Some(container_id)
            })
        };
        // A container this process recorded is answered under the lock
        // straight away: checking the files first would only cost their stats.
        if self.store.peek_cached(known) != Some(true) && !self.store.peek(known)? {
            return Ok(());
        }
        self.remove(sandbox_id, container_id, vfs_away, false, None)
            .map(drop)
    }

    /// [`Ledger::remove_container`] of a container judged gone from its
    /// record `stale`, only while its record is still that one, decided under
    /// the lock. A runtime that reuses container ids (podman's `start` and
    /// `restart`) may have admitted the id again meanwhile, with a record of
    /// its own that must stay. Whether the stale record was removed.
    pub fn remove_container_if(
        &self,
        sandbox_id: &str,
        container_id: &str,
        stale: &ContainerRecord,
        vfs_away: &dyn Fn(&PodRecord) -> bool,
    ) -> Result<bool, LedgerError> {
        let removal = self.remove(sandbox_id, container_id, vfs_away, false, Some(stale))?;
        Ok(removal == Removal::Removed)
    }

    /// [`Ledger::remove_container`], unless the container is the only one its
    /// pod has left, decided under the lock: a pod's last record goes with its
    /// claims, in the release's one commit, so that a release cut short (the
    /// hook killed by the runtime's timeout) leaves the pod known by that
    /// container's init to the reap of exited pods. Two containers of a pod
    /// stopping together would otherwise each remove its own and leave the
    /// claims with no container, which nothing reaps.
    pub fn remove_container_unless_last(
        &self,
        sandbox_id: &str,
        container_id: &str,
        vfs_away: &dyn Fn(&PodRecord) -> bool,
    ) -> Result<Removal, LedgerError> {
        self.remove(sandbox_id, container_id, vfs_away, true, None)
    }

    fn remove(
        &self,
        sandbox_id: &str,
        container_id: &str,
        vfs_away: &dyn Fn(&PodRecord) -> bool,
        keep_last: bool,
        only_if: Option<&ContainerRecord>,
    ) -> Result<Removal, LedgerError> {
        let mut txn = self.store.begin()?;
        let Some(pod) = txn.state.pods.get_mut(sandbox_id) else {
            return Ok(Removal::Removed);
        };
        if keep_last && pod.containers.keys().all(|c| c == container_id) {
            return Ok(Removal::Last);
        }
        if only_if.is_some_and(|stale| pod.containers.get(container_id) != Some(stale)) {
            return Ok(Removal::Readmitted);
        }
        let removed = pod.remove_container(container_id);
        let was_owner = pod.network_owner.as_deref() == Some(container_id) && !vfs_away(pod);
        if was_owner {
            pod.network_owner = None;
        }
        if !removed && !was_owner {
            return Ok(Removal::Removed);
        }
        txn.commit_pod(sandbox_id, &[container_id])?;
        Ok(Removal::Removed)
    }
}

/// What [`Ledger::remove_container_unless_last`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The container has no record left (it had none, or its pod is gone).
    Removed,
    /// Kept: it is the last container its pod has (or the pod has none).
    Last,
    /// Kept: its record is not the one judged gone (the id admitted again).
    Readmitted,
}

/// What [`Ledger::give_up_network_unless`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// No container owns the pod's network now (or the one asked owned none).
    Given,
    /// The owner keeps it: a container joined the pod, or `keep` said so.
    Kept,
    /// The pod has no record: a release took it, VFs first.
    PodGone,
}
