//! The health loop: wait for NVML events up to one interval, read each GPU's memory
//! health, fold both into the store. One step is one check.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{apply, observe, Fault, HealthStore, Observation, Recovery, Transition};
use crate::config::GpuConfig;
use crate::gpu::nvml::{
    EventWait, GpuEvent, MemoryHealth, Nvml, NvmlError, GPU_IS_LOST, RESET_REQUIRED,
};
use crate::gpu::GpuError;
use crate::inventory::Inventory;

/// What the monitor judges by, from `[gpu]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    pub ignored_xids: Vec<u64>,
    pub recovery: Recovery,
    pub interval: Duration,
}

impl HealthPolicy {
    pub fn from_config(config: &GpuConfig) -> HealthPolicy {
        HealthPolicy {
            ignored_xids: config.ignored_xids.clone(),
            recovery: Recovery {
                clean_checks: config.recovery_clean_checks,
                quiet_secs: config.recovery_quiet_secs,
            },
            interval: Duration::from_secs(config.health_interval_secs.max(1)),
        }
    }
}

/// The UUIDs of the GPUs a check reads.
type GpuList = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// Watches the GPUs of an inventory.
pub struct HealthMonitor {
    nvml: Arc<dyn Nvml>,
    store: HealthStore,
    gpus: GpuList,
    policy: HealthPolicy,
    /// When a clean check last counted (unix seconds): the wait returns at
    /// the first event, ignored application XIDs included, and clean checks
    /// count once an interval, however often a tenant's XIDs wake it.
    last_counted: AtomicU64,
    /// NVML said events are not supported here, and the log said so once.
    told_unsupported: AtomicBool,
}

/// What a wait for events learnt.
struct Waited {
    /// `None`: the wait failed, so nothing is known of any GPU's events.
    seen: Option<EventWait>,
    /// The wait returned at once: the loop paces itself instead.
    at_once: bool,
}

impl HealthMonitor {
    pub fn new(
        nvml: Arc<dyn Nvml>,
        store: HealthStore,
        inventory: &Inventory,
        policy: HealthPolicy,
    ) -> HealthMonitor {
        let uuids: Vec<String> = inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
        HealthMonitor {
            nvml,
            store,
            gpus: Box::new(move || uuids.clone()),
            policy,
            last_counted: AtomicU64::new(0),
            told_unsupported: AtomicBool::new(false),
        }
    }

    /// Reads the GPUs `gpus` names at each check instead of the inventory's
    /// at the start: a GPU that comes after (a driver loaded late, a GPU
    /// back on the bus) has its memory readings checked too.
    pub fn following(mut self, gpus: impl Fn() -> Vec<String> + Send + Sync + 'static) -> Self {
        self.gpus = Box::new(gpus);
        self
    }

    /// One check at `now` (unix seconds). Blocks up to one interval for events.
    pub fn step(&self, now: u64) -> Result<Vec<Transition>, GpuError> {
        let waited = self.wait();
        self.check(waited.seen, now)
    }

    /// The events of up to one interval. Where NVML cannot give events at
    /// all (NOT_SUPPORTED), the wait counts as one that saw none: the
    /// readings are all there is to know, and recovery must not wait for
    /// events that never come.
    fn wait(&self) -> Waited {
        match self.nvml.wait_events(self.policy.interval) {
            Ok(seen) => Waited {
                seen: Some(seen),
                at_once: false,
            },
            Err(e) if e.events_unsupported() => {
                if !self.told_unsupported.swap(true, Ordering::Relaxed) {
                    tracing::info!(error = %nri::ErrorChain(&e), "gpu health: nvml gives no events here, judging by memory readings alone");
                }
                Waited {
                    seen: Some(EventWait::default()),
                    at_once: true,
                }
            }
            Err(e) => {
                tracing::warn!(error = %nri::ErrorChain(&e), "gpu health: event wait failed");
                Waited {
                    seen: None,
                    at_once: true,
                }
            }
        }
    }

    /// Folds what the wait `seen` and each GPU's memory readings into the
    /// store. Where the wait failed (`seen` is `None`), or a GPU was not
    /// registered for events, nothing is known of that GPU's events: its
    /// check does not count as clean. (k8s-device-plugin marks every device
    /// unhealthy then; a transient NVML error should not drain a node, so
    /// this only holds recovery back.)
    fn check(&self, seen: Option<EventWait>, now: u64) -> Result<Vec<Transition>, GpuError> {
        let (events, watched) = match seen {
            Some(mut w) => (std::mem::take(&mut w.events), Some(w)),
            None => (Vec::new(), None),
        };
        let mut by_gpu: BTreeMap<String, Vec<GpuEvent>> = BTreeMap::new();
        for e in events {
            by_gpu.entry(e.uuid.clone()).or_default().push(e);
        }
        let mut uuids: BTreeSet<String> = (self.gpus)().into_iter().collect();
        uuids.extend(by_gpu.keys().cloned());
        let readings: BTreeMap<String, (Option<MemoryHealth>, Option<Fault>)> =
            uuids.iter().map(|u| (u.clone(), self.reading(u))).collect();
        let interval = self.policy.interval.as_secs().max(1);
        // A check counts an interval after the last one counted, or at once
        // where the clock stepped back since: otherwise no check would count
        // until the clock caught up with the step.
        let last = self.last_counted.load(Ordering::Relaxed);
        let counts = now < last || now >= last.saturating_add(interval);
        if counts {
            self.last_counted.store(now, Ordering::Relaxed);
        }
        self.store.update(|state| {
            let mut out = Vec::new();
            for (uuid, (reading, lost)) in &readings {
                let entry = state.gpus.entry(uuid.clone()).or_default();
                let events = by_gpu.get(uuid).map(Vec::as_slice).unwrap_or(&[]);
                let mut faults = observe(
                    events,
                    reading.as_ref(),
                    &mut entry.dbe_seen,
                    &self.policy.ignored_xids,
                );
                faults.extend(lost.clone());
                // Within an interval of the last counted check only faults count.
                if faults.is_empty() && !counts {
                    continue;
                }
                let events_known = watched.as_ref().is_some_and(|w| w.watches(uuid));
                let obs = Observation {
                    faults,
                    complete: events_known && reading.is_some(),
                };
                out.extend(apply(uuid, entry, &obs, self.policy.recovery, now));
            }
            state.gpus.retain(|_, g| *g != Default::default());
            out
        })
    }

    /// The GPU's memory readings, or the fault a failed read shows: NVML's
    /// own word that the GPU is gone (k8s-device-plugin marks these devices
    /// unhealthy too). Any other failure tells nothing.
    fn reading(&self, uuid: &str) -> (Option<MemoryHealth>, Option<Fault>) {
        match self.nvml.memory_health(uuid) {
            Ok(r) => (Some(r), None),
            Err(e) => {
                tracing::warn!(gpu = uuid, error = %nri::ErrorChain(&e), "gpu health: read failed");
                let lost = match e {
                    NvmlError::Call {
                        code: code @ (GPU_IS_LOST | RESET_REQUIRED),
                        ..
                    } => Some(Fault::Lost { code }),
                    _ => None,
                };
                (None, lost)
            }
        }
    }

    /// Checks until `stop` is set. Without NVML there is nothing to watch.
    pub fn run(&self, stop: &AtomicBool) {
        if !self.nvml.present() && (self.gpus)().is_empty() {
            tracing::info!("gpu health: no nvml and no gpus, not monitoring");
            return;
        }
        // GPUs but no NVML yet (a driver still loading or just upgraded):
        // the library is looked for again rather than the GPUs never watched.
        while !self.nvml.present() {
            tracing::info!("gpu health: no nvml yet");
            for _ in 0..self.policy.interval.as_secs().max(1) {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1).min(self.policy.interval));
            }
        }
        while !stop.load(Ordering::Relaxed) {
            let waited = self.wait();
            let stored = match self.check(waited.seen, crate::ledger::now_unix()) {
                Ok(changes) => {
                    changes.iter().for_each(log_transition);
                    true
                }
                Err(e) => {
                    tracing::warn!(error = %nri::ErrorChain(&e), "gpu health: store update failed");
                    false
                }
            };
            // An event wait that fails (NVML without event support, or a driver
            // in trouble) returns at once: one check per interval, not a spin.
            if !stored || waited.at_once {
                std::thread::sleep(self.policy.interval);
            }
        }
    }
}

fn log_transition(t: &Transition) {
    match t {
        Transition::Unhealthy { uuid, reason } => {
            tracing::warn!(gpu = %uuid, reason = %reason, "gpu unhealthy")
        }
        Transition::Recovered { uuid } => tracing::info!(gpu = %uuid, "gpu recovered"),
    }
}
