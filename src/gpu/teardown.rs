//! [`GpuTeardown`]: what runs before a pod's GPU claims go (outside the ledger lock;
//! releases of pods sharing a GPU hold its release lock through their commit, so
//! that exactly one of them sees itself as the last holder).
//!
//! For each GPU the pod claimed: its processes still holding the GPU are ended. When
//! the pod is the GPU's last holder, any other process holding it fails the teardown
//! (the ledger then quarantines the GPU rather than hand it on in use), and otherwise
//! the GPU's tenant-visible state is reset. The NVIDIA toolkit does no teardown at all
//! (its poststop hook is a no-op); epilogs on HPC clusters do the same checks with
//! `nvidia-smi --query-compute-apps` and `fuser /dev/nvidia*`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::config::GpuConfig;
use crate::inventory::Inventory;
use crate::ledger::{DeviceId, Ledger, PodRecord, Share};

use super::cgroup::PodCgroups;
use super::health::{observe, Fault as HealthFault, HealthStore};
use super::host::{Host, ProcHost};
use super::kill::KillTimes;
use super::nvml::{self, Nvml};
use super::reset;
use super::scan::Users;
use super::GpuError;

/// GPUs released by this teardown, by sandbox, remembered so that pods sharing a
/// GPU and released in one ledger transaction see each other gone (the ledger
/// commits after all of them). Older entries are long committed.
const RELEASED_MEMORY: usize = 4096;
/// Rounds of ending the pod's GPU users and looking again before the release
/// gives up (the GPU stays quarantined).
const END_ROUNDS: usize = 3;

/// One GPU being released.
#[derive(Debug, Clone)]
struct Target {
    uuid: String,
    bus_id: String,
    rdev: u64,
    /// The pod held it exclusively.
    whole: bool,
    /// No other pod holds it.
    last: bool,
}

/// GPU teardown for the ledger.
pub struct GpuTeardown {
    inventory: RwLock<Arc<Inventory>>,
    config: GpuConfig,
    host: Arc<dyn Host>,
    nvml: Arc<dyn Nvml>,
    claims: Arc<dyn ClaimView>,
    health: HealthStore,
    ignored: PodCgroups,
    /// Processes that hold GPUs as node daemons, besides this one: the
    /// running plugin's NVML, seen by `devgate clear` (see [`Self::skipping`]).
    skipped: Vec<u32>,
    /// The node's pods, for `gpu.ignored_pods`; shared with the plugin.
    known_pods: Arc<super::KnownPods>,
    pod_cgroups: Mutex<HashMap<String, PodCgroups>>,
    /// (sandbox, GPU UUID) pairs.
    released: Mutex<VecDeque<(String, String)>>,
}

impl GpuTeardown {
    pub fn new(
        inventory: impl Into<Arc<Inventory>>,
        config: GpuConfig,
        host: Arc<dyn Host>,
        nvml: Arc<dyn Nvml>,
        claims: Arc<dyn ClaimView>,
    ) -> GpuTeardown {
        GpuTeardown {
            inventory: RwLock::new(inventory.into()),
            health: HealthStore::new(&config.health_dir),
            ignored: PodCgroups::ignoring(&config.ignored_cgroups),
            skipped: Vec::new(),
            known_pods: Arc::default(),
            config,
            host,
            nvml,
            claims,
            pod_cgroups: Mutex::new(HashMap::new()),
            released: Mutex::new(VecDeque::new()),
        }
    }

    /// The node's teardown: processes from `/proc`, NVML loaded on first use.
    pub fn for_node(
        inventory: impl Into<Arc<Inventory>>,
        config: GpuConfig,
        ledger: Ledger,
    ) -> GpuTeardown {
        let nvml = nvml::load(config.nvml, &config.nvml_library);
        let host = Arc::new(ProcHost::new(std::path::Path::new("/proc")));
        GpuTeardown::new(inventory, config, host, nvml, Arc::new(ledger))
    }

    /// Counts `pids` as no user of any GPU, as this process is not: a
    /// process other than the plugin cleaning a GPU (`devgate clear`) must
    /// not find the plugin's own NVML handles in the way, wherever its
    /// cgroup is (a DaemonSet pod's is no `gpu.ignored_cgroups` entry).
    pub fn skipping(mut self, pids: impl IntoIterator<Item = u32>) -> GpuTeardown {
        self.skipped.extend(pids);
        self
    }

    /// The pods the plugin learns from the runtime, whose daemons named by
    /// `gpu.ignored_pods` are no users of any GPU.
    pub fn with_known_pods(mut self, known: Arc<super::KnownPods>) -> GpuTeardown {
        self.known_pods = known;
        self
    }

    pub fn health(&self) -> &HealthStore {
        &self.health
    }

    /// The NVML handle teardown uses, shared with the health monitor.
    pub fn nvml(&self) -> Arc<dyn Nvml> {
        Arc::clone(&self.nvml)
    }

    pub fn config(&self) -> &GpuConfig {
        &self.config
    }

    pub fn inventory(&self) -> Arc<Inventory> {
        Arc::clone(&self.inventory.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces the inventory after a rediscovery.
    pub fn set_inventory(&self, inventory: impl Into<Arc<Inventory>>) {
        *self.inventory.write().unwrap_or_else(|p| p.into_inner()) = inventory.into();
    }

    fn times(&self) -> KillTimes {
        KillTimes {
            grace: Duration::from_millis(self.config.kill_grace_ms),
            kill_wait: Duration::from_millis(self.config.kill_wait_ms),
        }
    }

    fn targets(&self, pod: &PodRecord) -> (Vec<Target>, Vec<Fault>) {
        let (mut targets, mut faults) = (Vec::new(), Vec::new());
        for claim in &pod.claims {
            if let DeviceId::Gpu(uuid) = &claim.device {
                match self.target(uuid, claim.share, Some(&pod.pod.sandbox_id)) {
                    Ok(t) => targets.push(t),
                    Err(error) => faults.push(Fault {
                        gpus: vec![uuid.clone()],
                        error,
                    }),
                }
            }
        }
        (targets, faults)
    }

    /// Resolves a GPU to its device number; `sandbox` is the releasing pod, if any.
    fn target(&self, uuid: &str, share: Share, sandbox: Option<&str>) -> Result<Target, GpuError> {
        let inv = self.inventory.read().unwrap_or_else(|p| p.into_inner());
        let gpu = inv.gpus.iter().find(|g| g.uuid == uuid);
        let gpu = gpu.ok_or_else(|| GpuError::UnknownGpu {
            uuid: uuid.to_string(),
        })?;
        let major = inv
            .nvidia_majors
            .nvidia
            .ok_or_else(|| GpuError::NoNvidiaMajor {
                uuid: uuid.to_string(),
            })?;
        let last = match sandbox {
            Some(sandbox) => self.is_last(uuid, sandbox)?,
            None => true,
        };
        Ok(Target {
            uuid: uuid.to_string(),
            bus_id: gpu.bus_id.to_string(),
            rdev: libc::makedev(major, gpu.minor),
            whole: share == Share::Exclusive,
            last,
        })
    }

    fn is_last(&self, uuid: &str, sandbox: &str) -> Result<bool, GpuError> {
        let holders = self
            .claims
            .holders(&DeviceId::Gpu(uuid.to_string()))
            .map_err(|reason| GpuError::Claims {
                uuid: uuid.to_string(),
                reason,
            })?;
        let released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        Ok(holders
            .iter()
            .all(|h| h == sandbox || released.iter().any(|(s, u)| s == h && u == uuid)))
    }

    /// Notes that `sandbox` gave `gpus` up clean: per GPU, since a pod whose
    /// other GPU failed keeps that one.
    fn mark_released<'a>(&self, sandbox: &str, gpus: impl Iterator<Item = &'a str>) {
        let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        for uuid in gpus {
            if released.len() >= RELEASED_MEMORY {
                released.pop_front();
            }
            released.push_back((sandbox.to_string(), uuid.to_string()));
        }
    }

    /// Forgets that `sandbox` gave its GPUs up: the ledger kept the pod, so
    /// it holds them still.
    fn unmark_released(&self, sandbox: &str) {
        let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        released.retain(|(s, _)| s != sandbox);
    }

    /// Ends the pod's users of `targets`, then checks and resets those it held
    /// last. A GPU a process of the pod still holds is left in doubt, not
    /// the others; all of them while a process of `granted` (the pod's
    /// containers given its GPUs) runs.
    fn clean(&self, pod: &PodCgroups, granted: &PodCgroups, targets: &[Target]) -> Vec<Fault> {
        let mut skip = vec![std::process::id()];
        skip.extend(&self.skipped);
        let ended = match self.end_pod_users(pod, granted, targets, &skip) {
            Ok(ended) => ended,
            Err(e) => return vec![Fault::all(targets, e)],
        };
        let mut faults: Vec<Fault> = ended.stuck.into_iter().collect();
        let stuck: Vec<String> = Fault::gpus_of(&faults)
            .into_iter()
            .map(String::from)
            .collect();
        let mut reset_ok = Vec::new();
        // Without NVML on a node with the driver, the reset below would pass
        // without resetting anything: the GPUs stay quarantined until it loads.
        let no_nvml = self.config.nvml && !self.nvml.present() && self.host.nvidia_driver_loaded();
        for t in targets
            .iter()
            .filter(|t| t.last && !stuck.contains(&t.uuid))
        {
            if let Some(pids) = ended.split.outside.get(&t.rdev) {
                tracing::warn!(gpu = %t.uuid, pids = ?pids, "gpu open outside the released pod");
                let pids = pids.clone();
                let uuid = t.uuid.clone();
                faults.push(Fault::of(t, GpuError::OutsideUsers { uuid, pids }));
                continue;
            }
            if no_nvml {
                let uuid = t.uuid.clone();
                faults.push(Fault::of(t, GpuError::NvmlUnavailable { uuid }));
                continue;
            }
            // Users NVML alone would see are unknown: not handed on.
            if let Some(e) = ended.users.blind(&t.uuid) {
                faults.push(Fault::of(t, GpuError::Nvml(e.clone())));
                continue;
            }
            let errs = reset::reset_gpu(self.nvml.as_ref(), &t.uuid, &self.config, t.whole);
            if errs.is_empty() {
                reset_ok.push(t);
            }
            faults.extend(errs.into_iter().map(|e| Fault::of(t, e)));
            self.note_memory_health(&t.uuid);
        }
        // A full reset needs every GPU idle and each of these reset first.
        // Where one failed, none of them gets it now: they all stay for the
        // retry rather than go back with the light cleaning alone.
        if self.config.full_reset {
            if faults.is_empty() {
                faults.extend(self.full_resets(&reset_ok, &ended.users));
            } else {
                // Those it held last, which it would have reset: a shared
                // GPU another pod still holds is that pod's to reset.
                let last = targets.iter().filter(|t| t.last).map(|t| t.uuid.as_str());
                Fault::widen(&mut faults, last);
            }
        }
        faults
    }

    /// The device numbers of every GPU of the node a daemon's NVML attaches
    /// to: not those the inventory finds unusable (`NVreg_ExcludedGpus`, off
    /// the bus), which nothing holds, nor those the health monitor found lost
    /// (XID 79, `GPU_IS_LOST`), which a daemon started since cannot open.
    fn all_gpu_devs(&self) -> Vec<u64> {
        let health = self.health.current().ok();
        let lost = |uuid: &str| {
            health
                .as_ref()
                .and_then(|h| h.unhealthy(uuid))
                .is_some_and(|u| {
                    u.faults
                        .iter()
                        .any(|f| matches!(f, HealthFault::Lost { .. }))
                })
        };
        let inv = self.inventory.read().unwrap_or_else(|p| p.into_inner());
        let Some(major) = inv.nvidia_majors.nvidia else {
            return Vec::new();
        };
        inv.gpus
            .iter()
            .filter(|g| matches!(g.health, crate::inventory::Health::Healthy))
            .filter(|g| !lost(&g.uuid))
            .map(|g| libc::makedev(major, g.minor))
            .collect()
    }

    /// The devices to scan: the targets, and every GPU when a full reset may follow
    /// (it needs all of them idle, nvidia-smi(1) `--gpu-reset`), but those the
    /// inventory finds unusable (`NVreg_ExcludedGpus`), which nothing holds
    /// and NVML does not list: asked about, they would leave their users
    /// unknown and the full reset never run. A lost GPU (XID 79) is still
    /// asked about: its users are unknown indeed, and no full reset runs.
    fn watched(&self, targets: &[Target]) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> =
            targets.iter().map(|t| (t.uuid.clone(), t.rdev)).collect();
        if !self.config.full_reset {
            return out;
        }
        let inv = self.inventory.read().unwrap_or_else(|p| p.into_inner());
        if let Some(major) = inv.nvidia_majors.nvidia {
            let usable = inv
                .gpus
                .iter()
                .filter(|g| matches!(g.health, crate::inventory::Health::Healthy));
            for g in usable {
                if !out.iter().any(|(u, _)| *u == g.uuid) {
                    out.push((g.uuid.clone(), libc::makedev(major, g.minor)));
                }
            }
        }
        out
    }

    fn full_resets(&self, targets: &[&Target], users: &Users) -> Vec<Fault> {
        if !users.is_idle() {
            tracing::warn!("full gpu reset skipped: a gpu on the node is in use");
            return Vec::new();
        }
        targets
            .iter()
            .filter_map(|t| {
                let done = reset::full_reset(self.host.as_ref(), &self.config, &t.uuid, &t.bus_id);
                done.err().map(|e| Fault::of(t, e))
            })
            .collect()
    }

    /// A GPU handed back with pages waiting for retirement needs a reset first: mark it
    /// unhealthy now rather than at the monitor's next check.
    fn note_memory_health(&self, uuid: &str) {
        let Ok(reading) = self.nvml.memory_health(uuid) else {
            return;
        };
        let faults = observe(&[], Some(&reading), &mut None, &[]);
        if faults.is_empty() {
            return;
        }
        if let Err(e) = self.health.mark(uuid, &faults, crate::ledger::now_unix()) {
            tracing::warn!(gpu = uuid, error = %nri::ErrorChain(&e), "gpu health not recorded");
        }
    }
}

mod claims;
mod end;
mod pods;
mod release;
mod retry;
pub use claims::ClaimView;
use end::Fault;
pub use retry::Retried;
