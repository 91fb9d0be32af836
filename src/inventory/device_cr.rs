//! The Koordinator `Device` object (`scheduling.koordinator.sh/v1alpha1`) for an inventory,
//! shaped as koordlet reports it (pkg/koordlet/statesinformer/impl/states_device_linux.go).
//!
//! - GPUs: `id` = GPU UUID, `minor` = the N of `/dev/nvidiaN`, resources `gpu-core` and
//!   `gpu-memory-ratio` of 100 and `gpu-memory` when the memory is known.
//! - RDMA: one device per PF, `id` = PF bus id, resource `koordinator.sh/rdma` of 100, VFs in a
//!   single `vfGroups` entry with `minor: -1`, sorted by bus id. `minor` is always set, because
//!   the scheduler dereferences it: an `mlxN_M` device gets M (koordlet's own rule); any other
//!   device (Intel `rocep...`, ...) gets the next unused number above every such M, in PCI
//!   order, so minors stay unique and stable while the set of NICs does not change.
//! - Topology: `socketID` -1 (koordlet never sets it), `nodeID` the NUMA node (-1 read as 0,
//!   as koordlet does), `pcieID` the root complex `pciDDDD:BB`, `busID` the function.
//!
//! Devices are sorted by (type, minor), as koordlet sorts them before comparing.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::model::{Gpu, Health, Inventory, RdmaNic, Topology};
use super::parse::mlx_minor;

pub const API_VERSION: &str = "scheduling.koordinator.sh/v1alpha1";
pub const KIND: &str = "Device";
const GPU_VENDOR_LABEL: &str = "node.koordinator.sh/gpu-vendor";
const GPU_MODEL_LABEL: &str = "node.koordinator.sh/gpu-model";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: DeviceSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSpec {
    pub devices: Vec<DeviceInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    #[serde(rename = "type")]
    pub device_type: String,
    pub id: String,
    pub minor: i32,
    pub health: bool,
    /// Kubernetes quantities, as strings.
    pub resources: BTreeMap<String, String>,
    pub topology: DeviceTopology,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vf_groups: Vec<VfGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceTopology {
    #[serde(rename = "socketID")]
    pub socket_id: i32,
    #[serde(rename = "nodeID")]
    pub node_id: i32,
    #[serde(rename = "pcieID")]
    pub pcie_id: String,
    #[serde(rename = "busID")]
    pub bus_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VfGroup {
    pub vfs: Vec<VirtualFunction>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtualFunction {
    pub minor: i32,
    #[serde(rename = "busID")]
    pub bus_id: String,
}

/// The `Device` object of node `node_name`.
pub fn device_cr(inv: &Inventory, node_name: &str) -> Device {
    let mut devices: Vec<DeviceInfo> = inv.gpus.iter().map(gpu_device).collect();
    let minors = rdma_minors(&inv.rdma);
    devices.extend(
        inv.rdma
            .iter()
            .zip(minors)
            .map(|(nic, m)| rdma_device(nic, m)),
    );
    devices.sort_by(|a, b| (&a.device_type, a.minor).cmp(&(&b.device_type, b.minor)));
    Device {
        api_version: API_VERSION.to_owned(),
        kind: KIND.to_owned(),
        metadata: ObjectMeta {
            name: node_name.to_owned(),
            labels: gpu_labels(&inv.gpus),
        },
        spec: DeviceSpec { devices },
    }
}

/// The kernel names RDMA devices by the lowest free index, so a real
/// `mlx5_M` has a small M; a larger one (a device renamed by hand) is
/// numbered as other devices are, and the numbers never overflow.
const MAX_NUMBERED: u32 = 1 << 16;

/// The reported minor of each NIC of `nics` (see the module doc), in the same order.
pub fn rdma_minors(nics: &[RdmaNic]) -> Vec<u32> {
    let mut taken = BTreeSet::new();
    let mut minors: Vec<Option<u32>> = nics
        .iter()
        .map(|nic| mlx_minor(&nic.rdma.name).filter(|m| *m < MAX_NUMBERED && taken.insert(*m)))
        .collect();
    let unnumbered = minors.iter_mut().filter(|m| m.is_none());
    for (next, minor) in (taken.last().map_or(0, |m| m + 1)..).zip(unnumbered) {
        *minor = Some(next);
    }
    minors.into_iter().flatten().collect()
}

/// A byte count as a canonical binary-SI Kubernetes quantity (`80Gi`, `81559Mi`, `1000`).
pub fn binary_quantity(bytes: u64) -> String {
    let suffixes = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
    for (i, suffix) in suffixes.iter().enumerate() {
        let unit = 1u64 << (10 * (6 - i));
        if bytes != 0 && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

fn gpu_device(gpu: &Gpu) -> DeviceInfo {
    let mut resources = BTreeMap::from([
        ("koordinator.sh/gpu-core".to_owned(), "100".to_owned()),
        (
            "koordinator.sh/gpu-memory-ratio".to_owned(),
            "100".to_owned(),
        ),
    ]);
    if let Some(bytes) = gpu.memory_bytes {
        resources.insert(
            "koordinator.sh/gpu-memory".to_owned(),
            binary_quantity(bytes),
        );
    }
    DeviceInfo {
        device_type: "gpu".to_owned(),
        id: gpu.uuid.clone(),
        minor: clamp_minor(gpu.minor),
        health: gpu.health == Health::Healthy,
        resources,
        topology: topology(&gpu.topology, &gpu.bus_id.to_string()),
        vf_groups: Vec::new(),
    }
}

fn rdma_device(nic: &RdmaNic, minor: u32) -> DeviceInfo {
    // A VF without an RDMA device (bound to vfio-pci for DPDK, or to no
    // driver) cannot be granted as one: offered, the scheduler would pick
    // it and the pod's every container would fail.
    let mut vfs: Vec<VirtualFunction> = nic
        .vfs
        .iter()
        .filter(|vf| vf.rdma.is_some())
        .map(|vf| VirtualFunction {
            minor: -1,
            bus_id: vf.bus_id.to_string(),
        })
        .collect();
    vfs.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    let vf_groups = if vfs.is_empty() {
        Vec::new()
    } else {
        vec![VfGroup { vfs }]
    };
    DeviceInfo {
        device_type: "rdma".to_owned(),
        id: nic.bus_id.to_string(),
        minor: clamp_minor(minor),
        health: nic.health == Health::Healthy,
        resources: BTreeMap::from([("koordinator.sh/rdma".to_owned(), "100".to_owned())]),
        topology: topology(&nic.topology, &nic.bus_id.to_string()),
        vf_groups,
    }
}

fn topology(t: &Topology, bus_id: &str) -> DeviceTopology {
    DeviceTopology {
        socket_id: -1,
        node_id: t.numa_node.map_or(0, clamp_minor),
        pcie_id: t.pcie_root.clone(),
        bus_id: bus_id.to_owned(),
    }
}

/// The CRD's int32; no real minor or NUMA node comes near the limit.
fn clamp_minor(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// `gpu-vendor`, and `gpu-model` when all GPUs are one model: koordlet drops the `NVIDIA `
/// prefix and turns spaces into `-` (`H100-80GB-HBM3`).
fn gpu_labels(gpus: &[Gpu]) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let Some(first) = gpus.first() else {
        return labels;
    };
    labels.insert(GPU_VENDOR_LABEL.to_owned(), "nvidia".to_owned());
    if gpus.iter().all(|g| g.model == first.model) {
        let model = first.model.strip_prefix("NVIDIA ").unwrap_or(&first.model);
        let model = model.trim().replace(' ', "-");
        // A label value: at most 63 of [A-Za-z0-9._-] (Kubernetes validation).
        let valid = model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if valid && !model.is_empty() && model.len() <= 63 {
            labels.insert(GPU_MODEL_LABEL.to_owned(), model);
        }
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_quantities() {
        let table = [
            (85_899_345_920, "80Gi"),
            (85_520_809_984, "81559Mi"),
            (1024, "1Ki"),
            (1000, "1000"),
            (0, "0"),
            (1 << 40, "1Ti"),
        ];
        for (bytes, want) in table {
            assert_eq!(binary_quantity(bytes), want, "bytes {bytes}");
        }
    }
}
