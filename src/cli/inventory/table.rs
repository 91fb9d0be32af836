//! The human-readable tables of `devgate inventory -o table`.

use std::fmt::Write;

use crate::config::RdmaNetnsMode;
use crate::inventory::view::{health_words, link_layer_name};
use crate::inventory::{relation, Health, Inventory, RdmaCharKind, RdmaDev, Topology};

/// GPUs, RDMA NICs, their VFs, and the GPU/NIC affinity matrix (`nvidia-smi topo` terms).
pub(super) fn render(inv: &Inventory) -> String {
    let mut out = String::new();
    let m = inv.nvidia_majors;
    let _ = writeln!(
        out,
        "GPUs (nvidia {}, nvidia-uvm {}, nvidia-caps {})",
        opt(m.nvidia),
        opt(m.nvidia_uvm),
        opt(m.nvidia_caps)
    );
    out.push_str(&gpu_table(inv));
    let mode = inv.rdma_netns_mode.map(RdmaNetnsMode::as_str);
    let _ = writeln!(
        out,
        "\nRDMA NICs (rdma_cm {}, netns mode {})",
        opt(inv.rdma_cm),
        opt(mode)
    );
    out.push_str(&nic_table(inv));
    if inv.rdma.iter().any(|n| !n.vfs.is_empty()) {
        out.push_str("\nVFs\n");
        out.push_str(&vf_table(inv));
    }
    if !inv.gpus.is_empty() && !inv.rdma.is_empty() {
        out.push_str("\nGPU/NIC affinity (PIX < PXB < PHB < NODE < SYS)\n");
        out.push_str(&affinity_table(inv));
    }
    out
}

fn gpu_table(inv: &Inventory) -> String {
    let head = [
        "INDEX",
        "MINOR",
        "UUID",
        "BUS ID",
        "NUMA",
        "PCIE ROOT",
        "SWITCH",
        "MODEL",
        "HEALTH",
    ];
    let rows = inv.gpus.iter().map(|g| {
        let mut row = vec![
            g.index.to_string(),
            g.minor.to_string(),
            g.uuid.clone(),
            g.bus_id.to_string(),
        ];
        row.extend(placement(&g.topology));
        row.push(g.model.clone());
        row.push(health(&g.health));
        row
    });
    table(&head, rows.collect())
}

fn nic_table(inv: &Inventory) -> String {
    let head = [
        "NAME",
        "BUS ID",
        "DRIVER",
        "NETDEV",
        "NUMA",
        "PCIE ROOT",
        "SWITCH",
        "PORTS",
        "UVERBS",
        "VFS",
        "HEALTH",
    ];
    let rows = inv.rdma.iter().map(|n| {
        let mut row = vec![
            n.rdma.name.clone(),
            n.bus_id.to_string(),
            n.driver.clone().unwrap_or_else(|| "-".to_owned()),
            if n.netdevs.is_empty() {
                "-".to_owned()
            } else {
                n.netdevs.join(",")
            },
        ];
        row.extend(placement(&n.topology));
        row.push(ports(&n.rdma));
        row.push(uverbs(&n.rdma));
        row.push(format!("{}/{}", n.sriov_num_vfs, n.sriov_total_vfs));
        row.push(health(&n.health));
        row
    });
    table(&head, rows.collect())
}

fn vf_table(inv: &Inventory) -> String {
    let head = ["PF", "VF", "BUS ID", "DRIVER", "NETDEV", "RDMA", "UVERBS"];
    let mut rows = Vec::new();
    for nic in &inv.rdma {
        for vf in &nic.vfs {
            rows.push(vec![
                nic.rdma.name.clone(),
                vf.index.to_string(),
                vf.bus_id.to_string(),
                vf.driver.clone().unwrap_or_else(|| "-".to_owned()),
                vf.netdev.clone().unwrap_or_else(|| "-".to_owned()),
                vf.rdma.as_ref().map_or("-".to_owned(), |r| r.name.clone()),
                vf.rdma.as_ref().map_or("-".to_owned(), uverbs),
            ]);
        }
    }
    table(&head, rows)
}

fn affinity_table(inv: &Inventory) -> String {
    let mut head = vec![String::new()];
    head.extend(inv.rdma.iter().map(|n| n.rdma.name.clone()));
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    let rows = inv.gpus.iter().map(|g| {
        let mut row = vec![format!("GPU{}", g.index)];
        row.extend(
            inv.rdma
                .iter()
                .map(|n| relation(&g.topology, &n.topology).to_string()),
        );
        row
    });
    table(&head, rows.collect())
}

/// NUMA, root complex and switch columns.
fn placement(t: &Topology) -> [String; 3] {
    [
        opt(t.numa_node),
        if t.pcie_root.is_empty() {
            "-".to_owned()
        } else {
            t.pcie_root.clone()
        },
        opt(t.pcie_switch),
    ]
}

fn ports(dev: &RdmaDev) -> String {
    let ports: Vec<String> = dev
        .ports
        .iter()
        .map(|p| format!("{}:{}:{}", p.num, link_layer_name(p.link_layer), p.state))
        .collect();
    if ports.is_empty() {
        "-".to_owned()
    } else {
        ports.join(",")
    }
}

fn uverbs(dev: &RdmaDev) -> String {
    let found = dev
        .char_devs
        .iter()
        .find(|c| c.kind == RdmaCharKind::Uverbs);
    found.map_or("-".to_owned(), |c| format!("{} {}", c.name, c.dev))
}

fn health(h: &Health) -> String {
    match health_words(h) {
        (word, Some(reason)) => format!("{word} ({reason})"),
        (word, None) => word,
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("-".to_owned(), |v| v.to_string())
}

/// Left-aligned columns two spaces apart; no trailing blanks.
fn table(head: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let head = head.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(head).chain(rows) {
        let mut line = String::new();
        for (cell, w) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:<w$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
