//! RDMA devices (`sys/class/infiniband`) of any vendor, their ports and char devices.

use std::collections::HashMap;
use std::path::Path;

use super::error::InventoryError;
use super::hostfs::RealPath;
use super::model::{DevNum, LinkLayer, RdmaCharDev, RdmaCharKind, RdmaDev, RdmaPort};
use super::parse::{
    parse_decimal, parse_dev_num, parse_link_layer, parse_port_state, parse_rdma_char_name,
};
use super::pci::PciFunction;
use super::Scan;
use crate::config::RdmaNetnsMode;

pub(super) const INFINIBAND_CLASS: &str = "sys/class/infiniband";
/// uverbs: one node per device (drivers/infiniband/core/uverbs_main.c).
const VERBS_CLASS: &str = "sys/class/infiniband_verbs";
/// umad and issm: one node each per port (drivers/infiniband/core/user_mad.c).
const MAD_CLASS: &str = "sys/class/infiniband_mad";
/// `rdma_cm` is a misc device with a dynamic minor (drivers/infiniband/core/ucma.c).
const RDMA_CM_DEV: &str = "sys/class/misc/rdma_cm/dev";
/// ib_core's `netns_mode` parameter, which `rdma system set netns` also
/// changes (`rdma_compatdev_set`, drivers/infiniband/core/device.c).
pub const NETNS_MODE_PARAM: &str = "sys/module/ib_core/parameters/netns_mode";

/// Char devices in a stable order: uverbs, then umad and issm by port.
fn sort_char_devs(devs: &mut [RdmaCharDev]) {
    devs.sort_by(|a, b| (a.kind, a.port, &a.name).cmp(&(b.kind, b.port, &b.name)));
}

/// The state given to the ports of a device in another network namespace.
pub const HIDDEN_PORT_STATE: &str = "IN_OTHER_NETNS";

/// Char devices by the name of the RDMA device they belong to.
pub(super) type CharDevIndex = HashMap<String, Vec<RdmaCharDev>>;

impl Scan<'_> {
    /// Reads every uverbs, umad and issm class entry once.
    pub(super) fn rdma_char_devs(&mut self) -> CharDevIndex {
        let mut index = CharDevIndex::new();
        for class in [VERBS_CLASS, MAD_CLASS] {
            let names = self.fs.list_optional(class);
            let names = self.ok(names).unwrap_or_default();
            if names.is_empty() {
                self.warn(InventoryError::Device {
                    device: class.to_owned(),
                    what: "no char devices although RDMA devices exist".to_owned(),
                });
            }
            for name in names {
                let Some((kind, _)) = parse_rdma_char_name(&name) else {
                    continue; // `abi_version`
                };
                let rel = Path::new(class).join(&name);
                if let Some((ibdev, dev)) = self.rdma_char_dev(&rel, kind, name) {
                    index.entry(ibdev).or_default().push(dev);
                }
            }
        }
        index
    }

    fn rdma_char_dev(
        &mut self,
        rel: &Path,
        kind: RdmaCharKind,
        name: String,
    ) -> Option<(String, RdmaCharDev)> {
        let ibdev = self.fs.read(rel.join("ibdev"));
        let ibdev = self.ok(ibdev)?.trim().to_owned();
        let dev = self.dev_num(&rel.join("dev"))?;
        let port = match kind {
            RdmaCharKind::Uverbs => None,
            RdmaCharKind::Umad | RdmaCharKind::Issm => Some(self.decimal(&rel.join("port"))?),
        };
        Some((
            ibdev,
            RdmaCharDev {
                kind,
                name,
                port,
                dev,
            },
        ))
    }

    /// `/dev/infiniband/rdma_cm`, worth a warning only when RDMA devices exist.
    pub(super) fn rdma_cm(&mut self, have_rdma: bool) -> Option<DevNum> {
        let text = self.fs.read(RDMA_CM_DEV);
        let text = if have_rdma {
            self.ok(text)?
        } else {
            self.optional(text)?
        };
        self.parsed(Path::new(RDMA_CM_DEV), &text, parse_dev_num)
    }

    /// The kernel's RDMA netns mode; `None` where ib_core is not loaded.
    pub(super) fn netns_mode(&mut self) -> Option<RdmaNetnsMode> {
        let text = self.fs.read(NETNS_MODE_PARAM);
        let text = self.optional(text)?;
        self.parsed(Path::new(NETNS_MODE_PARAM), &text, parse_netns_mode)
    }

    /// One RDMA device and the PCI function its `device` link points to.
    pub(super) fn rdma_dev(
        &mut self,
        name: &str,
        chars: &mut CharDevIndex,
    ) -> Option<(RdmaDev, PciFunction)> {
        let rel = Path::new(INFINIBAND_CLASS).join(name);
        let dir = self.fs.resolve(&rel);
        let dir = self.ok(dir)?;
        // Soft devices (rxe, siw) on a virtual netdev have no PCI parent:
        // nothing to allocate. On a NIC's netdev they may have the NIC's
        // (see `nic::is_soft_device`).
        if !self.fs.exists_in(&dir, "device") {
            return None;
        }
        let function = self.pci_function(&dir.as_path().join("device"));
        let function = self.ok(function)?;
        let node_guid = self.fs.read_in(&dir, "node_guid");
        let node_guid = self.optional(node_guid).map(|g| g.trim().to_owned());
        let mut char_devs = chars.remove(name).unwrap_or_default();
        sort_char_devs(&mut char_devs);
        let dev = RdmaDev {
            name: name.to_owned(),
            node_guid,
            ports: self.rdma_ports(&dir),
            char_devs,
        };
        Some((dev, function))
    }

    /// An RDMA device in another network namespace, from its char devices. In
    /// exclusive mode (`rdma system set netns exclusive`) a device moved into a
    /// pod leaves the host's `class/infiniband`, which is netns-tagged
    /// (drivers/infiniband/core/device.c `ib_class`), while its uverbs and umad
    /// class devices, which are not, stay with a `device` link to its PCI
    /// function. Its ports' state and link layer cannot be read from here;
    /// its port numbers come from its umad nodes, else port 1.
    pub(super) fn hidden_rdma_dev(
        &mut self,
        name: String,
        mut char_devs: Vec<RdmaCharDev>,
    ) -> Option<(RdmaDev, PciFunction)> {
        sort_char_devs(&mut char_devs);
        let first = char_devs.first()?;
        let class = match first.kind {
            RdmaCharKind::Uverbs => VERBS_CLASS,
            RdmaCharKind::Umad | RdmaCharKind::Issm => MAD_CLASS,
        };
        let link = Path::new(class).join(&first.name).join("device");
        // Soft devices on a virtual netdev have no PCI parent: nothing to
        // allocate, no warning.
        let function = self.pci_function(&link).ok()?;
        let mut nums: Vec<u32> = char_devs.iter().filter_map(|c| c.port).collect();
        nums.sort_unstable();
        nums.dedup();
        if nums.is_empty() {
            // Only umad and issm nodes name ports, and a node without `ib_umad`
            // (RoCE-only nodes often lack it) has none. What moves into a pod
            // is a VF, which has one port, 1: so the pod's further containers
            // are given the same NCCL_IB_HCA and UCX_NET_DEVICES as its first.
            nums.push(1);
        }
        let ports = nums
            .into_iter()
            .map(|num| RdmaPort {
                num,
                state: HIDDEN_PORT_STATE.to_owned(),
                link_layer: LinkLayer::Unknown,
                gids: Vec::new(),
            })
            .collect();
        let dev = RdmaDev {
            name,
            node_guid: None,
            ports,
            char_devs,
        };
        Some((dev, function))
    }

    fn rdma_ports(&mut self, dir: &RealPath) -> Vec<RdmaPort> {
        let names = self.fs.list_in(dir, "ports");
        let names = self.ok(names).unwrap_or_default();
        let mut nums: Vec<u32> = names.iter().filter_map(|n| parse_decimal(n)).collect();
        nums.sort_unstable();
        nums.into_iter()
            .filter_map(|num| self.rdma_port(dir, num))
            .collect()
    }

    /// Port `num` of the device at `dir`. Its files are read by path: each open resolves
    /// inside the root anyway, so `ports/<num>` itself need not be resolved first.
    fn rdma_port(&mut self, dir: &RealPath, num: u32) -> Option<RdmaPort> {
        let port = dir.as_path().join(format!("ports/{num}"));
        let state = self.fs.read(port.join("state"));
        let state_text = self.ok(state)?;
        let Some(state) = parse_port_state(&state_text) else {
            self.warn(InventoryError::malformed(port.join("state"), &state_text));
            return None;
        };
        let link_layer = self.fs.read(port.join("link_layer"));
        let link_layer = parse_link_layer(&self.ok(link_layer).unwrap_or_default());
        Some(RdmaPort {
            num,
            state,
            link_layer,
            // Not read here: a RoCE port's GID table has 128 to 256 entries (most of
            // them empty), thousands of reads per discovery on a node with many VFs.
            // `inventory::PortGids` reads one port's table when it is needed.
            gids: Vec::new(),
        })
    }

    fn dev_num(&mut self, path: &Path) -> Option<DevNum> {
        let text = self.fs.read(path);
        let text = self.ok(text)?;
        self.parsed(path, &text, parse_dev_num)
    }

    fn decimal(&mut self, path: &Path) -> Option<u32> {
        let text = self.fs.read(path);
        let text = self.ok(text)?;
        self.parsed(path, &text, parse_decimal)
    }
}

/// ib_core's `netns_mode` parameter: a bool, `Y` for shared (the kernel's
/// default, `ib_devices_shared_netns`) and `N` for exclusive.
pub fn parse_netns_mode(text: &str) -> Option<RdmaNetnsMode> {
    match text.trim() {
        "Y" | "1" => Some(RdmaNetnsMode::Shared),
        "N" | "0" => Some(RdmaNetnsMode::Exclusive),
        _ => None,
    }
}
