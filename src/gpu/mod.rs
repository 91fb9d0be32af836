//! GPU teardown and health: no GPU is handed on dirty.
//!
//! - [`GpuTeardown`] implements the ledger's `Teardown`: when a pod releases a GPU, its
//!   leftover processes are ended (SIGTERM, grace, SIGKILL), processes of anyone else
//!   keep the GPU in quarantine, and what a tenant could change is reset through NVML.
//! - [`HealthStore`] keeps GPU health across reboots; [`HealthMonitor`] feeds it from
//!   NVML events and readings and lets GPUs recover; [`check_claims`] is the gate the
//!   plugin calls before claiming.
//!
//! Every host touch goes through [`Host`] (procfs, signals, commands) and [`Nvml`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use devgate::config::Config;
//! use devgate::gpu::{check_claims, GpuTeardown};
//! use devgate::ledger::{Ledger, PodRef};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::default();
//! let ledger = Ledger::open(std::path::Path::new("/run/devgate"))?;
//! let inventory = devgate::inventory::Inventory::default();
//! let teardown = GpuTeardown::for_node(inventory, config.gpu.clone(), ledger.clone());
//! check_claims(teardown.health(), &[])?;
//! teardown.set_pod_cgroups("sandbox-id", &["/kubepods/burstable/pod1234"]);
//! ledger.release_pod("sandbox-id", &teardown)?;
//! # Ok(()) }
//! ```

mod cgroup;
pub mod error;
mod facts;
pub mod health;
pub mod host;
mod kill;
mod known_pods;
pub mod nvml;
mod reset;
mod scan;
mod teardown;

pub use cgroup::{ignored_cgroup_problem, PodCgroups};
pub use error::GpuError;
pub use facts::{NodeFacts, OpenLibrary};
pub use health::{HealthMonitor, HealthPolicy, HealthState, HealthStore};
pub use host::{Host, ProcHost, Signal};
pub use known_pods::{is_daemon, KnownPods, DAEMON_PODS_FILE};
pub use nvml::{NoNvml, Nvml};
pub use teardown::{ClaimView, GpuTeardown, Retried};

use crate::config::GpuConfig;
use crate::ledger::Claim;

/// Discovery of `host_root` with NVML's indices and memory where `[gpu] nvml`
/// is on, one of `nvml_library` loads and NVML names the root's GPUs as it
/// does (the machine's own root); plain discovery otherwise.
pub fn discover_node(host_root: &std::path::Path, gpu: &GpuConfig) -> crate::inventory::Inventory {
    let libraries = gpu.nvml.then(|| gpu.nvml_library.clone());
    NodeFacts::nvml(libraries).discover(host_root)
}

/// [`discover_node`] with the GPU health kept under `health_dir` merged in, as
/// people are shown the node; a store that cannot be read is a warning.
pub fn discover_node_with_health(
    host_root: &std::path::Path,
    gpu: &GpuConfig,
    health_dir: &std::path::Path,
) -> crate::inventory::Inventory {
    let mut inv = discover_node(host_root, gpu);
    match HealthStore::new(health_dir).snapshot() {
        Ok(health) => health::merge_into(&mut inv, &health),
        Err(e) => inv.warnings.push(format!("gpu health: {e}")),
    }
    inv
}

/// Fails when a claim names an unhealthy GPU. Quarantine is `Ledger::claim`'s check.
pub fn check_claims(health: &HealthStore, claims: &[Claim]) -> Result<(), GpuError> {
    let gpus = claims.iter().filter_map(Claim::gpu);
    let mut state = None;
    for uuid in gpus {
        let state = match &mut state {
            Some(s) => s,
            None => state.insert(health.current()?),
        };
        if let Some(cond) = state.unhealthy(uuid) {
            return Err(GpuError::Unhealthy {
                uuid: uuid.to_string(),
                reason: cond.reason(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
