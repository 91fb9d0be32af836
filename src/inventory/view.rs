//! The JSON view of an inventory, printed by `devgate inventory -o json`.
//!
//! This is a contract for scripts, separate from the internal model: fields are only ever
//! added, never renamed or removed, and `version` changes if that promise is broken.
//!
//! ```text
//! {
//!   "version": 1,
//!   "nvidia_majors": {"nvidia": 195, "nvidia_uvm": 508, "nvidia_caps": 511},  // null if absent
//!   "rdma_cm": "10:58",                                    // null if absent
//!   "rdma_netns_mode": "shared",      // the kernel's, or "exclusive"; null without RDMA devices or ib_core
//!   "gpus": [{
//!     "index": 0, "minor": 2, "uuid": "GPU-...", "bus_id": "0000:18:00.0",
//!     "device": "195:2",                                   // /dev/nvidiaN; null without a major
//!     "numa_node": 0, "pcie_root": "pci0000:15", "pcie_switch": "0000:16:00.0",
//!     "model": "NVIDIA H100 80GB HBM3", "memory_bytes": null,
//!     "health": "healthy", "health_reason": null,
//!     "rdma_affinity": {"mlx5_0": "PIX", "mlx5_1": "PHB", ...}   // PIX|PXB|PHB|NODE|SYS
//!   }],
//!   "rdma": [{
//!     "name": "mlx5_0", "bus_id": "0000:19:00.0", "driver": "mlx5_core",
//!     "netdev": "ibp25s0", "netdevs": ["ibp25s0"], "node_guid": "...",
//!     "numa_node": 0, "pcie_root": "pci0000:15", "pcie_switch": "0000:16:00.0",
//!     "link_layer": "InfiniBand",                          // of the first port
//!     "health": "healthy", "health_reason": null,
//!     "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand"}],
//!     "char_devices": [{"name": "uverbs0", "path": "/dev/infiniband/uverbs0",
//!                       "dev": "231:192", "port": null}, ...],
//!     "sriov_total_vfs": 8, "sriov_num_vfs": 4,
//!     "vfs": [{"index": 0, "bus_id": "0000:19:00.1", "netdev": "ibp25s0v0",
//!              "rdma": "mlx5_8", "driver": "mlx5_core", "char_devices": [...]}]
//!   }]
//! }
//! ```
//!
//! Warnings are never part of the view: the CLI prints them to stderr.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::{Gpu, Health, Inventory, LinkLayer, NvidiaMajors, RdmaDev, RdmaNic, Vf};
use super::topology::{relation, PcieRelation};

/// Version of this view's shape.
pub const VIEW_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryView {
    pub version: u32,
    pub nvidia_majors: NvidiaMajors,
    pub rdma_cm: Option<String>,
    /// The kernel's RDMA netns mode (ib_core's `netns_mode`).
    #[serde(default)]
    pub rdma_netns_mode: Option<crate::config::RdmaNetnsMode>,
    pub gpus: Vec<GpuView>,
    pub rdma: Vec<RdmaView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub minor: u32,
    pub uuid: String,
    pub bus_id: String,
    pub device: Option<String>,
    pub numa_node: Option<u32>,
    pub pcie_root: String,
    pub pcie_switch: Option<String>,
    pub model: String,
    pub memory_bytes: Option<u64>,
    pub health: String,
    pub health_reason: Option<String>,
    pub rdma_affinity: BTreeMap<String, PcieRelation>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaView {
    pub name: String,
    pub bus_id: String,
    pub driver: Option<String>,
    pub netdev: Option<String>,
    pub netdevs: Vec<String>,
    pub node_guid: Option<String>,
    pub numa_node: Option<u32>,
    pub pcie_root: String,
    pub pcie_switch: Option<String>,
    pub link_layer: String,
    pub health: String,
    pub health_reason: Option<String>,
    pub ports: Vec<PortView>,
    pub char_devices: Vec<CharDevView>,
    pub sriov_total_vfs: u32,
    pub sriov_num_vfs: u32,
    pub vfs: Vec<VfView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortView {
    pub port: u32,
    pub state: String,
    pub link_layer: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CharDevView {
    pub name: String,
    pub path: String,
    /// `major:minor`, as read from sysfs.
    pub dev: String,
    pub port: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VfView {
    pub index: u32,
    pub bus_id: String,
    pub netdev: Option<String>,
    /// A function's netdevs after `netdev`, present only when it has more
    /// than one (which the plan refuses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_netdevs: Vec<String>,
    pub rdma: Option<String>,
    pub driver: Option<String>,
    pub char_devices: Vec<CharDevView>,
}

impl InventoryView {
    pub fn new(inv: &Inventory) -> Self {
        InventoryView {
            version: VIEW_VERSION,
            nvidia_majors: inv.nvidia_majors,
            rdma_cm: inv.rdma_cm.map(|d| d.to_string()),
            rdma_netns_mode: inv.rdma_netns_mode,
            gpus: inv.gpus.iter().map(|g| gpu_view(g, inv)).collect(),
            rdma: inv.rdma.iter().map(rdma_view).collect(),
        }
    }
}

/// `"healthy"` or `"unhealthy"`, and the reason.
pub fn health_words(health: &Health) -> (String, Option<String>) {
    match health {
        Health::Healthy => ("healthy".to_owned(), None),
        Health::Unhealthy { reason } => ("unhealthy".to_owned(), Some(reason.clone())),
    }
}

/// The link layer's sysfs spelling.
pub fn link_layer_name(layer: LinkLayer) -> &'static str {
    match layer {
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet",
        LinkLayer::Unknown => "Unknown",
    }
}

fn gpu_view(gpu: &Gpu, inv: &Inventory) -> GpuView {
    let (health, health_reason) = health_words(&gpu.health);
    let rdma_affinity = inv
        .rdma
        .iter()
        .map(|nic| {
            (
                nic.rdma.name.clone(),
                relation(&gpu.topology, &nic.topology),
            )
        })
        .collect();
    GpuView {
        index: gpu.index,
        minor: gpu.minor,
        uuid: gpu.uuid.clone(),
        bus_id: gpu.bus_id.to_string(),
        device: inv
            .nvidia_majors
            .nvidia
            .map(|m| format!("{m}:{}", gpu.minor)),
        numa_node: gpu.topology.numa_node,
        pcie_root: gpu.topology.pcie_root.clone(),
        pcie_switch: gpu.topology.pcie_switch.map(|s| s.to_string()),
        model: gpu.model.clone(),
        memory_bytes: gpu.memory_bytes,
        health,
        health_reason,
        rdma_affinity,
    }
}

fn rdma_view(nic: &RdmaNic) -> RdmaView {
    let (health, health_reason) = health_words(&nic.health);
    let link_layer = nic
        .rdma
        .ports
        .first()
        .map_or(LinkLayer::Unknown, |p| p.link_layer);
    RdmaView {
        name: nic.rdma.name.clone(),
        bus_id: nic.bus_id.to_string(),
        driver: nic.driver.clone(),
        netdev: nic.netdevs.first().cloned(),
        netdevs: nic.netdevs.clone(),
        node_guid: nic.rdma.node_guid.clone(),
        numa_node: nic.topology.numa_node,
        pcie_root: nic.topology.pcie_root.clone(),
        pcie_switch: nic.topology.pcie_switch.map(|s| s.to_string()),
        link_layer: link_layer_name(link_layer).to_owned(),
        health,
        health_reason,
        ports: nic
            .rdma
            .ports
            .iter()
            .map(|p| PortView {
                port: p.num,
                state: p.state.clone(),
                link_layer: link_layer_name(p.link_layer).to_owned(),
            })
            .collect(),
        char_devices: char_dev_views(&nic.rdma),
        sriov_total_vfs: nic.sriov_total_vfs,
        sriov_num_vfs: nic.sriov_num_vfs,
        vfs: nic.vfs.iter().map(vf_view).collect(),
    }
}

fn vf_view(vf: &Vf) -> VfView {
    VfView {
        index: vf.index,
        bus_id: vf.bus_id.to_string(),
        netdev: vf.netdev.clone(),
        more_netdevs: vf.more_netdevs.clone(),
        rdma: vf.rdma.as_ref().map(|r| r.name.clone()),
        driver: vf.driver.clone(),
        char_devices: vf.rdma.as_ref().map(char_dev_views).unwrap_or_default(),
    }
}

fn char_dev_views(dev: &RdmaDev) -> Vec<CharDevView> {
    dev.char_devs
        .iter()
        .map(|c| CharDevView {
            path: format!("/dev/infiniband/{}", c.name),
            name: c.name.clone(),
            dev: c.dev.to_string(),
            port: c.port,
        })
        .collect()
}
