//! The recent pods' prepared plans (`crate::recent`, one per pod). A pod's
//! containers are created one after another against the same allocation,
//! inventory and config; for each, building the plan and the adjustment again
//! would repeat the same work (the largest step of a creation after the claim),
//! and the pod's sandbox start prepared it for the first. An entry is keyed by
//! everything the plan is made from, so a hit returns what building would,
//! except for one thing: the GID tables of RoCE ports whose netdev stays on the
//! host are read when the pod's plan is first made, so all containers of a pod
//! get the same `NCCL_IB_GID_INDEX`.
//!
//! What is checked at each creation whatever the cache holds: the grant
//! decision, GPU health and the claim.

use std::sync::{Arc, OnceLock};

use nri::api::ContainerAdjustment;
use nri::stub::EncodedReply;

use crate::allocation::PodDevices;
use crate::config::Config;
use crate::inventory::Inventory;
use crate::ledger::{Claim, DeviceId, NetworkNeed};
use crate::recent::Recent;

use super::adjust::{add_hook, create_response, HookSpec};
use super::devices::RuntimeFeatures;
use crate::hook::RESOLVED_ANNOTATION;

/// What a container's creation takes from its plan.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The pod's devices and shares, for the ledger and the health check.
    pub claims: Vec<Claim>,
    /// The annotation entry of each claim, in the same order.
    pub claim_entries: Vec<String>,
    /// Device nodes the container gets (paths inside it), for its record.
    pub device_paths: Vec<String>,
    /// The `devgate.io/resolved` annotation, when the plan has network actions.
    pub resolved: Option<String>,
    /// Its digest, for the network owner's ledger record.
    pub resolved_sha256: Option<String>,
    /// How to run the hook, when `resolved` is set.
    pub hook: Option<HookSpec>,
    /// The adjustment without the hook and the annotation, which only the
    /// pod's network owner gets.
    pub adjust: ContainerAdjustment,
    /// The plan's nodes as a CDI spec gives them, where `adjust` names CDI
    /// devices (checked against the runtime's specs at each creation).
    pub cdi_nodes: Vec<crate::cdi::DeviceNode>,
    /// The replies, encoded once for every container of the pod that gets one.
    pub replies: Replies,
    /// The plan's warnings.
    pub warnings: Vec<String>,
    /// The plan's notes: expected omissions, logged at debug.
    pub notes: Vec<String>,
    /// Whether a further container of the pod may take it (see `Devices::prepare`).
    pub keep: bool,
    /// What the admission does with the pod's network.
    pub network: NetworkNeed,
}

/// A plan's two replies, each encoded when a container first needs it;
/// `None` where one does not encode (then each container's reply is encoded
/// on its own).
#[derive(Debug, Clone, Default)]
pub struct Replies {
    /// The reply carrying `adjust` as it is.
    plain: OnceLock<Option<EncodedReply>>,
    /// The network owner's: `adjust` with the hook and the annotation.
    owner: OnceLock<Option<EncodedReply>>,
}

impl Prepared {
    /// `"<entry>: "` for a claimed device, to put before a refusal's reason.
    pub fn entry_of(&self, device: &DeviceId) -> String {
        crate::plan::claim_entry(&self.claims, &self.claim_entries, device)
    }

    /// The pod's network owner's adjustment: the hook moves the pod's VFs in
    /// as the annotation says. Without network actions, the plain one.
    pub fn owner_adjustment(&self) -> ContainerAdjustment {
        let mut adjust = self.adjust.clone();
        if let (Some(value), Some(hook)) = (&self.resolved, &self.hook) {
            add_hook(&mut adjust, hook);
            adjust
                .annotations
                .insert(RESOLVED_ANNOTATION.to_string(), value.clone());
        }
        adjust
    }
}

fn encoded(adjust: ContainerAdjustment) -> Option<EncodedReply> {
    EncodedReply::new(&create_response(adjust)).ok()
}

/// What a container was given.
#[derive(Debug)]
pub enum Admitted {
    /// Nothing: its pod has no devices.
    Nothing,
    /// Its pod's prepared adjustment as it is.
    Prepared(Arc<Prepared>),
    /// The prepared adjustment of the pod's network owner, with the hook.
    Owner(Arc<Prepared>),
}

impl Admitted {
    pub fn into_adjustment(self) -> ContainerAdjustment {
        match self {
            Admitted::Nothing => ContainerAdjustment::default(),
            Admitted::Prepared(p) => p.adjust.clone(),
            Admitted::Owner(p) => p.owner_adjustment(),
        }
    }

    /// The reply, encoded once for the plan: a pod's containers get the same.
    pub fn encoded(&self) -> Option<&EncodedReply> {
        match self {
            Admitted::Nothing => None,
            Admitted::Prepared(p) => p
                .replies
                .plain
                .get_or_init(|| encoded(p.adjust.clone()))
                .as_ref(),
            Admitted::Owner(p) => p
                .replies
                .owner
                .get_or_init(|| encoded(p.owner_adjustment()))
                .as_ref(),
        }
    }

    /// Whether it gets Linux settings (device nodes, cgroup rules).
    pub fn has_linux(&self) -> bool {
        match self {
            Admitted::Nothing => false,
            Admitted::Prepared(p) | Admitted::Owner(p) => p.adjust.linux.is_some(),
        }
    }
}

/// Everything a prepared plan is made from. Shared values are compared by
/// identity: the parse cache, the inventory cache and the config hand out the
/// same `Arc` for the same contents, and a new one for any change.
pub struct PlanKey {
    pub sandbox_id: String,
    pub devices: Arc<PodDevices>,
    pub selected: bool,
    pub inventory: Arc<Inventory>,
    pub config: Arc<Config>,
    pub features: RuntimeFeatures,
    /// The container's own values of the variables the plan reads
    /// (`plan::env_inputs`).
    pub env: Vec<Option<String>>,
    /// The pod's network namespace as the request reports it.
    pub network: crate::plan::PodNetwork,
}

impl PlanKey {
    fn same(&self, other: &PlanKey) -> bool {
        self.sandbox_id == other.sandbox_id
            && Arc::ptr_eq(&self.devices, &other.devices)
            && self.selected == other.selected
            && Arc::ptr_eq(&self.inventory, &other.inventory)
            && Arc::ptr_eq(&self.config, &other.config)
            && self.features == other.features
            && self.env == other.env
            && self.network == other.network
    }
}

/// The prepared plans of the most recent pods, one per pod.
#[derive(Default)]
pub struct LastPlan {
    entries: Recent<PlanKey, Prepared>,
}

impl LastPlan {
    /// The prepared plan for `key`: a kept one when it was made from the same
    /// inputs, else `build`'s, which is kept as its pod's. Errors are not kept.
    pub fn get_or_build<E>(
        &self,
        key: PlanKey,
        build: impl FnOnce() -> Result<Prepared, E>,
    ) -> Result<Arc<Prepared>, E> {
        if let Some(prepared) = self.entries.find(|k| k.same(&key)) {
            return Ok(prepared);
        }
        // Built without the lock: a slow plan (a re-read inventory) holds up no one.
        let prepared = Arc::new(build()?);
        if prepared.keep {
            let same_pod = |new: &PlanKey, old: &PlanKey| new.sandbox_id == old.sandbox_id;
            self.entries.put(key, Arc::clone(&prepared), same_pod);
        } else {
            self.entries.remove(|k| k.sandbox_id == key.sandbox_id);
        }
        Ok(prepared)
    }

    /// Forgets the entry of a pod that is gone.
    pub fn forget(&self, sandbox_id: &str) {
        self.entries.remove(|k| k.sandbox_id == sandbox_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(
        sandbox: &str,
        devices: &Arc<PodDevices>,
        inv: &Arc<Inventory>,
        cfg: &Arc<Config>,
    ) -> PlanKey {
        PlanKey {
            sandbox_id: sandbox.into(),
            devices: Arc::clone(devices),
            selected: true,
            inventory: Arc::clone(inv),
            config: Arc::clone(cfg),
            features: RuntimeFeatures::default(),
            env: vec![None],
            network: crate::plan::PodNetwork::Unknown,
        }
    }

    fn prepared(tag: &str) -> Prepared {
        Prepared {
            claims: Vec::new(),
            claim_entries: Vec::new(),
            device_paths: vec![tag.to_string()],
            resolved: None,
            resolved_sha256: None,
            hook: None,
            adjust: ContainerAdjustment::default(),
            cdi_nodes: Vec::new(),
            replies: Replies::default(),
            warnings: Vec::new(),
            notes: Vec::new(),
            keep: true,
            network: NetworkNeed::None,
        }
    }

    fn build_count(last: &LastPlan, k: PlanKey, built: &mut u32) -> Arc<Prepared> {
        last.get_or_build(k, || -> Result<_, ()> {
            *built += 1;
            Ok(prepared(&built.to_string()))
        })
        .unwrap()
    }

    #[test]
    fn same_inputs_reuse_and_any_change_builds_again() {
        let last = LastPlan::default();
        let devices = Arc::new(PodDevices::default());
        let inv = Arc::new(Inventory::default());
        let cfg = Arc::new(Config::default());
        let mut built = 0;
        let first = build_count(&last, key("p1", &devices, &inv, &cfg), &mut built);
        let again = build_count(&last, key("p1", &devices, &inv, &cfg), &mut built);
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(built, 1);

        let changes: [fn(&mut PlanKey); 8] = [
            |k| k.sandbox_id = "p2".into(),
            |k| k.devices = Arc::new(PodDevices::default()),
            |k| k.selected = false,
            |k| k.inventory = Arc::new(Inventory::default()),
            |k| k.config = Arc::new(Config::default()),
            |k| k.features.explicit_cgroup_rules = true,
            |k| k.env = vec![Some("=mlx5_0".into())],
            |k| k.network = crate::plan::PodNetwork::Own,
        ];
        for (i, change) in changes.iter().enumerate() {
            // Back to the base entry, then one input changed.
            last.forget("p1");
            build_count(&last, key("p1", &devices, &inv, &cfg), &mut built);
            let before = built;
            let mut k = key("p1", &devices, &inv, &cfg);
            change(&mut k);
            build_count(&last, k, &mut built);
            assert_eq!(built, before + 1, "change {i} reused the entry");
        }
    }

    /// Pods started side by side keep their own entries: a pod's container
    /// finds its plan after another pod's sandbox started. A plan that may not
    /// be kept drops its pod's entry.
    #[test]
    fn interleaved_pods_each_keep_their_plan() {
        let last = LastPlan::default();
        let devices = Arc::new(PodDevices::default());
        let inv = Arc::new(Inventory::default());
        let cfg = Arc::new(Config::default());
        let mut built = 0;
        let a = build_count(&last, key("a", &devices, &inv, &cfg), &mut built);
        let b = build_count(&last, key("b", &devices, &inv, &cfg), &mut built);
        assert!(Arc::ptr_eq(
            &a,
            &build_count(&last, key("a", &devices, &inv, &cfg), &mut built)
        ));
        assert!(Arc::ptr_eq(
            &b,
            &build_count(&last, key("b", &devices, &inv, &cfg), &mut built)
        ));
        assert_eq!(built, 2);
        let mut other_env = key("a", &devices, &inv, &cfg);
        other_env.env = vec![Some("=mlx5_0".into())];
        let unkept = last.get_or_build(other_env, || -> Result<_, ()> {
            Ok(Prepared {
                keep: false,
                ..prepared("moved")
            })
        });
        assert!(unkept.is_ok());
        build_count(&last, key("a", &devices, &inv, &cfg), &mut built);
        assert_eq!(built, 3, "the unkept plan dropped a's entry");
    }

    #[test]
    fn errors_are_not_kept_and_forget_is_per_pod() {
        let last = LastPlan::default();
        let devices = Arc::new(PodDevices::default());
        let inv = Arc::new(Inventory::default());
        let cfg = Arc::new(Config::default());
        let failed = last.get_or_build(key("p1", &devices, &inv, &cfg), || Err("no"));
        assert_eq!(failed.err(), Some("no"));
        let mut built = 0;
        build_count(&last, key("p1", &devices, &inv, &cfg), &mut built);
        assert_eq!(built, 1, "the error was not kept");
        last.forget("other");
        build_count(&last, key("p1", &devices, &inv, &cfg), &mut built);
        assert_eq!(built, 1, "another pod's removal keeps the entry");
        last.forget("p1");
        build_count(&last, key("p1", &devices, &inv, &cfg), &mut built);
        assert_eq!(built, 2);
    }
}
