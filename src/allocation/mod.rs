//! What a pod asks for: Koordinator's `device-allocated` annotation and the keys next
//! to it, parsed into typed values. Pure: no I/O, no inventory.
//!
//! Keys devgate reads (nothing else on the pod is read):
//!
//! | key | on | format | effect |
//! |---|---|---|---|
//! | `scheduling.koordinator.sh/device-allocated` | pod annotation | JSON, keyed by device type (`gpu`, `rdma`, `fpga`) | the devices of the pod |
//! | `koordinator.sh/gpu-isolation-provider` | pod label | exactly `HAMi-core` | HAMi-core limits for shared GPUs |
//! | `devgate.io/containers` | pod annotation | comma-separated container names | only these containers get the devices |
//!
//! Devices are named by minor, GPU UUID or PCI address only and are resolved against
//! the node's inventory by [`crate::plan`]; no path, device number or command is ever
//! taken from the pod.
mod entry_error;
mod last_pod;
mod parse;
pub mod quantity;
mod raw;
mod spelling;
mod vf_settings;

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use serde::{Deserialize, Serialize};

use crate::inventory::PciAddr;
pub use last_pod::LastPod;
pub(crate) use parse::is_dns_label;
pub use parse::parse_allocation;
pub use quantity::{parse_quantity, QuantityError};

/// Koordinator's allocation annotation, written by koord-scheduler at PreBind.
pub const DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";
/// Pod label selecting HAMi-core isolation for shared GPUs (case-sensitive, as koordlet).
pub const GPU_ISOLATION_PROVIDER: &str = "koordinator.sh/gpu-isolation-provider";
/// The only value of [`GPU_ISOLATION_PROVIDER`] that turns HAMi-core on.
pub const HAMI_CORE: &str = "HAMi-core";
/// devgate's own annotation: the containers that get the devices.
pub const CONTAINERS: &str = "devgate.io/containers";
/// The pod's own VF settings (JSON, the fields of `[vf.defaults]`), applied
/// only where the node config's `[vf] pod_settings` allows each one.
pub const VF_SETTINGS: &str = "devgate.io/vf-settings";

/// Resource names inside an entry's `resources`.
pub const RES_GPU_CORE: &str = "koordinator.sh/gpu-core";
pub const RES_GPU_MEMORY_RATIO: &str = "koordinator.sh/gpu-memory-ratio";
pub const RES_GPU_MEMORY: &str = "koordinator.sh/gpu-memory";
pub const RES_RDMA: &str = "koordinator.sh/rdma";

/// Largest annotation value accepted, in bytes.
pub const MAX_ANNOTATION_BYTES: usize = 64 * 1024;
/// Most device entries plus VF entries in one annotation.
pub const MAX_ENTRIES: usize = 256;
/// Most device types (top-level keys) in one annotation.
pub const MAX_TYPES: usize = 16;
/// Most resources in one entry.
pub const MAX_RESOURCES: usize = 32;
/// Longest `id` (a GPU UUID is 40 characters; a MIG UUID 40 more).
pub const MAX_ID_LEN: usize = 128;
/// Longest resource name (a Kubernetes qualified name: 253 prefix + 63 name).
pub const MAX_RESOURCE_NAME_LEN: usize = 317;
/// Longest device type key.
pub const MAX_TYPE_LEN: usize = 63;
/// Most names in `devgate.io/containers`.
pub const MAX_CONTAINERS: usize = 64;

/// Why a pod's device keys cannot be used. Each variant names the key, the entry
/// (`gpu[1]`, `rdma[0].vfs[2]`, or `-` for the whole value) and the reason; `Display`
/// is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    #[error("{annotation}: -: {len} bytes, over the limit of {limit}")]
    TooLarge {
        annotation: &'static str,
        len: usize,
        limit: usize,
    },
    #[error("{annotation}: {entry}: malformed: {reason}")]
    Malformed {
        annotation: &'static str,
        entry: String,
        reason: String,
    },
    #[error("{annotation}: {entry}: more than {limit} {what}")]
    TooMany {
        annotation: &'static str,
        entry: String,
        what: &'static str,
        limit: usize,
    },
    #[error("{annotation}: {entry}: {field} longer than {limit} characters")]
    TooLong {
        annotation: &'static str,
        entry: String,
        field: String,
        limit: usize,
    },
    #[error("{annotation}: {entry}: {field} {value:?} has characters not allowed there")]
    BadName {
        annotation: &'static str,
        entry: String,
        field: String,
        value: String,
    },
    #[error("{annotation}: {entry}: missing {field}")]
    Missing {
        annotation: &'static str,
        entry: String,
        field: &'static str,
    },
    #[error("{annotation}: {entry}: {field} {value} is negative")]
    Negative {
        annotation: &'static str,
        entry: String,
        field: &'static str,
        value: i64,
    },
    #[error("{annotation}: {entry}: {field} {value} is out of range {range}")]
    OutOfRange {
        annotation: &'static str,
        entry: String,
        field: String,
        /// As the pod wrote it, its sign kept.
        value: i64,
        range: &'static str,
    },
    #[error("{annotation}: {entry}: {field}: {reason}")]
    Quantity {
        annotation: &'static str,
        entry: String,
        field: String,
        reason: QuantityError,
    },
    #[error("{annotation}: {entry}: {field} {value:?} is not a pci address")]
    BadBusId {
        annotation: &'static str,
        entry: String,
        field: &'static str,
        value: String,
    },
    #[error("{annotation}: {entry}: duplicate {what} (also in {first})")]
    Duplicate {
        annotation: &'static str,
        entry: String,
        what: String,
        first: String,
    },
}

/// Whole-device share: Koordinator counts 100 per device.
pub const FULL_SHARE: u32 = 100;

/// A GPU's resources, as the scheduler wrote them. Missing values stay `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuResources {
    /// `gpu-core`: percent of the GPU's SMs, 0..=100.
    pub core_percent: Option<u32>,
    /// `gpu-memory-ratio`: percent of the GPU's memory, 0..=100.
    pub memory_ratio_percent: Option<u32>,
    /// `gpu-memory`: bytes.
    pub memory_bytes: Option<u64>,
}

impl GpuResources {
    /// The `gpu-core` percent the scheduler counted for this GPU. A pod that
    /// asks for GPU memory only gets entries with memory and no core
    /// (Koordinator's `calcDesiredRequestsAndCountForGPU` puts `gpu-core` in
    /// only when it was requested), and the GPU's core stays free for others:
    /// 0. An entry with no resources at all (old annotations): the whole GPU.
    pub fn core_counted(&self) -> u32 {
        match self.core_percent {
            Some(core) => core,
            None if self.memory_ratio_percent.is_some() || self.memory_bytes.is_some() => 0,
            None => FULL_SHARE,
        }
    }

    /// A claim below 100% of either core or memory shares the GPU with other pods.
    /// A missing value counts as 100: old annotations carried no resources at all.
    pub fn is_shared(&self) -> bool {
        self.core_percent.unwrap_or(FULL_SHARE) < FULL_SHARE
            || self.memory_ratio_percent.unwrap_or(FULL_SHARE) < FULL_SHARE
    }
}

/// One `gpu` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuEntry {
    /// The N of `/dev/nvidiaN`.
    pub minor: u32,
    /// The GPU UUID from the Device CR, when the scheduler filled it (since Nov 2024).
    pub uuid: Option<String>,
    pub resources: GpuResources,
}

/// One VF of an `rdma` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VfRef {
    pub bus_id: PciAddr,
    /// Reported as -1 by koordlet and dropped when 0 (`omitempty`); never used.
    pub minor: Option<i32>,
}

/// One `rdma` entry: a NIC physical function, used whole or through its VFs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaEntry {
    pub minor: u32,
    /// The PF's PCI address from the Device CR, when the scheduler filled it.
    pub pf: Option<PciAddr>,
    /// `koordinator.sh/rdma`: 100 = the whole device, less = a share. Missing = 100.
    pub share_percent: u32,
    /// Empty: the PF itself is used.
    pub vfs: Vec<VfRef>,
}

/// One `fpga` entry; parsed and checked, but there is nothing node-side to inject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FpgaEntry {
    pub minor: u32,
    pub id: Option<String>,
}

/// The parsed `device-allocated` annotation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Allocation {
    pub gpus: Vec<GpuEntry>,
    pub rdma: Vec<RdmaEntry>,
    pub fpga: Vec<FpgaEntry>,
    /// Device types devgate does not know, kept so they can be reported.
    pub ignored_types: Vec<String>,
}

impl Allocation {
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty() && self.rdma.is_empty() && self.fpga.is_empty()
    }
}

/// Which containers of the pod get the devices.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "select", content = "names", rename_all = "snake_case")]
pub enum ContainerSelector {
    /// No `devgate.io/containers`: every container, init containers included, as
    /// koordlet does (its hooks run for every CreateContainer of the pod).
    #[default]
    All,
    /// Only the named containers, whether app or init containers.
    Only(Vec<String>),
}

impl ContainerSelector {
    pub fn selects(&self, container: &str) -> bool {
        match self {
            ContainerSelector::All => true,
            ContainerSelector::Only(names) => names.iter().any(|n| n == container),
        }
    }
}

/// Everything devgate reads from a pod.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PodDevices {
    pub allocation: Allocation,
    /// The pod label asks for HAMi-core isolation.
    pub hami_core: bool,
    pub containers: ContainerSelector,
    /// `devgate.io/vf-settings`, parsed and range-checked; whether the node
    /// allows them is the plan's question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf_settings: Option<crate::config::VfSettings>,
}

/// Read access to a pod's annotations or labels, whatever map the caller holds.
pub trait Metadata {
    fn get_value(&self, key: &str) -> Option<&str>;
}

impl<S: BuildHasher> Metadata for HashMap<String, String, S> {
    fn get_value(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Metadata for BTreeMap<String, String> {
    fn get_value(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// Reads every key devgate uses from a pod's annotations and labels.
pub fn parse_pod(
    annotations: &impl Metadata,
    labels: &impl Metadata,
) -> Result<PodDevices, AllocationError> {
    let allocation = match annotations.get_value(DEVICE_ALLOCATED) {
        Some(text) => parse_allocation(text.as_bytes())?,
        None => Allocation::default(),
    };
    let containers = match annotations.get_value(CONTAINERS) {
        Some(text) => parse::parse_containers(text)?,
        None => ContainerSelector::All,
    };
    let vf_settings = match annotations.get_value(VF_SETTINGS) {
        Some(text) => Some(vf_settings::parse_vf_settings(text)?),
        None => None,
    };
    Ok(PodDevices {
        allocation,
        hami_core: labels.get_value(GPU_ISOLATION_PROVIDER) == Some(HAMI_CORE),
        containers,
        vf_settings,
    })
}

#[cfg(test)]
mod tests;
