//! Reading one PCI function: its resolved sysfs directory, driver, netdevs and topology.

use std::path::Path;

use super::error::InventoryError;
use super::hostfs::RealPath;
use super::model::{PciAddr, Topology};
use super::parse::{is_bridge_class, is_pcie_root, parse_class, parse_numa_node};
use super::topology::switch_of;
use super::Scan;

/// Where the kernel puts every PCI device: `sys/devices/pciDDDD:BB/<bridges>/<bdf>`.
const SYS_DEVICES: &str = "sys/devices";

/// One PCI function as found in sysfs.
#[derive(Debug, Clone)]
pub(crate) struct PciFunction {
    pub addr: PciAddr,
    pub dir: RealPath,
}

impl Scan<'_> {
    /// Resolves a link or path to a PCI function directory, whose name must be its BDF.
    pub(super) fn pci_function(&mut self, rel: &Path) -> Result<PciFunction, InventoryError> {
        let dir = self.fs.resolve(rel)?;
        let name = dir.name().unwrap_or_default();
        let addr = name
            .parse()
            .map_err(|_| InventoryError::malformed(dir.as_path(), name))?;
        Ok(PciFunction { addr, dir })
    }

    /// The bound driver: the basename of the `driver` link; `None` when unbound.
    pub(super) fn driver(&mut self, f: &PciFunction) -> Option<String> {
        let link = self.fs.link_name_in(&f.dir, "driver");
        self.optional(link)
    }

    /// Netdev names of the function (`net/*`), sorted.
    pub(super) fn netdevs(&mut self, f: &PciFunction) -> Vec<String> {
        let list = self.fs.list_in(&f.dir, "net");
        self.optional(list).unwrap_or_default()
    }

    /// A PF's netdev names, its own first: in switchdev mode the PF's `net/`
    /// also holds a representor per VF and SF, which may sort before it
    /// (`enp59s0f0_0` before `enp59s0f0np0`), and asked for VF settings a
    /// representor has none. A representor's `phys_port_name` names its
    /// function (`pf0vf3`, `c1pf0sf2`, `pf0`; devlink's port names, see
    /// `__devlink_port_phys_port_name_get`); the uplink's is `p0` or none.
    pub(super) fn pf_netdevs(&mut self, f: &PciFunction) -> Vec<String> {
        let mut names = self.netdevs(f);
        if names.len() > 1 {
            // Unreadable (EOPNOTSUPP for a driver without ports): not a representor.
            let representor = |s: &mut Self, name: &str| {
                s.fs.read_in(&f.dir, format!("net/{name}/phys_port_name"))
                    .is_ok_and(|port| is_representor_port(port.trim()))
            };
            let mut keyed: Vec<(bool, String)> = names
                .drain(..)
                .map(|n| (representor(self, &n), n))
                .collect();
            keyed.sort_by_key(|(rep, _)| *rep);
            names = keyed.into_iter().map(|(_, n)| n).collect();
        }
        names
    }

    /// The PCI class code, if readable.
    pub(super) fn class(&mut self, dir: &RealPath) -> Option<u32> {
        let text = self.fs.read_in(dir, "class");
        let text = self.ok(text)?;
        self.parsed(&dir.as_path().join("class"), &text, parse_class)
    }

    /// NUMA node, root complex, switch and bridge path, from the resolved directory.
    pub(super) fn topology(&mut self, f: &PciFunction) -> Topology {
        let numa_node = self.numa_node(&f.dir);
        let Ok(rel) = f.dir.as_path().strip_prefix(SYS_DEVICES) else {
            self.warn(InventoryError::Device {
                device: f.addr.to_string(),
                what: format!(
                    "resolves outside {SYS_DEVICES}: {}",
                    f.dir.as_path().display()
                ),
            });
            return Topology {
                numa_node,
                ..Topology::default()
            };
        };
        // The first root bus on the path, as koordlet takes it: the path's
        // first component on most hosts, below a platform or VMBus device on
        // device-tree and Hyper-V ones (`.../VMBUS:01/<guid>/pci0001:00/...`).
        let pcie_root = rel
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .find(|c| is_pcie_root(c));
        if pcie_root.is_none() {
            self.warn(InventoryError::Device {
                device: f.addr.to_string(),
                what: format!(
                    "no PCI root bus (pciDDDD:BB) on its sysfs path {}: its PCIe placement is unknown",
                    rel.display()
                ),
            });
        }
        let pcie_root = pcie_root.unwrap_or_default().to_owned();
        let pci_path = self.bridges(f);
        Topology {
            numa_node,
            pcie_root,
            pcie_switch: switch_of(&pci_path),
            pci_path,
            sysfs_path: rel.to_path_buf(),
        }
    }

    /// The bridges above `f`: ancestors named like a BDF whose class is 0x0604xx. An ancestor
    /// whose class cannot be read still counts: only a bridge has PCI functions below it.
    fn bridges(&mut self, f: &PciFunction) -> Vec<PciAddr> {
        let mut out = Vec::new();
        let mut dir = f.dir.parent();
        while let Some(d) = dir {
            if let Some(addr) = d.name().and_then(|n| n.parse::<PciAddr>().ok()) {
                if self.class(&d).is_none_or(is_bridge_class) {
                    out.push(addr);
                }
            }
            dir = d.parent();
        }
        out.reverse();
        out
    }

    fn numa_node(&mut self, dir: &RealPath) -> Option<u32> {
        // Absent without CONFIG_NUMA (drivers/pci/pci-sysfs.c): not worth a warning.
        let text = self.fs.read_in(dir, "numa_node");
        let text = self.optional(text)?;
        match parse_numa_node(&text) {
            Some(node) => node,
            None => {
                self.warn(InventoryError::malformed(
                    dir.as_path().join("numa_node"),
                    &text,
                ));
                None
            }
        }
    }
}

/// A devlink port name of a representor: of a VF (`pf0vf3`, `c1pf0vf3`), an
/// SF (`pf0sf2`) or a host PF seen from a DPU's own side (`pf0`, `c1pf0`);
/// anything but a physical port's (`p0`, or `p0s1` split) or none.
fn is_representor_port(port: &str) -> bool {
    let physical = port.strip_prefix('p').is_some_and(|rest| {
        let (port, split) = rest.split_once('s').unwrap_or((rest, "0"));
        [port, split]
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    !port.is_empty() && !physical
}

#[cfg(test)]
mod tests {
    #[test]
    fn representor_ports() {
        for (port, representor) in [
            ("p0", false),
            ("p1s1", false),
            ("", false),
            ("pf0vf3", true),
            ("c1pf0vf3", true),
            ("pf0sf2", true),
            ("pf0", true),
            ("c1pf0", true),
            ("p", true),
            ("p0s", true),
        ] {
            assert_eq!(super::is_representor_port(port), representor, "{port:?}");
        }
    }
}
