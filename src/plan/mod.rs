//! The plan: what one container gets, from the node's inventory, the pod's
//! allocation and the node config. It is the single source for the NRI adjustment
//! (devices, env, mounts), the OCI hook (network actions) and the ledger (claims).
//!
//! Everything in a plan comes from the inventory or the config: the pod only names
//! devices by minor, UUID or PCI address, and every name is resolved here or refused.
mod comm_env;
mod config_check;
mod error;
mod gid_cache;
mod gpu;
mod hami_lock;
mod rdma;

pub use comm_env::{env_inputs, GidSource, HostGids, NoGids};
pub use error::PlanError;
pub use gid_cache::GidCache;
pub use gpu::{gpu_node, CTL_NODE, UVM_NODES};
pub use hami_lock::{ensure_hami_lock_dir, HamiLockError};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::allocation::{PodDevices, DEVICE_ALLOCATED};
use crate::config::{Config, VfSettings};
use crate::inventory::{Inventory, PciAddr};
use crate::ledger::{Claim, DeviceId};

/// A device node to create in the container and allow in its device cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// Path inside the container (the same as on the host).
    pub path: String,
    #[serde(rename = "type")]
    pub kind: DeviceKind,
    pub major: u32,
    pub minor: u32,
    pub file_mode: u32,
}

impl DeviceNode {
    /// A character device node.
    pub fn char(path: impl Into<String>, major: u32, minor: u32, file_mode: u32) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            kind: DeviceKind::Char,
            major,
            minor,
            file_mode,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    /// A character device, `c` in OCI and NRI.
    #[serde(rename = "c")]
    Char,
}

/// A bind mount from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub source: String,
    pub destination: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub options: Vec<String>,
}

/// One VF netdev for the hook to configure and move into the pod's network namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkAction {
    pub pf: PciAddr,
    /// The PF's netdev, through which the VF settings are made.
    pub pf_netdev: Option<String>,
    /// N of the PF's `virtfnN`.
    pub vf_index: u32,
    pub vf_bus_id: PciAddr,
    /// The VF's host netdev; `None` when it has none (e.g. bound to vfio-pci).
    pub netdev: Option<String>,
    /// The VF's RDMA device (ibdev).
    pub rdma_device: Option<String>,
    /// Name inside the pod: prefix from config + 1, 2, ... in annotation order.
    pub container_ifname: String,
    pub settings: VfSettings,
    /// Move the RDMA device into the pod netns (`rdma.netns_mode = "exclusive"`).
    pub move_rdma: bool,
    /// With `move_rdma`: the RDMA device's char devices the container's nodes
    /// name, which the hook checks again after the move (the kernel registers
    /// them anew there, taking the lowest free minors).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma_chars: Vec<crate::netdev::settings::CharNum>,
}

/// What one container gets. Field names are stable: the hook and tooling read them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Plan {
    pub container: String,
    /// False when `devgate.io/containers` leaves this container out: it gets nothing,
    /// but `claims` still lists the pod's devices.
    pub selected: bool,
    pub devices: Vec<DeviceNode>,
    pub env: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    pub network: Vec<NetworkAction>,
    /// The pod's devices and shares, for the ledger; the same for every container.
    pub claims: Vec<Claim>,
    /// The annotation entry of each claim (`gpu[1]`, `rdma[0].vfs[2]`), in
    /// the same order, so that a refusal by the ledger can name it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claim_entries: Vec<String>,
    /// Device types in the annotation that devgate does not handle (`fpga` among them).
    pub ignored_types: Vec<String>,
    /// Things that do not stop the plan but that an operator should see.
    pub warnings: Vec<String>,
    /// Why something optional was left out where that is the expected case
    /// (a moved VF's GID index): shown by `devgate plan`, logged at debug.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Plan {
    /// True when nothing is to be done for the container.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
            && self.env.is_empty()
            && self.mounts.is_empty()
            && self.network.is_empty()
    }

    /// `"<entry>: "` for a device the plan claims, to put before a refusal's
    /// reason; empty for one it does not.
    pub fn entry_of(&self, device: &DeviceId) -> String {
        claim_entry(&self.claims, &self.claim_entries, device)
    }
}

/// [`Plan::entry_of`] over a plan's `claims` and `claim_entries`, wherever
/// they are kept.
pub fn claim_entry(claims: &[Claim], entries: &[String], device: &DeviceId) -> String {
    claims
        .iter()
        .zip(entries)
        .find(|(c, _)| &c.device == device)
        .map(|(_, e)| format!("{e}: "))
        .unwrap_or_default()
}

/// What a plan reads about the container beyond the pod's devices.
#[derive(Clone, Copy)]
pub struct ContainerContext<'a> {
    /// The container's env as the runtime has it (`NAME=value`, image and pod spec):
    /// a variable set there is never overridden by a derived one.
    pub env: &'a [String],
    /// GID tables of RoCE ports, read only for the ports the container gets.
    pub gids: &'a dyn GidSource,
    /// The pod's network namespace, as the runtime gives it.
    pub network: PodNetwork,
}

/// Whether a pod has a network namespace of its own. A whole PF's RDMA device
/// stays in the host's namespace, which the kernel in exclusive RDMA netns mode
/// keeps from every other (`rdma_dev_access_netns`,
/// drivers/infiniband/core/device.c).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PodNetwork {
    /// Not told (CDI specs; a sandbox the runtime reports without its
    /// namespaces).
    #[default]
    Unknown,
    /// The host's (`hostNetwork`): the runtime gave the pod no network namespace.
    Host,
    /// A namespace of its own.
    Own,
}

impl ContainerContext<'static> {
    /// No container env and no GID tables: `NCCL_IB_GID_INDEX` is not derived.
    pub const NONE: ContainerContext<'static> = ContainerContext {
        env: &[],
        gids: &NoGids,
        network: PodNetwork::Unknown,
    };
}

/// Builds the plan of `container` in a pod with `pod`'s devices.
///
/// Every entry is resolved and checked whether or not the container is selected, so
/// all containers of a pod see the same verdict on its devices; a selected
/// container's own env can refuse it alone (HAMi-core's GPU order,
/// `gpu::hami_order`). A pod without devices gives an empty plan.
pub fn build(
    inventory: &Inventory,
    pod: &PodDevices,
    container: &str,
    config: &Config,
) -> Result<Plan, PlanError> {
    build_for(inventory, pod, container, config, &ContainerContext::NONE)
}

/// [`build`] for a container whose env and GID tables are known.
pub fn build_for(
    inventory: &Inventory,
    pod: &PodDevices,
    container: &str,
    config: &Config,
    ctx: &ContainerContext,
) -> Result<Plan, PlanError> {
    config_check::check_config(config)?;
    let mut plan = Plan {
        container: container.to_string(),
        selected: pod.containers.selects(container),
        ignored_types: pod.allocation.ignored_types.clone(),
        ..Plan::default()
    };
    if !pod.allocation.fpga.is_empty() {
        plan.ignored_types.insert(0, "fpga".to_string());
    }
    if let Some(name) = pod
        .vf_settings
        .as_ref()
        .and_then(|s| config.vf.not_allowed(s))
    {
        return Err(PlanError::VfSettingNotAllowed {
            annotation: crate::allocation::VF_SETTINGS,
            entry: name.as_str().to_string(),
        });
    }
    let mut out = Builder {
        config,
        plan,
        comm: comm_env::Inputs::default(),
        pod_vf_settings: pod.vf_settings.as_ref(),
        move_rdma: rdma::moves_rdma(config, inventory),
        rdma_exclusive: inventory.rdma_netns_mode == Some(crate::config::RdmaNetnsMode::Exclusive),
        network: ctx.network,
    };
    gpu::plan_gpus(&mut out, inventory, pod)?;
    gpu::keep_own_preload(&mut out.plan, ctx.env);
    if out.plan.selected {
        gpu::hami_order(&mut out.plan, ctx.env)?;
    }
    rdma::plan_rdma(&mut out, inventory, &pod.allocation.rdma)?;
    if pod.vf_settings.is_some() && out.plan.network.is_empty() {
        out.plan.warnings.push(format!(
            "{}: the pod has no vf to apply them to",
            crate::allocation::VF_SETTINGS
        ));
    }
    // Only for a container given GPUs or RDMA devices: a template of literal
    // text alone would otherwise reach containers devgate gives nothing.
    if out.plan.selected && !(out.comm.gpus.is_empty() && out.comm.rdma.is_empty()) {
        comm_env::plan_comm_env(&mut out, ctx);
    }
    let mut plan = out.plan;
    if !plan.selected {
        plan.devices.clear();
        plan.env.clear();
        plan.mounts.clear();
        plan.network.clear();
    }
    Ok(plan)
}

/// The plan under construction, with the config it is built from.
struct Builder<'a> {
    config: &'a Config,
    plan: Plan,
    /// What the communication-library variables are made from.
    comm: comm_env::Inputs,
    /// The pod's own VF settings, already allowed by the config.
    pod_vf_settings: Option<&'a VfSettings>,
    /// Whether a VF's RDMA device goes into the pod netns ([`rdma::moves_rdma`]).
    move_rdma: bool,
    /// The kernel's RDMA netns mode is exclusive: a device is reachable only
    /// from the namespace it is in.
    rdma_exclusive: bool,
    network: PodNetwork,
}

impl Builder<'_> {
    fn claim(&mut self, entry: &str, claim: Claim) {
        self.plan.claims.push(claim);
        self.plan.claim_entries.push(entry.to_string());
    }

    fn device(&mut self, path: String, major: u32, minor: u32) {
        let mode = self.config.device_file_mode;
        self.plan
            .devices
            .push(DeviceNode::char(path, major, minor, mode));
    }
}

const ANN: &str = DEVICE_ALLOCATED;

/// Device and interface names from the inventory end up in paths; allow only plain
/// names, whatever sysfs held.
fn plain_name(entry: &str, name: &str, max: usize) -> Result<(), PlanError> {
    if crate::inventory::plain_name(name, max) {
        return Ok(());
    }
    Err(PlanError::UnsafeName {
        annotation: ANN,
        entry: entry.to_string(),
        name: name.chars().take(64).collect(),
    })
}

#[cfg(test)]
mod testinv;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_comm_env;
#[cfg(test)]
mod tests_comm_env_ports;
#[cfg(test)]
mod tests_errors;
#[cfg(test)]
mod tests_gid_fakes;
#[cfg(test)]
mod tests_hami;
#[cfg(test)]
mod tests_rdma;
