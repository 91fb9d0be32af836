//! RDMA NICs: physical functions with an RDMA device, and their SR-IOV virtual functions.

use std::collections::BTreeMap;

use super::error::InventoryError;
use super::model::{Health, PciAddr, RdmaDev, RdmaNic, RdmaPort, Vf};
use super::parse::{parse_decimal, parse_virtfn};
use super::pci::PciFunction;
use super::rdma::INFINIBAND_CLASS;
use super::Scan;

/// Healthy when every port is ACTIVE, the rule koordlet reports RDMA health by.
pub fn port_health(ports: &[RdmaPort]) -> Health {
    if ports.is_empty() {
        return Health::Unhealthy {
            reason: "no ports".to_owned(),
        };
    }
    match ports.iter().find(|p| p.state != "ACTIVE") {
        None => Health::Healthy,
        Some(p) => Health::Unhealthy {
            reason: format!("port {} is {}", p.num, p.state),
        },
    }
}

/// A software RDMA device (`rdma link add <name> type siw|rxe netdev <nic>`,
/// named by convention after its type). siw, and rxe on older kernels, give
/// it the netdev's parent as its own, so its `device` link points at the NIC's
/// PCI function: never the device to hand out for that function (Koordinator
/// reports only the NIC's own, `mlxN_M`). Told by name, as sysfs shows no
/// driver of an RDMA device.
fn is_soft_device(name: &str) -> bool {
    name.starts_with("siw") || name.starts_with("rxe")
}

impl Scan<'_> {
    /// Every PF with an RDMA device, in PCI order, with its VFs.
    pub(super) fn rdma_nics(&mut self) -> Vec<RdmaNic> {
        let names = self.fs.list_optional(INFINIBAND_CLASS);
        let names = self.ok(names).unwrap_or_default();
        if names.is_empty() {
            return Vec::new();
        }
        let mut chars = self.rdma_char_devs();
        let mut pfs = BTreeMap::new();
        let mut vfs = BTreeMap::new();
        let visible: Vec<Option<(RdmaDev, PciFunction)>> = names
            .iter()
            .map(|name| self.rdma_dev(name, &mut chars))
            .collect();
        // What is left belongs to devices the host no longer lists: moved
        // into a pod's netns (see `hidden_rdma_dev`).
        let mut hidden: Vec<(String, Vec<_>)> = chars
            .into_iter()
            .filter(|(ibdev, _)| !names.contains(ibdev))
            .collect();
        hidden.sort_by(|a, b| a.0.cmp(&b.0));
        let visible: Vec<(RdmaDev, PciFunction)> = visible
            .into_iter()
            .flatten()
            .filter(|(dev, _)| !is_soft_device(&dev.name))
            .collect();
        let mut taken: Vec<PciAddr> = visible.iter().map(|(_, f)| f.addr).collect();
        let mut found = visible;
        for (name, devs) in hidden {
            // One device per function.
            if let Some((dev, function)) = self.hidden_rdma_dev(name, devs) {
                if !taken.contains(&function.addr) && !is_soft_device(&dev.name) {
                    taken.push(function.addr);
                    found.push((dev, function));
                }
            }
        }
        // Two devices on one function: the first by name stays, as koordlet
        // sorts a function's devices and reports the first.
        found.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        for (dev, function) in found {
            // A VF has `physfn` (drivers/pci/iov.c); everything else counts as a PF.
            let is_vf = self.fs.exists_in(&function.dir, "physfn");
            let map = if is_vf { &mut vfs } else { &mut pfs };
            match map.entry(function.addr) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert((dev, function));
                }
                std::collections::btree_map::Entry::Occupied(kept) => {
                    self.warn(InventoryError::Device {
                        device: dev.name,
                        what: format!(
                            "shares its PCI function with RDMA device {}, which is kept",
                            kept.get().0.name
                        ),
                    });
                }
            }
        }
        let nics = pfs
            .into_values()
            .map(|(dev, function)| self.rdma_nic(dev, function, &mut vfs))
            .collect();
        for (addr, (dev, _)) in vfs {
            self.warn(InventoryError::Device {
                device: dev.name,
                what: format!("VF {addr} is not listed by any PF with an RDMA device"),
            });
        }
        nics
    }

    fn rdma_nic(
        &mut self,
        rdma: RdmaDev,
        function: PciFunction,
        vf_rdma: &mut BTreeMap<PciAddr, (RdmaDev, PciFunction)>,
    ) -> RdmaNic {
        let sriov_total_vfs = self.sriov_count(&function, "sriov_totalvfs");
        let vfs = self.vfs(&function, vf_rdma);
        // The VFs there are, by their `virtfnN` links: `sriov_numvfs` is read
        // under the PF's device lock (kernel commit 35ff867b7657, 5.19 and
        // stable), which a write of it holds while every VF is created and
        // probed, often tens of seconds on mlx5, and a creation must not wait.
        let sriov_num_vfs = u32::try_from(vfs.len()).unwrap_or(u32::MAX);
        RdmaNic {
            bus_id: function.addr,
            driver: self.driver(&function),
            health: port_health(&rdma.ports),
            netdevs: self.pf_netdevs(&function),
            topology: self.topology(&function),
            rdma,
            sriov_total_vfs,
            sriov_num_vfs,
            vfs,
        }
    }

    /// A missing SR-IOV attribute means a function without SR-IOV: zero.
    fn sriov_count(&mut self, function: &PciFunction, name: &str) -> u32 {
        let text = self.fs.read_in(&function.dir, name);
        let Some(text) = self.optional(text) else {
            return 0;
        };
        self.parsed(&function.dir.as_path().join(name), &text, parse_decimal)
            .unwrap_or(0)
    }

    /// The PF's `virtfnN` links, in N order.
    fn vfs(
        &mut self,
        pf: &PciFunction,
        vf_rdma: &mut BTreeMap<PciAddr, (RdmaDev, PciFunction)>,
    ) -> Vec<Vf> {
        let names = self.fs.list_in(&pf.dir, "");
        let names = self.ok(names).unwrap_or_default();
        let mut links: Vec<(u32, String)> = names
            .into_iter()
            .filter_map(|n| parse_virtfn(&n).map(|i| (i, n)))
            .collect();
        links.sort();
        let mut out = Vec::with_capacity(links.len());
        for (index, link) in links {
            let function = self.pci_function(&pf.dir.as_path().join(&link));
            let Some(function) = self.ok(function) else {
                continue;
            };
            let mut netdevs = self.netdevs(&function).into_iter();
            out.push(Vf {
                index,
                bus_id: function.addr,
                netdev: netdevs.next(),
                more_netdevs: netdevs.collect(),
                rdma: vf_rdma.remove(&function.addr).map(|(dev, _)| dev),
                driver: self.driver(&function),
            });
        }
        out
    }
}
