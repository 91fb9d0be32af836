//! PCIe placement: where a device sits, and how close two devices are in `nvidia-smi topo`
//! terms.
//!
//! `Topology.pci_path` lists the bridges from the root complex down to a device, as the
//! resolved sysfs path shows them: `pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/<dev>`
//! is root port 15:01.0, switch upstream port 16:00.0, switch downstream port 17:00.0. sysfs
//! does not say which bridge is which kind of port, so the PCIe layering is used: the first
//! bridge is a root port, then each switch adds an upstream port and a downstream port below
//! it (PCIe base spec, "Switch" as a set of virtual PCI-PCI bridges). A switch is therefore
//! named by the bridge at an odd position of the path, and the bridge after it (even position)
//! belongs to the same switch.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::model::{PciAddr, Topology};

/// How two PCI devices connect, nearest first (the legend of `nvidia-smi topo -m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PcieRelation {
    /// The path between them traverses at most a single PCIe bridge (one switch).
    Pix,
    /// The path traverses several bridges but not the host bridge.
    Pxb,
    /// The path traverses the PCIe host bridge: same root complex, different root ports.
    Phb,
    /// Different root complexes (host bridges) within one NUMA node.
    Node,
    /// Across the SMP interconnect between NUMA nodes (QPI/UPI/xGMI).
    Sys,
}

impl PcieRelation {
    pub fn as_str(self) -> &'static str {
        match self {
            PcieRelation::Pix => "PIX",
            PcieRelation::Pxb => "PXB",
            PcieRelation::Phb => "PHB",
            PcieRelation::Node => "NODE",
            PcieRelation::Sys => "SYS",
        }
    }
}

impl fmt::Display for PcieRelation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What identifies the switch (or root port) that owns the bridge at `index` of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Hop {
    RootPort(PciAddr),
    Switch(PciAddr),
}

fn hop(path: &[PciAddr], index: usize) -> Hop {
    match index {
        0 => Hop::RootPort(path[0]),
        // Odd: a switch upstream port; even: a downstream port of the switch just above.
        i if i % 2 == 1 => Hop::Switch(path[i]),
        i => Hop::Switch(path[i - 1]),
    }
}

/// The switch a device hangs off, named by its upstream port: the deepest odd position of
/// the bridge path. `None` for a device on a root port or on the root bus.
pub fn switch_of(pci_path: &[PciAddr]) -> Option<PciAddr> {
    let len = pci_path.len();
    if len < 2 {
        return None;
    }
    let last_odd = if len.is_multiple_of(2) {
        len - 1
    } else {
        len - 2
    };
    Some(pci_path[last_odd])
}

/// How `a` and `b` connect. NUMA nodes are compared as read: two unknown (`None`) nodes
/// count as the same node, as on a single-node host where sysfs says -1 everywhere.
pub fn relation(a: &Topology, b: &Topology) -> PcieRelation {
    if a.pcie_root.is_empty() || a.pcie_root != b.pcie_root {
        return if a.numa_node == b.numa_node {
            PcieRelation::Node
        } else {
            PcieRelation::Sys
        };
    }
    let common = a
        .pci_path
        .iter()
        .zip(&b.pci_path)
        .take_while(|(x, y)| x == y)
        .count();
    if common == 0 {
        return PcieRelation::Phb;
    }
    // The lowest common bridge and everything below it on either side is traversed.
    let lca = common - 1;
    let hops: BTreeSet<Hop> = (lca..a.pci_path.len())
        .map(|i| hop(&a.pci_path, i))
        .chain((lca..b.pci_path.len()).map(|i| hop(&b.pci_path, i)))
        .collect();
    if hops.len() <= 1 {
        PcieRelation::Pix
    } else {
        PcieRelation::Pxb
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> PciAddr {
        s.parse().expect("test address")
    }

    fn topo(numa: Option<u32>, root: &str, path: &[&str]) -> Topology {
        let pci_path: Vec<PciAddr> = path.iter().map(|p| addr(p)).collect();
        Topology {
            numa_node: numa,
            pcie_root: root.to_owned(),
            pcie_switch: switch_of(&pci_path),
            pci_path,
            ..Topology::default()
        }
    }

    #[test]
    fn relations() {
        let gpu0 = topo(Some(0), "pci0000:15", &["15:01.0", "16:00.0", "17:00.0"]);
        let nic0 = topo(Some(0), "pci0000:15", &["15:01.0", "16:00.0", "17:01.0"]);
        let nic0_f1 = topo(Some(0), "pci0000:15", &["15:01.0", "16:00.0", "17:01.0"]);
        let nic1 = topo(Some(0), "pci0000:15", &["15:03.0", "1a:00.0", "1b:01.0"]);
        let nested = topo(
            Some(0),
            "pci0000:15",
            &["15:01.0", "16:00.0", "17:02.0", "30:00.0", "31:00.0"],
        );
        let on_root_port = topo(Some(0), "pci0000:15", &["15:05.0"]);
        let on_root_port_f1 = topo(Some(0), "pci0000:15", &["15:05.0"]);
        let other_rc = topo(Some(0), "pci0000:37", &["37:01.0", "38:00.0", "39:00.0"]);
        let other_numa = topo(Some(1), "pci0000:97", &["97:01.0", "98:00.0", "99:00.0"]);
        let unknown_a = topo(None, "pci0000:00", &["00:01.0"]);
        let unknown_b = topo(None, "pci0000:40", &["40:01.0"]);
        let unresolved = topo(Some(0), "", &[]);
        let table = [
            (&gpu0, &nic0, PcieRelation::Pix),
            (&nic0, &nic0_f1, PcieRelation::Pix),
            (&on_root_port, &on_root_port_f1, PcieRelation::Pix),
            (&gpu0, &nested, PcieRelation::Pxb),
            (&gpu0, &on_root_port, PcieRelation::Phb),
            (&gpu0, &nic1, PcieRelation::Phb),
            (&gpu0, &other_rc, PcieRelation::Node),
            (&gpu0, &other_numa, PcieRelation::Sys),
            (&unknown_a, &unknown_b, PcieRelation::Node),
            (&unknown_a, &gpu0, PcieRelation::Sys),
            (&unresolved, &unresolved, PcieRelation::Node),
        ];
        for (a, b, want) in table {
            assert_eq!(relation(a, b), want, "{:?} vs {:?}", a.pci_path, b.pci_path);
            assert_eq!(
                relation(b, a),
                want,
                "symmetric: {:?} vs {:?}",
                b.pci_path,
                a.pci_path
            );
        }
    }

    #[test]
    fn switches() {
        let table: [(&[&str], Option<&str>); 5] = [
            (&[], None),
            (&["15:01.0"], None),
            (&["15:01.0", "16:00.0"], Some("16:00.0")),
            (&["15:01.0", "16:00.0", "17:00.0"], Some("16:00.0")),
            (
                &["15:01.0", "16:00.0", "17:00.0", "30:00.0", "31:00.0"],
                Some("30:00.0"),
            ),
        ];
        for (path, want) in table {
            let path: Vec<PciAddr> = path.iter().map(|p| addr(p)).collect();
            assert_eq!(switch_of(&path), want.map(addr), "{path:?}");
        }
    }

    #[test]
    fn display_and_order() {
        let all = [
            PcieRelation::Pix,
            PcieRelation::Pxb,
            PcieRelation::Phb,
            PcieRelation::Node,
            PcieRelation::Sys,
        ];
        let text: Vec<String> = all.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["PIX", "PXB", "PHB", "NODE", "SYS"]);
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        let json = serde_json::to_string(&PcieRelation::Node).expect("json");
        assert_eq!(json, "\"NODE\"");
    }
}
