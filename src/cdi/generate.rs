//! Specs from the inventory. Each CDI device is what devgate's planner grants a
//! container allocated that one device, so a CDI user gets the same nodes,
//! numbers and access as a pod through the NRI plugin; a device the planner
//! refuses (no uverbs node, an odd name) is left out with a warning.
use std::collections::BTreeSet;

use crate::allocation::{
    Allocation, GpuEntry, GpuResources, PodDevices, RdmaEntry, VfRef, FULL_SHARE,
};
use crate::config::Config;
use crate::inventory::device_cr::rdma_minors;
use crate::inventory::Inventory;
use crate::plan::{self, DeviceKind};

use super::{validate, CdiError, Class, ContainerEdits, Device, DeviceNode, Spec, MAX_DEVICES};

/// One spec per kind that has devices, and what was left out.
#[derive(Debug, Default)]
pub struct Generated {
    pub specs: Vec<(Class, Spec)>,
    pub warnings: Vec<String>,
}

/// The container name the planner is asked about; every container of a pod
/// without `devgate.io/containers` gets the same devices.
const CONTAINER: &str = "cdi";

/// Specs for `classes` at `cdi_version`; a class without devices gives none.
pub fn generate(
    inv: &Inventory,
    config: &Config,
    classes: &[Class],
    cdi_version: &str,
) -> Result<Generated, CdiError> {
    if !super::WRITABLE_VERSIONS.contains(&cdi_version) {
        return Err(CdiError::Version {
            version: cdi_version.to_string(),
        });
    }
    let mut out = Generated::default();
    for &class in classes {
        let candidates = match class {
            Class::Gpu => gpu_candidates(inv),
            Class::Rdma => rdma_candidates(inv),
        };
        let mut planned: Vec<(Vec<String>, Vec<DeviceNode>)> = Vec::new();
        for (names, alloc) in candidates.into_iter().take(MAX_DEVICES) {
            let pod = PodDevices {
                allocation: alloc,
                ..PodDevices::default()
            };
            match plan::build(inv, &pod, CONTAINER, config) {
                Ok(p) => planned.push((names, p.devices.iter().map(node).collect())),
                Err(e) => out.warnings.push(format!("{}: left out: {e}", names[0])),
            }
        }
        if planned.is_empty() {
            continue;
        }
        let spec = build_spec(class, cdi_version, planned);
        validate(&spec)?;
        out.specs.push((class, spec));
    }
    Ok(out)
}

/// Nodes every device of the kind gets (`nvidiactl`, `rdma_cm`) become
/// spec-wide edits, applied once when any device of the spec is requested; the
/// rest stay per device. With one device nothing tells them apart, and it keeps
/// all its nodes.
fn build_spec(
    class: Class,
    cdi_version: &str,
    planned: Vec<(Vec<String>, Vec<DeviceNode>)>,
) -> Spec {
    let mut common: Vec<DeviceNode> = match planned.as_slice() {
        [first, _, ..] => first.1.clone(),
        _ => Vec::new(),
    };
    common.retain(|n| planned.iter().all(|(_, nodes)| nodes.contains(n)));
    let mut seen = BTreeSet::new();
    let mut devices = Vec::new();
    for (names, nodes) in planned {
        let own: Vec<DeviceNode> = nodes.into_iter().filter(|n| !common.contains(n)).collect();
        // A device whose nodes are all shared still needs non-empty edits.
        let device_nodes = if own.is_empty() { common.clone() } else { own };
        for name in names {
            if !seen.insert(name.clone()) {
                continue;
            }
            devices.push(Device {
                name,
                annotations: Default::default(),
                container_edits: ContainerEdits {
                    env: Vec::new(),
                    device_nodes: device_nodes.clone(),
                },
            });
        }
    }
    Spec {
        cdi_version: cdi_version.to_string(),
        kind: class.kind(),
        annotations: Default::default(),
        devices,
        container_edits: ContainerEdits {
            env: Vec::new(),
            device_nodes: common,
        },
    }
}

/// Each GPU by UUID and by minor, as the annotation names them.
fn gpu_candidates(inv: &Inventory) -> Vec<(Vec<String>, Allocation)> {
    inv.gpus
        .iter()
        .map(|g| {
            let alloc = Allocation {
                gpus: vec![GpuEntry {
                    minor: g.minor,
                    uuid: Some(g.uuid.clone()),
                    resources: GpuResources::default(),
                }],
                ..Allocation::default()
            };
            (vec![g.uuid.clone(), g.minor.to_string()], alloc)
        })
        .collect()
}

/// Each RDMA PF used whole, and each of its VFs, by PCI address.
fn rdma_candidates(inv: &Inventory) -> Vec<(Vec<String>, Allocation)> {
    let minors = rdma_minors(&inv.rdma);
    let mut out = Vec::new();
    for (nic, &minor) in inv.rdma.iter().zip(&minors) {
        let entry = |vfs: Vec<VfRef>| Allocation {
            rdma: vec![RdmaEntry {
                minor,
                pf: Some(nic.bus_id),
                share_percent: FULL_SHARE,
                vfs,
            }],
            ..Allocation::default()
        };
        out.push((vec![nic.bus_id.to_string()], entry(Vec::new())));
        for vf in &nic.vfs {
            let vfs = vec![VfRef {
                bus_id: vf.bus_id,
                minor: None,
            }];
            out.push((vec![vf.bus_id.to_string()], entry(vfs)));
        }
    }
    out
}

/// A planned node as a spec gives it.
pub fn node(d: &plan::DeviceNode) -> DeviceNode {
    DeviceNode {
        path: d.path.clone(),
        host_path: None,
        kind: match d.kind {
            DeviceKind::Char => "c".to_string(),
        },
        major: i64::from(d.major),
        minor: i64::from(d.minor),
        file_mode: d.file_mode,
        // What the NRI path grants: linux.devices become `rw` rules (NRI
        // `LinuxDevice.AccessString` for char devices).
        permissions: "rw".to_string(),
    }
}
