//! GPU health that survives restarts and reboots, and recovers.
//!
//! Faults: critical XIDs (NVML events; application XIDs ignored as in k8s-device-plugin
//! `internal/rm/health.go`), double-bit ECC errors (events, or the volatile counter
//! rising, or restarting with errors already counted), pages pending retirement and pending or failed row remaps (nvidia-smi
//! `retired_pages.pending`, `remapped_rows`). Unlike Koordinator's koordlet, which never
//! returns a GPU to service until it restarts, a GPU here recovers after a number of
//! consecutive clean checks and a quiet period with no new fault. A pending retirement
//! or remap is seen on every check until a reset clears it, so it holds the GPU out.

mod monitor;
mod store;
mod view;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use monitor::{HealthMonitor, HealthPolicy};
pub use store::HealthStore;
pub use view::{merge_into, table};

use super::nvml::{EventKind, GpuEvent, MemoryHealth};

pub const HEALTH_VERSION: u32 = 1;

/// One reason a GPU is out of service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    Xid {
        code: u64,
    },
    DoubleBitEcc,
    RetiredPagesPending,
    RowRemapPending,
    RowRemapFailed,
    /// NVML answers `GPU_IS_LOST` (15, fallen off the bus, XID 79) or
    /// `RESET_REQUIRED` (16) for the GPU.
    Lost {
        code: i32,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Xid { code } => write!(f, "xid {code}"),
            Fault::DoubleBitEcc => f.write_str("double-bit ecc error"),
            Fault::RetiredPagesPending => f.write_str("retired pages pending"),
            Fault::RowRemapPending => f.write_str("row remap pending"),
            Fault::RowRemapFailed => f.write_str("row remap failed"),
            Fault::Lost {
                code: super::nvml::GPU_IS_LOST,
            } => f.write_str("gpu is lost (nvml)"),
            Fault::Lost { code } => write!(f, "gpu needs a reset (nvml code {code})"),
        }
    }
}

/// An unhealthy GPU's condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unhealthy {
    pub faults: Vec<Fault>,
    pub since_unix: u64,
    pub last_fault_unix: u64,
}

impl Unhealthy {
    pub fn reason(&self) -> String {
        let faults: Vec<String> = self.faults.iter().map(Fault::to_string).collect();
        faults.join(", ")
    }
}

/// One GPU's entry. A GPU without an entry is healthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GpuHealth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<Unhealthy>,
    /// Consecutive clean checks while unhealthy.
    #[serde(default)]
    pub clean_checks: u32,
    /// The volatile double-bit ECC count last seen; a rise is a fault, and so
    /// is a drop to more than 0 (a driver restart followed by errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dbe_seen: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_unix: Option<u64>,
}

/// The health document, keyed by GPU UUID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthState {
    pub version: u32,
    pub gpus: BTreeMap<String, GpuHealth>,
}

impl Default for HealthState {
    fn default() -> Self {
        HealthState {
            version: HEALTH_VERSION,
            gpus: BTreeMap::new(),
        }
    }
}

impl HealthState {
    /// The condition of an unhealthy GPU.
    pub fn unhealthy(&self, uuid: &str) -> Option<&Unhealthy> {
        self.gpus.get(uuid).and_then(|g| g.unhealthy.as_ref())
    }
}

/// What one check saw of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    pub faults: Vec<Fault>,
    /// Every reading answered; only a complete check counts towards recovery.
    pub complete: bool,
}

/// A change of a GPU's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Unhealthy { uuid: String, reason: String },
    Recovered { uuid: String },
}

/// Recovery thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    pub clean_checks: u32,
    pub quiet_secs: u64,
}

/// The faults in one GPU's events and readings. `dbe_seen` is updated.
pub fn observe(
    events: &[GpuEvent],
    reading: Option<&MemoryHealth>,
    dbe_seen: &mut Option<u64>,
    ignored_xids: &[u64],
) -> Vec<Fault> {
    let mut faults = Vec::new();
    for e in events {
        match e.kind {
            EventKind::Xid(code) if ignored_xids.contains(&code) => {}
            EventKind::Xid(code) => faults.push(Fault::Xid { code }),
            EventKind::DoubleBitEcc => faults.push(Fault::DoubleBitEcc),
        }
    }
    let Some(r) = reading else {
        faults.sort();
        faults.dedup();
        return faults;
    };
    if let Some(now) = r.dbe_volatile {
        // The counter restarts at 0 when the driver loads: a drop to 0 is a
        // new baseline; a drop to more than 0 is a restart followed by
        // errors, each of them new. (As many errors after a restart as were
        // seen before it read as no change: only a driver-load marker could
        // tell.)
        if dbe_seen.is_some_and(|seen| now > seen || (now < seen && now > 0)) {
            faults.push(Fault::DoubleBitEcc);
        }
        *dbe_seen = Some(now);
    }
    let flags = [
        (r.retired_pages_pending, Fault::RetiredPagesPending),
        (r.remap_pending, Fault::RowRemapPending),
        (r.remap_failed, Fault::RowRemapFailed),
    ];
    faults.extend(
        flags
            .into_iter()
            .filter(|(f, _)| *f == Some(true))
            .map(|(_, x)| x),
    );
    faults.sort();
    faults.dedup();
    faults
}

/// Applies one observation to one GPU's entry.
pub fn apply(
    uuid: &str,
    health: &mut GpuHealth,
    obs: &Observation,
    recovery: Recovery,
    now: u64,
) -> Option<Transition> {
    if !obs.faults.is_empty() {
        health.clean_checks = 0;
        return add_faults(uuid, health, &obs.faults, now);
    }
    let cond = health.unhealthy.as_mut()?;
    if !obs.complete {
        health.clean_checks = 0;
        return None;
    }
    // A fault time ahead of the clock (the clock stepped back since, by NTP
    // or by hand) counts as now: the quiet period runs from here, instead
    // of being stretched by the step.
    cond.last_fault_unix = cond.last_fault_unix.min(now);
    health.clean_checks = health.clean_checks.saturating_add(1);
    let quiet = now.saturating_sub(cond.last_fault_unix) >= recovery.quiet_secs;
    if health.clean_checks < recovery.clean_checks.max(1) || !quiet {
        return None;
    }
    health.unhealthy = None;
    health.clean_checks = 0;
    health.recovered_unix = Some(now);
    Some(Transition::Recovered {
        uuid: uuid.to_string(),
    })
}

/// Records faults; a transition only when the GPU was healthy.
pub fn add_faults(
    uuid: &str,
    health: &mut GpuHealth,
    faults: &[Fault],
    now: u64,
) -> Option<Transition> {
    health.clean_checks = 0;
    match &mut health.unhealthy {
        Some(cond) => {
            cond.faults.extend_from_slice(faults);
            cond.faults.sort();
            cond.faults.dedup();
            cond.last_fault_unix = now;
            None
        }
        None => {
            let mut faults = faults.to_vec();
            faults.sort();
            faults.dedup();
            let cond = Unhealthy {
                faults,
                since_unix: now,
                last_fault_unix: now,
            };
            let reason = cond.reason();
            health.unhealthy = Some(cond);
            Some(Transition::Unhealthy {
                uuid: uuid.to_string(),
                reason,
            })
        }
    }
}

#[cfg(test)]
mod tests;
