//! The plugin's errors: what a refused container's status says, and the one
//! conversion to the wire ([`nri::RpcError`]).

use std::sync::Arc;

use nri::{ttrpc::Code, RpcError};

use super::probe;
use crate::allocation::{AllocationError, DEVICE_ALLOCATED};
use crate::config::ConfigError;
use crate::gpu::GpuError;
use crate::hook::ResolvedError;
use crate::inventory::PciAddr;
use crate::ledger::LedgerError;
use crate::plan::PlanError;

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("devgate refused container {container:?} of pod {namespace}/{pod}")]
    Probe {
        namespace: String,
        pod: String,
        container: String,
        #[source]
        source: probe::ProbeError,
    },
    #[error("devgate cannot adjust container {container:?} of pod {namespace}/{pod}: its config from the runtime is invalid")]
    Config {
        namespace: String,
        pod: String,
        container: String,
        #[source]
        source: Arc<ConfigError>,
    },
    #[error("devgate refused container {container:?} of pod {namespace}/{pod}")]
    Devices {
        namespace: String,
        pod: String,
        container: String,
        #[source]
        source: Box<DeviceError>,
    },
}

/// The one conversion to the wire: the runtime fails the container with
/// this status and its text (error chain) reaches kubelet. None of these
/// codes is one the runtime treats as fatal for the connection.
impl RpcError for PluginError {
    fn code(&self) -> Code {
        match self {
            PluginError::Probe { .. } => Code::INVALID_ARGUMENT,
            PluginError::Config { .. } => Code::FAILED_PRECONDITION,
            PluginError::Devices { .. } => Code::FAILED_PRECONDITION,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// `entry` names the refused device's entry (`gpu[1]: `), or is empty
    /// when the refusal concerns the pod as a whole.
    #[error("{DEVICE_ALLOCATED}: {entry}{source}")]
    Claim {
        entry: String,
        #[source]
        source: LedgerError,
    },
    /// `entry` as in `Claim`: `rdma[0].vfs[1]: `, or empty where unknown.
    #[error("{DEVICE_ALLOCATED}: {entry}rdma vf {vf} has no host netdev to move into the pod")]
    NoNetdev { entry: String, vf: PciAddr },
    /// A restore of the VF began, or its attach, and stopped with it still
    /// in the pod, or the pod's other VFs are on the host.
    #[error("{DEVICE_ALLOCATED}: {entry}rdma vf {vf} is left in the pod by an earlier container's hook that stopped part way (half attached, half restored, or the pod's other vfs on the host): devgate brings it home, and the next attempt moves the pod's vfs in again")]
    RestoreUnfinished { entry: String, vf: PciAddr },
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
    /// `device_mode = "cdi"`: the runtime's spec would not give what the plan does.
    #[error("{DEVICE_ALLOCATED}: {entry}{source}")]
    Cdi {
        entry: String,
        #[source]
        source: crate::cdi::CdiError,
    },
    /// HAMi-core's lock directory is not one only root controls; `entry`
    /// as in `Claim`, the first shared GPU's.
    #[error(
        "{DEVICE_ALLOCATED}: {entry}a shared GPU's HAMi-core needs its lock directory: {source}"
    )]
    HamiLock {
        entry: String,
        #[source]
        source: crate::plan::HamiLockError,
    },
    /// A creation that reached the plugin after the sandbox's stop: a claim
    /// now would outlive the pod until its removal.
    #[error(
        "{DEVICE_ALLOCATED}: the pod's sandbox {sandbox} is stopped: nothing is claimed for it"
    )]
    Stopped { sandbox: String },
}
