//! GPU↔NIC pairs per pod and how they connect over PCIe, so that an operator can
//! see whether a joint GPU and RDMA allocation really was close (`PIX` best, `SYS`
//! worst, the legend of `nvidia-smi topo -m`).
use std::fmt::Write as _;

use serde::Serialize;

use crate::inventory::{relation, Inventory, PcieRelation, RdmaNic, Topology};
use crate::ledger::{DeviceId, LedgerState, PodRecord};

/// The pairs of one pod that holds GPUs and RDMA devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodPairs {
    /// `namespace/name`.
    pub pod: String,
    pub gpus: Vec<String>,
    pub nics: Vec<String>,
    /// Every GPU with every NIC, GPU-major.
    pub pairs: Vec<Pair>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pair {
    pub gpu: String,
    pub nic: String,
    /// `None` when either device is not in this node's inventory.
    pub relation: Option<PcieRelation>,
}

/// An end of a pair: its label and where it sits, when the inventory knows it.
struct End<'a> {
    label: String,
    topology: Option<&'a Topology>,
}

/// Pairs for every pod of the ledger that holds at least one GPU and one NIC.
pub fn pod_pairs(state: &LedgerState, inv: &Inventory) -> Vec<PodPairs> {
    state
        .pods
        .values()
        .filter_map(|p| one_pod(p, inv))
        .collect()
}

fn one_pod(pod: &PodRecord, inv: &Inventory) -> Option<PodPairs> {
    let mut gpus = Vec::new();
    let mut nics = Vec::new();
    for claim in &pod.claims {
        match &claim.device {
            DeviceId::Gpu(uuid) => gpus.push(gpu_end(uuid, inv)),
            DeviceId::Pf(addr) | DeviceId::Vf(addr) => {
                nics.push(nic_end(&claim.device, *addr, inv))
            }
        }
    }
    if gpus.is_empty() || nics.is_empty() {
        return None;
    }
    let pairs = gpus
        .iter()
        .flat_map(|g| nics.iter().map(move |n| (g, n)))
        .map(|(g, n)| Pair {
            gpu: g.label.clone(),
            nic: n.label.clone(),
            relation: g.topology.zip(n.topology).map(|(a, b)| relation(a, b)),
        })
        .collect();
    Some(PodPairs {
        pod: pod.pod.to_string(),
        gpus: gpus.into_iter().map(|g| g.label).collect(),
        nics: nics.into_iter().map(|n| n.label).collect(),
        pairs,
    })
}

fn gpu_end<'a>(uuid: &str, inv: &'a Inventory) -> End<'a> {
    let gpu = inv.gpus.iter().find(|g| g.uuid == uuid);
    End {
        label: match gpu {
            Some(g) => format!("{uuid} ({})", g.bus_id),
            None => uuid.to_string(),
        },
        topology: gpu.map(|g| &g.topology),
    }
}

/// A VF sits below its PF's PCIe port (SR-IOV routing IDs share the PF's bus), so
/// the PF's place stands for it.
fn nic_end<'a>(id: &DeviceId, addr: crate::inventory::PciAddr, inv: &'a Inventory) -> End<'a> {
    let found: Option<(&RdmaNic, Option<&str>)> = inv.rdma.iter().find_map(|nic| {
        if nic.bus_id == addr {
            return Some((nic, Some(nic.rdma.name.as_str())));
        }
        let vf = nic.vfs.iter().find(|vf| vf.bus_id == addr)?;
        Some((nic, vf.rdma.as_ref().map(|d| d.name.as_str())))
    });
    let label = match found {
        Some((_, Some(ibdev))) => format!("{ibdev} ({id})"),
        _ => id.to_string(),
    };
    End {
        label,
        topology: found.map(|(nic, _)| &nic.topology),
    }
}

/// One matrix per pod, GPUs down and NICs across, then the legend of both.
pub fn table(pods: &[PodPairs]) -> String {
    let mut out = String::new();
    if pods.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "GPU-NIC PCIE RELATION (PIX best, PXB, PHB, NODE, SYS worst)"
    );
    for p in pods {
        let _ = writeln!(out, "\nPOD {}", p.pod);
        let header = (0..p.nics.len()).map(|i| format!("NIC{i}"));
        let _ = writeln!(out, "{}", row("", header));
        // GPU-major: row g holds GPU g with every NIC.
        for (g, pairs) in p.pairs.chunks(p.nics.len().max(1)).enumerate() {
            let rels = pairs
                .iter()
                .map(|pair| pair.relation.map_or("?", PcieRelation::as_str).to_string());
            let _ = writeln!(out, "{}", row(&format!("GPU{g}"), rels));
        }
        for (g, gpu) in p.gpus.iter().enumerate() {
            let _ = writeln!(out, "GPU{g}: {gpu}");
        }
        for (n, nic) in p.nics.iter().enumerate() {
            let _ = writeln!(out, "NIC{n}: {nic}");
        }
    }
    out
}

/// A label and cells in columns of 7, without trailing blanks.
fn row(label: &str, cells: impl Iterator<Item = String>) -> String {
    let mut line = format!("{label:<6}");
    for cell in cells {
        let _ = write!(line, " {cell:<6}");
    }
    line.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::HostRootBuilder;
    use crate::ledger::{Claim, PodRecord, PodRef, Share};

    fn pod(name: &str, devices: Vec<DeviceId>) -> PodRecord {
        PodRecord {
            pod: PodRef {
                sandbox_id: format!("sb-{name}"),
                namespace: "ml".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            claims: devices
                .into_iter()
                .map(|device| Claim {
                    device,
                    share: Share::Exclusive,
                    pf: None,
                })
                .collect(),
            claimed_unix: 0,
            containers: Default::default(),
            network_owner: None,
            admitted: 0,
        }
    }

    #[test]
    fn relations_per_pod_and_the_matrix() {
        // Slot i holds GPU i and NIC i behind one switch; slots 0-3 are NUMA 0, 4-7 NUMA 1,
        // two slots per root complex.
        let inv = HostRootBuilder::hgx().expected().unwrap();
        let (g0, g4) = (&inv.gpus[0], &inv.gpus[4]);
        let vf = &inv.rdma[0].vfs[1];
        let pf5 = &inv.rdma[5];
        let mut state = LedgerState::default();
        let joint = pod(
            "train",
            vec![
                DeviceId::Gpu(g0.uuid.clone()),
                DeviceId::Gpu(g4.uuid.clone()),
                DeviceId::Vf(vf.bus_id),
                DeviceId::Pf(pf5.bus_id),
            ],
        );
        let gpu_only = pod("infer", vec![DeviceId::Gpu(inv.gpus[1].uuid.clone())]);
        let gone = pod(
            "stale",
            vec![DeviceId::Gpu("GPU-gone".into()), DeviceId::Pf(pf5.bus_id)],
        );
        for p in [joint, gpu_only, gone] {
            state.pods.insert(p.pod.sandbox_id.clone(), p);
        }
        let pods = pod_pairs(&state, &inv);
        assert_eq!(pods.len(), 2, "a pod without NICs has no pairs");
        let train = pods.iter().find(|p| p.pod == "ml/train").unwrap();
        let rels: Vec<Option<PcieRelation>> = train.pairs.iter().map(|p| p.relation).collect();
        use PcieRelation::*;
        assert_eq!(rels, [Some(Pix), Some(Sys), Some(Sys), Some(Phb)]);
        let vf_dev = &vf.rdma.as_ref().unwrap().name;
        assert_eq!(train.nics[0], format!("{vf_dev} (vf {})", vf.bus_id));
        assert_eq!(train.gpus[1], format!("{} ({})", g4.uuid, g4.bus_id));
        let stale = pods.iter().find(|p| p.pod == "ml/stale").unwrap();
        assert_eq!(stale.pairs[0].relation, None);

        let text = table(&pods);
        assert!(text.contains("\nPOD ml/train\n"), "{text}");
        assert!(
            text.contains("\n       NIC0   NIC1\nGPU0   PIX    SYS\n"),
            "{text}"
        );
        assert!(text.contains("\nGPU1   SYS    PHB\n"), "{text}");
        assert!(
            text.contains(&format!("\nNIC1: {} (pf {})\n", pf5.rdma.name, pf5.bus_id)),
            "{text}"
        );
        assert!(text.contains("\nGPU0   ?\n"), "{text}");
        let json = serde_json::to_value(train).unwrap();
        assert!(json["pairs"][0]["relation"].is_string(), "{json}");
        assert_eq!(table(&[]), "");
    }
}
