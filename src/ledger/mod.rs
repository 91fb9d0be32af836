//! The claim ledger: which pod sandbox holds which device, crash-safe and shared by
//! the plugin and the hook processes (see `store` for the on-disk protocol).
//!
//! Rules: an exclusive device (a whole GPU, a VF, a PF) has one holder; a shared GPU
//! accepts holders while gpu-core and gpu-memory-ratio each sum to at most 100.
//! Claims are per sandbox and idempotent: a second container of the same pod
//! re-claiming the same devices changes nothing.

mod compose;
mod containers;
mod error;
mod guarded;
mod journal;
mod load;
mod model;
mod release;
mod release_lock;
mod rules;
mod store;
mod unclean;

use std::time::{SystemTime, UNIX_EPOCH};

pub use compose::Teardowns;
pub use containers::{GiveUp, Removal};
pub use error::LedgerError;
pub use guarded::GuardedRelease;
pub use model::*;
#[cfg(test)]
pub use release::gone;
pub use release::Gone;
pub use release_lock::DeviceLocks;
pub use rules::pf_vf_conflict;
pub use store::Store;
pub use unclean::Unclean;

use rules::{claim_in, drop_pod, lift_restored, prune_empty, quarantine_in};

/// What a container's admission does with the pod's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkNeed {
    /// The plan has no VFs to move.
    None,
    /// The container would move the pod's VFs in, if it is the network owner.
    Moves,
    /// The plan found the VFs in the pod already, moved by its network owner:
    /// admitted only while the pod still has one.
    InPod,
}

/// Work that must run before a pod's claims are dropped (VF restore, GPU cleanup).
/// An error keeps the pod's record, with the devices it names, so a later
/// reconcile retries them.
pub trait Teardown {
    fn teardown(&self, pod: &PodRecord) -> Result<(), Unclean>;

    /// The pod keeps its claims after [`Teardown::teardown`] ran for it: a
    /// container joined it meanwhile (a guarded release, see `guarded`), or
    /// the release's commit failed. What the teardown noted of the pod as
    /// gone is undone, so that no later release takes the devices the pod
    /// still holds for free of it. Nothing by default.
    fn kept(&self, _pod: &PodRecord) {}
}

/// A teardown with nothing to do.
pub struct NoTeardown;

impl Teardown for NoTeardown {
    fn teardown(&self, _pod: &PodRecord) -> Result<(), Unclean> {
        Ok(())
    }
}

/// What [`Ledger::admit`] decided for a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Admission {
    pub network_owner: bool,
    /// This transaction claimed the pod's devices: its first container.
    pub claimed: bool,
}

/// What a release did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Released {
    pub pods: Vec<PodRef>,
    /// Pods whose teardown failed.
    pub failed: Vec<Failed>,
    /// Pods a container joined while their teardown ran: they keep every
    /// claim (a failed teardown's unclean ones quarantined, as in `failed`).
    pub joined: Vec<PodRecord>,
}

/// A pod whose teardown failed: the devices it could not clean stay its,
/// quarantined (its others were released).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub pod: PodRef,
    pub reason: String,
    pub kept: Vec<DeviceId>,
    /// [`PodRecord::admitted`] as the release read the pod: a retry releases
    /// it only while no container was admitted since.
    pub admitted: u32,
}

/// The device ids of `vfs`, whose turns are their release locks.
fn vf_ids(vfs: &[crate::inventory::PciAddr]) -> Vec<DeviceId> {
    vfs.iter().map(|vf| DeviceId::Vf(*vf)).collect()
}

/// The ledger under one state directory.
#[derive(Debug, Clone)]
pub struct Ledger {
    store: Store,
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Ledger {
    pub fn open(dir: &std::path::Path) -> Result<Ledger, LedgerError> {
        Ok(Ledger {
            store: Store::open(dir)?,
        })
    }

    /// A consistent copy of the ledger, for status and tests.
    pub fn snapshot(&self) -> Result<LedgerState, LedgerError> {
        self.store.read_unlocked()
    }

    /// The sandbox ids holding `device`, read under the ledger's lock. A
    /// teardown asks whether its pod is a shared GPU's last holder while it
    /// holds the device's release lock; a new pod's claim checks that lock
    /// under the ledger's lock and commits before unlocking. Read under the
    /// same lock, the answer is from before that claim's check (which then
    /// finds the release running) or after its commit (which it then names):
    /// never a GPU reset as if no one else held it while a claim of it lands.
    pub fn holders_now(&self, device: &DeviceId) -> Result<Vec<String>, LedgerError> {
        let txn = self.store.begin()?;
        let holders = txn
            .state
            .devices
            .get(&device.to_string())
            .map(|r| r.holders.iter().map(|h| h.sandbox_id.clone()).collect())
            .unwrap_or_default();
        txn.unchanged();
        Ok(holders)
    }

    /// The ledger under `dir` for a reader: a missing directory is an empty
    /// ledger, and nothing is created (`devgate status` on a fresh node).
    pub fn read(dir: &std::path::Path) -> Result<LedgerState, LedgerError> {
        Store::at(dir).read_unlocked()
    }

    /// Claims `claims` for `pod`, all or nothing. Re-claiming the same set is a
    /// no-op. True when this call made the claim.
    pub fn claim(&self, pod: &PodRef, claims: &[Claim]) -> Result<bool, LedgerError> {
        let mut txn = self.store.begin()?;
        self.check_releasing(&txn.state, pod, claims)?;
        let claimed = claim_in(&mut txn.state, pod, claims)?;
        if let Some(keys) = &claimed {
            txn.commit_claim(&pod.sandbox_id, keys)?;
        }
        Ok(claimed.is_some())
    }

    /// One transaction per container creation: claims the pod's devices (all or
    /// nothing, idempotent per pod), records the container, and tells whether this
    /// container carries the pod's network actions.
    pub fn admit(
        &self,
        pod: &PodRef,
        claims: &[Claim],
        container_id: &str,
        record: ContainerRecord,
        wants_network: bool,
    ) -> Result<Admission, LedgerError> {
        let need = if wants_network {
            NetworkNeed::Moves
        } else {
            NetworkNeed::None
        };
        self.admit_or_take_over(pod, claims, container_id, record, need, &|_| false)
    }

    /// [`Ledger::admit`], where a network owner that moved nothing
    /// (`owner_idle`, asked under the lock) gives the pod's network to this
    /// container. Such an owner was answered but never ran: the runtime failed
    /// its creation after the plugins replied (another plugin's error, a CDI
    /// name it could not resolve) and no RemoveContainer came. Without the
    /// hand-over, every later container of the pod would start without its VFs.
    pub fn admit_or_take_over(
        &self,
        pod: &PodRef,
        claims: &[Claim],
        container_id: &str,
        record: ContainerRecord,
        network: NetworkNeed,
        owner_idle: &dyn Fn(&PodRecord) -> bool,
    ) -> Result<Admission, LedgerError> {
        let mut txn = self.store.begin()?;
        self.check_releasing(&txn.state, pod, claims)?;
        let claimed = claim_in(&mut txn.state, pod, claims)?;
        let Some(rec) = txn.state.pods.get_mut(&pod.sandbox_id) else {
            return Ok(Admission::default());
        };
        if network == NetworkNeed::InPod && rec.network_owner.is_none() {
            return Err(LedgerError::NetworkReturned {
                pod: pod.to_string(),
            });
        }
        // An owner whose network this container takes over: its record changes too.
        let mut taken_from = None;
        let network_owner = network == NetworkNeed::Moves
            && match rec.network_owner.clone() {
                None => {
                    rec.network_owner = Some(container_id.to_string());
                    true
                }
                Some(owner) if owner == container_id => true,
                Some(owner) if owner_idle(rec) => {
                    tracing::warn!(pod = %rec.pod, from = %owner, to = %container_id, "network owner moved nothing: its network goes to this container");
                    // The old owner's annotation no longer moves anything.
                    if let Some(old) = rec.containers.get_mut(&owner) {
                        old.forget_resolved();
                    }
                    rec.network_owner = Some(container_id.to_string());
                    taken_from = Some(owner);
                    true
                }
                Some(_) => false,
            };
        let mut record = record;
        if !network_owner {
            // Only the owner gets the annotation, so only it may be vouched for.
            record.forget_resolved();
        }
        rec.put_container(container_id.to_string(), record);
        if let Some(keys) = &claimed {
            txn.commit_claim(&pod.sandbox_id, keys)?;
        } else {
            // The pod held its devices already: only its record changed.
            match &taken_from {
                Some(old) => txn.commit_pod(&pod.sandbox_id, &[container_id, old])?,
                None => txn.commit_pod(&pod.sandbox_id, &[container_id])?,
            }
        }
        Ok(Admission {
            network_owner,
            claimed: claimed.is_some(),
        })
    }

    /// Refuses a new pod's claim of a shared device a release is tearing down
    /// (under the transaction's lock; a pod that holds its claims already is
    /// never refused this way).
    fn check_releasing(
        &self,
        state: &LedgerState,
        pod: &PodRef,
        claims: &[Claim],
    ) -> Result<(), LedgerError> {
        if state.pods.contains_key(&pod.sandbox_id) {
            return Ok(());
        }
        match release_lock::first_releasing(self.store.dir(), claims)? {
            Some(device) => Err(LedgerError::Releasing { device }),
            None => Ok(()),
        }
    }

    /// Whether a release of a pod holding one of `pod`'s devices runs now
    /// (or a hook holds a VF's turn to move it); asked without waiting.
    pub fn releasing(&self, pod: &PodRecord) -> Result<bool, LedgerError> {
        release_lock::any_releasing(self.store.dir(), &pod.claims)
    }

    /// The pods being released (`releasing`) whose release lets `pod` claim
    /// `claims`: empty where it fits now; the refusal it meets even without
    /// them (the lasting reason, for the error) as the inner `Err`. Read
    /// without the lock: the claim decides.
    pub fn waits_for(
        &self,
        pod: &PodRef,
        claims: &[Claim],
        releasing: &dyn Fn(&str) -> bool,
    ) -> Result<Result<Vec<String>, LedgerError>, LedgerError> {
        self.store
            .peek(|s| rules::fits_without(s, pod, claims, releasing))
    }

    /// Whether the ledger holds anything of the pod (claims or containers);
    /// read without the lock.
    pub fn holds(&self, sandbox_id: &str) -> Result<bool, LedgerError> {
        self.store.peek(|s| s.pods.contains_key(sandbox_id))
    }

    /// The pod's record, if the ledger holds anything of it; read without
    /// the lock.
    pub fn pod(&self, sandbox_id: &str) -> Result<Option<PodRecord>, LedgerError> {
        self.store.peek(|s| s.pods.get(sandbox_id).cloned())
    }

    /// Whether the pod `sandbox_id` claims every one of `vfs`; read without
    /// the lock.
    pub fn claims_vfs(
        &self,
        sandbox_id: &str,
        vfs: &[crate::inventory::PciAddr],
    ) -> Result<bool, LedgerError> {
        self.store.peek(|s| {
            s.pods
                .get(sandbox_id)
                .is_some_and(|p| vfs.iter().all(|vf| p.vfs().any(|claimed| claimed == *vf)))
        })
    }

    /// Sandboxes of pod `uid` other than `sandbox_id` that hold claims and
    /// no container; read without the lock. Kubelet stops a pod's sandbox
    /// before it starts another, so when `sandbox_id` starts these are left
    /// from a start that failed after the claim with no event devgate saw
    /// (see `plugin::ahead_inits`), or are stopped ones whose release is
    /// owed anyway.
    pub fn superseded(&self, uid: &str, sandbox_id: &str) -> Result<Vec<String>, LedgerError> {
        if uid.is_empty() {
            return Ok(Vec::new());
        }
        self.store.peek(|s| {
            s.pods
                .values()
                .filter(|p| p.pod.uid == uid && p.pod.sandbox_id != sandbox_id)
                .filter(|p| p.containers.is_empty() && p.network_owner.is_none())
                .map(|p| p.pod.sandbox_id.clone())
                .collect()
        })
    }

    /// Marks a device as not to be handed out until cleared.
    pub fn quarantine(&self, device: &DeviceId, reason: &str) -> Result<(), LedgerError> {
        let mut txn = self.store.begin()?;
        quarantine_in(&mut txn.state, device, reason, None);
        txn.commit()
    }

    /// Takes the device's turn among releases (see `release_lock`), waiting
    /// for one running; held until the value is dropped. For work on a device
    /// no pod holds, such as a quarantined GPU's retry.
    pub fn lock_device(&self, device: &DeviceId) -> Result<DeviceLocks, LedgerError> {
        release_lock::lock_devices(self.store.dir(), std::iter::once(device))
    }

    /// [`Ledger::lock_device`] for the VFs `vfs`, taken in name order as a
    /// release takes them. The hook holds its VFs' turns from its last look
    /// at the ledger until they are moved, so that a release of the pod
    /// either commits before that look (which then refuses) or finds their
    /// records saved and restores them.
    pub fn lock_vfs(&self, vfs: &[crate::inventory::PciAddr]) -> Result<DeviceLocks, LedgerError> {
        release_lock::lock_devices(self.store.dir(), vf_ids(vfs).iter())
    }

    /// [`Self::lock_vfs`] without waiting: `None` while a hook or a release
    /// holds any of their turns.
    pub fn try_lock_vfs(
        &self,
        vfs: &[crate::inventory::PciAddr],
    ) -> Result<Option<DeviceLocks>, LedgerError> {
        release_lock::try_lock_devices(self.store.dir(), vf_ids(vfs).iter())
    }

    /// Names the PF of VF claims recorded before claims named it, so that
    /// the rule against a PF held whole beside a VF of it covers the pods
    /// admitted by an earlier release too. Writes only when it names one.
    pub fn backfill_vf_pfs(
        &self,
        pf_of: &dyn Fn(crate::inventory::PciAddr) -> Option<crate::inventory::PciAddr>,
    ) -> Result<usize, LedgerError> {
        let lacking =
            |s: &LedgerState| s.pods.values().flat_map(|p| &p.claims).any(Claim::lacks_pf);
        if !self.store.peek(lacking)? {
            return Ok(0);
        }
        let mut txn = self.store.begin()?;
        let named = rules::backfill_pfs(&mut txn.state, pf_of);
        if named > 0 {
            txn.commit()?;
        }
        Ok(named)
    }

    /// Returns a quarantined device to service.
    pub fn clear_quarantine(&self, device: &DeviceId) -> Result<(), LedgerError> {
        let mut txn = self.store.begin()?;
        if let Some(rec) = txn.state.devices.get_mut(&device.to_string()) {
            rec.quarantine = None;
        }
        prune_empty(&mut txn.state);
        txn.commit()
    }
}

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_admit;
#[cfg(test)]
mod tests_containers;
#[cfg(test)]
mod tests_pf;
#[cfg(test)]
mod tests_release;
#[cfg(test)]
mod tests_unclean;
