//! The device path of CreateContainer: pod annotation → allocation → plan →
//! claim → adjustment. Fail closed: any step that cannot be applied exactly
//! refuses the container, and nothing is claimed unless everything before
//! the claim succeeded (the claim is the last step that can fail).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use nri::api::{Container, ContainerAdjustment, PodSandbox};

use crate::allocation;
use crate::config::Config;
use crate::gpu::{self, GpuError, HealthStore};
use crate::inventory::uevents::HostChanges;
use crate::inventory::Inventory;
use crate::ledger::{ContainerRecord, DeviceId, Ledger, LedgerError, PodRef};
use crate::plan;

pub use super::errors::DeviceError;
pub use super::last_plan::Admitted;
use super::last_plan::{LastPlan, PlanKey};
use super::reads;

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
    /// NVML's GPU facts, under `[gpu] nvml`, asked again only when GPUs change.
    gpu_facts: gpu::NodeFacts,
    /// GID tables of the inventory's RDMA ports, kept open until it is read again.
    gids: crate::plan::GidCache,
    ledger: Ledger,
    /// Set once the grant check is configured; checked before anything is planned.
    grant: std::sync::OnceLock<Arc<crate::grant::GrantChecker>>,
    last_pod: allocation::LastPod,
    last_plan: LastPlan,
    /// The runtime's CDI specs, for `device_mode = "cdi"`.
    cdi_specs: crate::cdi::SpecDirs,
    /// Sandboxes stopped and not yet removed (StopPodSandbox to RemovePodSandbox).
    stopped: super::stopped_pods::StoppedPods,
    /// The host's `/dev/char` links for granted devices (see [`crate::devchar`]).
    dev_char: crate::devchar::DevCharLinks,
    /// The kernel's device changes, and how many of them the cached
    /// inventory was read after.
    changes: Arc<HostChanges>,
    read_at: std::sync::atomic::AtomicU64,
    /// One read of the host at a time (see `inventory_cache`).
    reading: std::sync::Mutex<()>,
    /// Finishes a VF restore that stopped half done in a live pod.
    finish_restore: RwLock<Arc<dyn super::vf_finish::FinishRestore>>,
    /// Called after each read of the host, so that tests can change the
    /// host during one.
    #[cfg(test)]
    after_read: std::sync::Mutex<Option<Box<dyn Fn() + Send>>>,
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
        Err(e) => tracing::warn!(error = %nri::ErrorChain(&e), "vf claims not given their pf"),
    }
}

/// Links every NVIDIA node of the inventory in `/dev/char` (see
/// [`crate::devchar`]); a failure is said, not fatal.
fn link_dev_char(links: &crate::devchar::DevCharLinks, inv: &Inventory) {
    for e in links.ensure(&crate::devchar::nvidia_nodes(inv)) {
        tracing::warn!(error = %e, "a gpu's device rule may be lost at systemctl daemon-reload under the systemd cgroup driver");
    }
}

impl Devices {
    pub fn open(
        host_root: &Path,
        state_dir: &Path,
        hook_path: PathBuf,
        nvml: Option<crate::config::NvmlLibraries>,
    ) -> Result<Devices, LedgerError> {
        let gpu_facts = gpu::NodeFacts::nvml(nvml);
        let inv = gpu_facts.discover(host_root);
        for w in &inv.warnings {
            tracing::warn!(warning = %w, "inventory");
        }
        let ledger = Ledger::open(state_dir)?;
        backfill_vf_pfs(&ledger, &inv);
        let dev_char = crate::devchar::DevCharLinks::new(host_root);
        link_dev_char(&dev_char, &inv);
        Ok(Devices {
            host_root: host_root.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            hook_path,
            inventory: RwLock::new(Arc::new(inv)),
            gpu_facts,
            gids: crate::plan::GidCache::new(host_root),
            ledger,
            grant: std::sync::OnceLock::new(),
            last_pod: allocation::LastPod::default(),
            last_plan: LastPlan::default(),
            cdi_specs: Default::default(),
            stopped: Default::default(),
            dev_char,
            changes: Arc::default(),
            read_at: Default::default(),
            reading: Default::default(),
            finish_restore: RwLock::new(Arc::new(super::vf_finish::OnWorker::new(
                state_dir.to_path_buf(),
                host_root.to_path_buf(),
            ))),
            #[cfg(test)]
            after_read: Default::default(),
        })
    }

    /// Replaces how a half-done VF restore is finished.
    #[cfg(test)]
    pub(super) fn set_finish_restore(&self, finish: Arc<dyn super::vf_finish::FinishRestore>) {
        *self
            .finish_restore
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = finish;
    }

    /// Installs the grant check; the first one installed stays.
    pub fn set_grant_checker(&self, checker: Arc<crate::grant::GrantChecker>) {
        let _ = self.grant.set(checker);
    }

    pub fn grant_checker(&self) -> Option<&Arc<crate::grant::GrantChecker>> {
        self.grant.get()
    }

    /// Whether a VF of `pod` that a hook moved is still away from the host.
    pub fn vfs_away(&self, pod: &crate::ledger::PodRecord) -> bool {
        crate::netdev::SavedStore::new(&self.state_dir).vfs_away(&self.host_root, pod)
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
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
        self.admit(pod, ctr, config, features, health, &|e, _| Err(e))
            .map(Admitted::into_adjustment)
    }

    /// [`Devices::apply`], keeping a container that gets its pod's prepared
    /// adjustment unchanged apart, so that its reply need not be built again.
    /// A claim the ledger refuses is made once more where `retry` says so
    /// (having waited for what may end the refusal), without deciding the
    /// grant or planning again; otherwise `retry` gives the refusal to tell.
    pub fn admit(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
        config: &Arc<Config>,
        features: RuntimeFeatures,
        health: &HealthStore,
        retry: &Retry<'_>,
    ) -> Result<Admitted, DeviceError> {
        let Some(devices) = self.pod_devices(pod)? else {
            return Ok(Admitted::Nothing);
        };
        // Only the scheduler grants devices: the pod's requests bound what it
        // gets. Checked for every container of the pod, selected or not: the
        // claim is the pod's, and the first container to arrive makes it
        // unless the sandbox's start made it already.
        if let Some(grant) = self.grant.get() {
            let held = || self.ledger.holds(&pod.id).unwrap_or(false);
            grant.check_held(
                config,
                grant_identity(pod),
                &ctr.name,
                &devices.allocation,
                &held,
            )?;
        }
        let prepared = self.prepared(&devices, pod, ctr, config, features, health)?;
        let pod_ref = pod_ref(pod);
        let record = || ContainerRecord {
            name: ctr.name.clone(),
            devices: prepared.device_paths.clone(),
            applied_unix: crate::ledger::now_unix(),
            init: None,
            cgroups: Vec::new(),
            // The hook acts on the annotation only when the ledger vouches for it.
            resolved: None,
            resolved_sha256: prepared.resolved_sha256.clone(),
            hooks_only: false,
        };
        let saved = crate::netdev::SavedStore::new(&self.state_dir);
        // An owner whose VFs are all on the host, read now (the inventory may
        // be older than a move), holds nothing: a restore of its that failed
        // after the netdev came home left the records, which the next
        // owner's hook finishes before moving the VFs in again.
        let owner_idle = |rec: &crate::ledger::PodRecord| {
            saved.none_away(rec, |vf| crate::inventory::has_netdev(&self.host_root, vf))
        };
        let claim = || {
            self.ledger.admit_or_take_over(
                &pod_ref,
                &prepared.claims,
                &ctr.id,
                record(),
                prepared.network,
                &owner_idle,
            )
        };
        let admission = match claim() {
            // The wait may have let the holder's release mark a GPU
            // unhealthy (pages it left pending retirement), or the health
            // monitor mark one: health is asked again before the claim.
            Err(e) => match retry(e, &prepared.claims) {
                Ok(()) => {
                    healthy(health, &prepared)?;
                    claim()
                }
                Err(e) => Err(e),
            },
            other => other,
        };
        let admission = admission.map_err(|source| DeviceError::Claim {
            entry: match &source {
                LedgerError::Held { device, .. }
                | LedgerError::HeldWithPf { device, .. }
                | LedgerError::Quarantined { device, .. }
                | LedgerError::Overcommitted { device, .. }
                | LedgerError::Releasing { device }
                | LedgerError::DuplicateClaim { device }
                | LedgerError::ClaimMismatch { device, .. } => prepared.entry_of(device),
                _ => String::new(),
            },
            source,
        })?;
        let admitted = if admission.network_owner && prepared.resolved.is_some() {
            Admitted::Owner(Arc::clone(&prepared))
        } else {
            Admitted::Prepared(Arc::clone(&prepared))
        };
        // Once per pod: its containers share the allocation, so the rest
        // would repeat the same lines on every creation.
        for w in &prepared.warnings {
            if admission.claimed {
                tracing::warn!(pod = %pod_ref, container = %ctr.name, warning = %w, "plan");
            } else {
                tracing::debug!(pod = %pod_ref, container = %ctr.name, warning = %w, "plan");
            }
        }
        for n in &prepared.notes {
            tracing::debug!(pod = %pod_ref, container = %ctr.name, note = %n, "plan");
        }
        Ok(admitted)
    }

    /// The pod's parsed allocation; `None` when it has none. A stopped pod's
    /// creation is refused.
    fn pod_devices(
        &self,
        pod: &PodSandbox,
    ) -> Result<Option<Arc<allocation::PodDevices>>, DeviceError> {
        let devices = self
            .last_pod
            .parse(&reads::annotations(pod), &reads::labels(pod))?;
        if devices.allocation.is_empty() {
            return Ok(None);
        }
        if self.stopped.contains(&pod.id) {
            return Err(DeviceError::Stopped {
                sandbox: pod.id.clone(),
            });
        }
        Ok(Some(devices))
    }

    /// The prepared plan for `ctr`, its GPUs checked healthy: everything
    /// before the claim.
    fn prepared(
        &self,
        devices: &Arc<allocation::PodDevices>,
        pod: &PodSandbox,
        ctr: &Container,
        config: &Arc<Config>,
        features: RuntimeFeatures,
        health: &HealthStore,
    ) -> Result<Arc<super::last_plan::Prepared>, DeviceError> {
        let selected = devices.containers.selects(&ctr.name);
        let read = self.fresh_inventory_settled();
        let key = PlanKey {
            sandbox_id: pod.id.clone(),
            devices: Arc::clone(devices),
            selected,
            inventory: Arc::clone(read.inventory()),
            config: Arc::clone(config),
            features,
            env: plan::env_inputs(&config.comm_env, selected, &ctr.env),
            network: reads::pod_network(pod),
        };
        let prepared = self.last_plan.get_or_build(key, || {
            self.prepare(devices, pod, ctr, config, features, read)
        })?;
        // An unhealthy GPU is refused before anything is claimed.
        healthy(health, &prepared)?;
        self.check_cdi(&prepared, config)?;
        Ok(prepared)
    }

    /// Forgets what was kept for a pod that is gone.
    pub fn forget_pod(&self, sandbox_id: &str) {
        self.last_plan.forget(sandbox_id);
    }

    /// StopPodSandbox: a creation that still arrives is refused until the
    /// removal (see [`super::stopped_pods`]).
    pub fn pod_stopped(&self, sandbox_id: &str) {
        self.forget_pod(sandbox_id);
        self.stopped.stopped(sandbox_id);
    }

    /// RemovePodSandbox.
    pub fn pod_removed(&self, sandbox_id: &str) {
        self.forget_pod(sandbox_id);
        self.stopped.removed(sandbox_id);
    }

    /// Synchronize: the sandboxes the runtime lists, stopped ones included;
    /// a stopped one not among them was removed while the plugin was away.
    pub fn pods_listed(&self, listed: &std::collections::HashSet<&str>) {
        self.stopped.keep_listed(listed);
    }
}

/// What [`Devices::admit`] does with a claim the ledger refused: `Ok` to
/// make it once more (having waited for what may end the refusal), or the
/// refusal to tell.
pub type Retry<'a> = dyn Fn(LedgerError, &[crate::ledger::Claim]) -> Result<(), LedgerError> + 'a;

/// The pod as the ledger names it.
pub(super) fn pod_ref(pod: &PodSandbox) -> PodRef {
    PodRef {
        sandbox_id: pod.id.clone(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
    }
}

/// The pod as the grant check knows it.
fn grant_identity(pod: &PodSandbox) -> crate::grant::PodIdentity<'_> {
    crate::grant::PodIdentity {
        namespace: &pod.namespace,
        name: &pod.name,
        uid: &pod.uid,
        config_source: reads::annotations(pod).get(crate::grant::model::CONFIG_SOURCE),
    }
}

#[path = "ahead.rs"]
mod ahead;
pub use ahead::Ahead;

#[path = "inventory_cache.rs"]
mod inventory_cache;
pub use inventory_cache::POLL_PERIOD;

#[path = "prepare.rs"]
mod prepare;
pub(crate) use prepare::network_need;

/// Refuses a plan that claims a GPU the health store marks unhealthy,
/// naming its entry.
fn healthy(health: &HealthStore, prepared: &super::last_plan::Prepared) -> Result<(), DeviceError> {
    gpu::check_claims(health, &prepared.claims).map_err(|source| DeviceError::Health {
        entry: match &source {
            GpuError::Unhealthy { uuid, .. } => prepared.entry_of(&DeviceId::Gpu(uuid.clone())),
            _ => String::new(),
        },
        source,
    })
}

#[cfg(test)]
use vf_attach::pod_mac;
pub(crate) use vf_attach::vf_attachments;

#[path = "vf_attach.rs"]
mod vf_attach;

#[cfg(test)]
#[path = "devices_tests.rs"]
mod tests;
