//! The device path of CreateContainer: pod annotation → allocation → plan →
//! claim → adjustment. Fail closed: any step that cannot be applied exactly
//! refuses the container, and nothing is claimed unless everything before
//! the claim succeeded (the claim is the last step that can fail).

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use nri::api::{Container, ContainerAdjustment, PodSandbox};

use crate::allocation::{self, AllocationError, DEVICE_ALLOCATED};
use crate::cdi::Class;
use crate::config::{self, Config};
use crate::gpu::{self, GpuError, HealthStore};
use crate::hook::{Resolved, ResolvedError, RESOLVED_ANNOTATION};
use crate::inventory::{Inventory, PciAddr};
use crate::ledger::{ContainerRecord, DeviceId, Ledger, LedgerError, NetworkNeed, PodRef};
use crate::plan::{self, Plan, PlanError};

use super::adjust::{add_hook, to_adjustment, AdjustOptions, HookSpec};
use super::last_plan::{LastPlan, PlanKey, Prepared};

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// `entry` names the refused device's entry (`gpu[1]: `), or is empty
    /// when the refusal concerns the pod as a whole.
    #[error("{DEVICE_ALLOCATED}: {entry}{reason}")]
    Claim {
        entry: String,
        reason: String,
        #[source]
        source: LedgerError,
    },
    /// `entry` as in `Claim`: `rdma[0].vfs[1]: `, or empty where unknown.
    #[error("{DEVICE_ALLOCATED}: {entry}rdma vf {vf} has no host netdev to move into the pod")]
    NoNetdev { entry: String, vf: PciAddr },
    #[error(transparent)]
    Resolved(#[from] ResolvedError),
    #[error("{DEVICE_ALLOCATED}: {entry}{source}")]
    Health {
        entry: String,
        #[source]
        source: GpuError,
    },
    #[error(transparent)]
    Grant(#[from] crate::grant::GrantError),
    /// A creation that reached the plugin after the sandbox's stop: a claim
    /// now would outlive the pod until its removal.
    #[error(
        "{DEVICE_ALLOCATED}: the pod's sandbox {sandbox} is stopped: nothing is claimed for it"
    )]
    Stopped { sandbox: String },
}

/// Most sandboxes remembered as stopped until their removal; past it a
/// stopped one is not remembered (its late creation claims as before).
const MAX_STOPPED: usize = 4096;

/// What the runtime supports, from ConfigureRequest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeFeatures {
    /// `linux.resources.devices` in an adjustment takes effect (NRI >= v0.10).
    pub explicit_cgroup_rules: bool,
    /// The runtime injects `CDI_devices` of an adjustment (see `features`).
    pub cdi_devices: bool,
}

/// Inventory cache and ledger of a running plugin.
pub struct Devices {
    host_root: PathBuf,
    state_dir: PathBuf,
    hook_path: PathBuf,
    inventory: RwLock<Arc<Inventory>>,
    ledger: Ledger,
    /// Set once the grant check is configured; checked before anything is planned.
    grant: std::sync::OnceLock<Arc<crate::grant::GrantChecker>>,
    last_pod: allocation::LastPod,
    last_plan: LastPlan,
    /// Sandboxes stopped and not yet removed (StopPodSandbox to RemovePodSandbox).
    stopped: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// VF claims of pods an earlier release admitted name no PF: named from the
/// inventory, so a PF asked for whole is refused beside them as well.
fn backfill_vf_pfs(ledger: &Ledger, inv: &Inventory) {
    let pf_of = |vf| {
        inv.rdma
            .iter()
            .find(|n| n.vfs.iter().any(|v| v.bus_id == vf))
            .map(|n| n.bus_id)
    };
    match ledger.backfill_vf_pfs(&pf_of) {
        Ok(0) => {}
        Ok(named) => tracing::info!(named, "vf claims given their pf"),
        Err(e) => tracing::warn!(error = %e, "vf claims not given their pf"),
    }
}

impl Devices {
    pub fn open(
        host_root: &Path,
        state_dir: &Path,
        hook_path: PathBuf,
    ) -> Result<Devices, LedgerError> {
        let inv = gpu::discover_node(host_root);
        for w in &inv.warnings {
            tracing::warn!(warning = %w, "inventory");
        }
        let ledger = Ledger::open(state_dir)?;
        backfill_vf_pfs(&ledger, &inv);
        Ok(Devices {
            host_root: host_root.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            hook_path,
            inventory: RwLock::new(Arc::new(inv)),
            ledger,
            grant: std::sync::OnceLock::new(),
            last_pod: allocation::LastPod::default(),
            last_plan: LastPlan::default(),
            stopped: Default::default(),
        })
    }

    /// Installs the grant check; the first one installed stays.
    pub fn set_grant_checker(&self, checker: Arc<crate::grant::GrantChecker>) {
        let _ = self.grant.set(checker);
    }

    pub fn grant_checker(&self) -> Option<&Arc<crate::grant::GrantChecker>> {
        self.grant.get()
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn inventory(&self) -> Arc<Inventory> {
        self.inventory
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Re-reads the host: devices come and go (VFs created, drivers rebound).
    pub fn refresh(&self) -> Arc<Inventory> {
        let inv = Arc::new(gpu::discover_node(&self.host_root));
        *self
            .inventory
            .write()
            .unwrap_or_else(PoisonError::into_inner) = inv.clone();
        inv
    }

    /// The plan, from the cached inventory; a device the cache does not know
    /// triggers one re-read before the container is refused.
    fn plan(
        &self,
        pod: &allocation::PodDevices,
        ctr: &Container,
        config: &Config,
    ) -> Result<Plan, PlanError> {
        // The container's env: a communication variable it sets itself wins.
        let gids = plan::HostGids {
            root: &self.host_root,
        };
        let ctx = plan::ContainerContext {
            env: &ctr.env,
            gids: &gids,
        };
        let build = |inv: &Inventory| plan::build_for(inv, pod, &ctr.name, config, &ctx);
        match build(&self.inventory()) {
            Err(e) if is_unknown_device(&e) => build(&self.refresh()),
            other => other,
        }
    }

    /// The plan from a re-read of the host.
    fn replan(
        &self,
        pod: &allocation::PodDevices,
        ctr: &Container,
        config: &Config,
    ) -> Result<Plan, PlanError> {
        self.refresh();
        self.plan(pod, ctr, config)
    }

    /// The container's adjustment; empty for pods without the annotation.
    /// `health` is GPU teardown's store, the one place health is kept.
    pub fn apply(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
        config: &Arc<Config>,
        features: RuntimeFeatures,
        health: &HealthStore,
    ) -> Result<ContainerAdjustment, DeviceError> {
        let devices = self.last_pod.parse(&pod.annotations, &pod.labels)?;
        if devices.allocation.is_empty() {
            return Ok(ContainerAdjustment::default());
        }
        if self.is_stopped(&pod.id) {
            return Err(DeviceError::Stopped {
                sandbox: pod.id.clone(),
            });
        }
        let selected = devices.containers.selects(&ctr.name);
        // Only the scheduler grants devices: the pod's requests bound what it
        // gets. Checked for every container of the pod, selected or not: the
        // claim is the pod's, and the first container to arrive makes it.
        if let Some(grant) = self.grant.get() {
            let pod_id = crate::grant::PodIdentity {
                namespace: &pod.namespace,
                name: &pod.name,
                uid: &pod.uid,
                config_source: pod
                    .annotations
                    .get(crate::grant::model::CONFIG_SOURCE)
                    .map(String::as_str),
            };
            grant.check(config, pod_id, &ctr.name, &devices.allocation)?;
        }
        let key = PlanKey {
            sandbox_id: pod.id.clone(),
            devices: Arc::clone(&devices),
            selected,
            inventory: self.inventory(),
            config: Arc::clone(config),
            features,
            env: plan::env_inputs(&config.comm_env, selected, &ctr.env),
        };
        let prepared = self
            .last_plan
            .get_or_build(key, || self.prepare(&devices, pod, ctr, config, features))?;
        // An unhealthy GPU is refused before anything is claimed.
        gpu::check_claims(health, &prepared.claims).map_err(|source| DeviceError::Health {
            entry: match &source {
                GpuError::Unhealthy { uuid, .. } => prepared.entry_of(&DeviceId::Gpu(uuid.clone())),
                _ => String::new(),
            },
            source,
        })?;
        let pod_ref = PodRef {
            sandbox_id: pod.id.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        };
        let record = ContainerRecord {
            name: ctr.name.clone(),
            devices: prepared.device_paths.clone(),
            applied_unix: crate::ledger::now_unix(),
            init: None,
            cgroups: Vec::new(),
            // The hook acts on the annotation only when the ledger vouches for it.
            resolved: prepared.resolved.clone(),
            hooks_only: false,
        };
        let saved = crate::netdev::SavedStore::new(&self.state_dir);
        let owner_idle = |rec: &crate::ledger::PodRecord| saved.none_moved(rec);
        let admission = self
            .ledger
            .admit_or_take_over(
                &pod_ref,
                &prepared.claims,
                &ctr.id,
                record,
                prepared.network,
                &owner_idle,
            )
            .map_err(|source| DeviceError::Claim {
                entry: match &source {
                    LedgerError::Held { device, .. }
                    | LedgerError::HeldWithPf { device, .. }
                    | LedgerError::Quarantined { device, .. }
                    | LedgerError::Overcommitted { device, .. }
                    | LedgerError::Releasing { device }
                    | LedgerError::DuplicateClaim { device } => prepared.entry_of(device),
                    _ => String::new(),
                },
                reason: source.to_string(),
                source,
            })?;
        let mut adjust = prepared.adjust.clone();
        if let (Some(value), Some(hook), true) =
            (&prepared.resolved, &prepared.hook, admission.network_owner)
        {
            add_hook(&mut adjust, hook);
            adjust
                .annotations
                .insert(RESOLVED_ANNOTATION.to_string(), value.clone());
        }
        // Once per pod: its containers share the allocation, so the rest
        // would repeat the same lines on every creation.
        for w in &prepared.warnings {
            if admission.claimed {
                tracing::warn!(pod = %pod_ref, container = %ctr.name, warning = %w, "plan");
            } else {
                tracing::debug!(pod = %pod_ref, container = %ctr.name, warning = %w, "plan");
            }
        }
        Ok(adjust)
    }

    /// Forgets what was kept for a pod that is gone.
    pub fn forget_pod(&self, sandbox_id: &str) {
        self.last_plan.forget(sandbox_id);
    }

    /// StopPodSandbox: the runtime checked the sandbox was ready before a
    /// creation reaches the plugin, so a creation can still arrive after the
    /// stop; it is refused until the removal.
    pub fn pod_stopped(&self, sandbox_id: &str) {
        self.forget_pod(sandbox_id);
        let mut stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        if stopped.len() < MAX_STOPPED {
            stopped.insert(sandbox_id.to_string());
        }
    }

    /// RemovePodSandbox.
    pub fn pod_removed(&self, sandbox_id: &str) {
        self.forget_pod(sandbox_id);
        self.stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(sandbox_id);
    }

    fn is_stopped(&self, sandbox_id: &str) -> bool {
        self.stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(sandbox_id)
    }

    /// The plan and all that can be derived from it before the claim, so that
    /// nothing after the claim can fail.
    fn prepare(
        &self,
        devices: &allocation::PodDevices,
        pod: &PodSandbox,
        ctr: &Container,
        config: &Config,
        features: RuntimeFeatures,
    ) -> Result<Prepared, DeviceError> {
        let owned = self
            .ledger
            .network_owner(&pod.id)
            .map_err(|source| DeviceError::Claim {
                entry: String::new(),
                reason: source.to_string(),
                source,
            })?
            .is_some();
        let mut plan = self.plan(devices, ctr, config)?;
        let moved = |p: &Plan| p.network.iter().any(|a| a.netdev.is_none());
        if moved(&plan) && !owned {
            // Read while the VF was still in a pod that has since given it back.
            plan = self.replan(devices, ctr, config)?;
        }
        let networks = vf_attachments(&plan.network, &pod.uid, owned).map_err(|e| match e {
            DeviceError::NoNetdev { vf, .. } => DeviceError::NoNetdev {
                entry: plan.entry_of(&DeviceId::Vf(vf)),
                vf,
            },
            other => other,
        })?;
        let resolved = if networks.is_empty() {
            None
        } else {
            Some(Resolved::new(networks).to_annotation()?)
        };
        let opts = AdjustOptions {
            explicit_cgroup_rules: features.explicit_cgroup_rules,
            cdi_devices: cdi_names(&plan, config.device_mode, features),
            ..AdjustOptions::default()
        };
        let network = network_need(resolved.is_some(), &plan.network);
        Ok(Prepared {
            network,
            // Without the host netdev, this plan holds only while the pod's
            // network owner does: the next container may have to move the VF.
            keep: !moved(&plan),
            adjust: to_adjustment(&plan, &opts),
            device_paths: plan.devices.iter().map(|d| d.path.clone()).collect(),
            hook: resolved.as_ref().map(|_| self.hook_spec(config)),
            resolved,
            claims: plan.claims,
            claim_entries: plan.claim_entries,
            warnings: plan.warnings,
        })
    }

    /// The hook as runc runs it: on the host, so every path is the host's view;
    /// a config value, where set, wins over what the plugin itself sees.
    fn hook_spec(&self, config: &Config) -> HookSpec {
        let host_view = |configured: &str, own: &Path| {
            if configured.is_empty() {
                own.display().to_string()
            } else {
                configured.to_string()
            }
        };
        HookSpec {
            path: host_view(&config.hook_path, &self.hook_path),
            flags: vec![
                // No --host-root: the hook reads the host only in hooks-only
                // mode, which hooks.d files start, never the plugin.
                "--state-dir".to_string(),
                host_view(&config.hook_state_dir, &self.state_dir),
            ],
            timeout_secs: config.hook_timeout_secs,
        }
    }
}

/// The CDI names of the plan's devices when the config asks for CDI and the
/// runtime injects it; empty otherwise (raw nodes). The spec from
/// `devgate cdi generate` holds the same nodes the plan does, and a name the
/// runtime cannot resolve fails the container: never a silent fallback.
fn cdi_names(plan: &Plan, mode: config::DeviceMode, features: RuntimeFeatures) -> Vec<String> {
    if super::features::devices_as(mode, features) != config::DeviceMode::Cdi
        || plan.devices.is_empty()
    {
        return Vec::new();
    }
    plan.claims
        .iter()
        .map(|c| match &c.device {
            DeviceId::Gpu(uuid) => Class::Gpu.qualified(uuid),
            DeviceId::Pf(bus) | DeviceId::Vf(bus) => Class::Rdma.qualified(&bus.to_string()),
        })
        .collect()
}

/// What admitting a container does with the pod's network: move its VFs in
/// (`moves`: the hook's attachments were made), nothing (no VFs), or rely on
/// the VFs its network owner moved into the pod already.
pub(crate) fn network_need(moves: bool, actions: &[plan::NetworkAction]) -> NetworkNeed {
    match (moves, actions.is_empty()) {
        (true, _) => NetworkNeed::Moves,
        (false, true) => NetworkNeed::None,
        (false, false) => NetworkNeed::InPod,
    }
}

fn is_unknown_device(e: &PlanError) -> bool {
    matches!(
        e,
        PlanError::UnknownGpu { .. }
            | PlanError::UnknownRdma { .. }
            | PlanError::UnknownPf { .. }
            | PlanError::UnknownVf { .. }
            | PlanError::NoMajor { .. }
            | PlanError::NoRdmaCm { .. }
            // A VF's RDMA device and netdev come back to the host when its
            // last pod goes, after this inventory was read.
            | PlanError::NoRdmaDevice { .. }
            // A GPU replaced or renumbered (driver reload), or NICs probed in
            // another order, since: the scheduler's ids are checked against
            // a fresh read before the container is refused.
            | PlanError::GpuIdOfOther { .. }
            | PlanError::GpuIdMismatch { .. }
            | PlanError::PfMinorMismatch { .. }
    )
}

#[cfg(test)]
use vf_attach::pod_mac;
pub(crate) use vf_attach::vf_attachments;

#[path = "vf_attach.rs"]
mod vf_attach;

#[cfg(test)]
#[path = "devices_tests.rs"]
mod tests;
