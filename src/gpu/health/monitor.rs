//! The health loop: wait for NVML events up to one interval, read each GPU's memory
//! health, fold both into the store. One step is one check.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{apply, observe, Fault, HealthStore, Observation, Recovery, Transition};
use crate::config::GpuConfig;
use crate::gpu::nvml::{GpuEvent, MemoryHealth, Nvml, NvmlError};
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

/// Watches the GPUs of an inventory.
pub struct HealthMonitor {
    nvml: Arc<dyn Nvml>,
    store: HealthStore,
    uuids: Vec<String>,
    policy: HealthPolicy,
    /// When a clean check last counted (unix seconds): the wait returns at
    /// the first event, ignored application XIDs included, and clean checks
    /// count once an interval, however often a tenant's XIDs wake it.
    last_counted: AtomicU64,
}

impl HealthMonitor {
    pub fn new(
        nvml: Arc<dyn Nvml>,
        store: HealthStore,
        inventory: &Inventory,
        policy: HealthPolicy,
    ) -> HealthMonitor {
        let uuids = inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
        HealthMonitor {
            nvml,
            store,
            uuids,
            policy,
            last_counted: AtomicU64::new(0),
        }
    }

    /// One check at `now` (unix seconds). Blocks up to one interval for events.
    pub fn step(&self, now: u64) -> Result<Vec<Transition>, GpuError> {
        let (events, events_ok) = self.wait();
        self.check(events, events_ok, now)
    }

    /// The events of up to one interval, and whether the wait worked.
    fn wait(&self) -> (Vec<GpuEvent>, bool) {
        match self.nvml.wait_events(self.policy.interval) {
            Ok(events) => (events, true),
            Err(e) => {
                tracing::warn!(error = %nri::ErrorChain(&e), "gpu health: event wait failed");
                (Vec::new(), false)
            }
        }
    }

    /// Folds `events` and each GPU's memory readings into the store. If the wait
    /// failed (`events_ok` false) nothing is known about any GPU: no check counts
    /// as clean. (k8s-device-plugin marks every device unhealthy then; a transient
    /// NVML error should not drain a node, so this only holds recovery back.)
    fn check(
        &self,
        events: Vec<GpuEvent>,
        events_ok: bool,
        now: u64,
    ) -> Result<Vec<Transition>, GpuError> {
        let mut by_gpu: BTreeMap<String, Vec<GpuEvent>> = BTreeMap::new();
        for e in events {
            by_gpu.entry(e.uuid.clone()).or_default().push(e);
        }
        let mut uuids: BTreeSet<String> = self.uuids.iter().cloned().collect();
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
                let obs = Observation {
                    faults,
                    complete: events_ok && reading.is_some(),
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
                        code: code @ (15 | 16),
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
        if !self.nvml.present() && self.uuids.is_empty() {
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
            let (events, waited) = self.wait();
            let stored = match self.check(events, waited, crate::ledger::now_unix()) {
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
            if !stored || !waited {
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
