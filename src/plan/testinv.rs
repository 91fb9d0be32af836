//! An in-memory HGX-like inventory for the plan's tests: 8 GPUs, 4 mlx5 PFs with
//! 4 VFs each, and one irdma PF without VFs. mlx5 PFs 0 and 2 (and their VFs) are
//! InfiniBand, 1, 3 and the irdma PF RoCE; each device has one ACTIVE port 1.
//! GPUs 0-3 and PFs 0-1 are on NUMA node 0, the rest on node 1.
use crate::inventory::*;

pub fn uuid(minor: u32) -> String {
    format!("GPU-{minor:08x}-0000-4000-8000-{minor:012x}")
}

pub fn pf_bus(nic: u32) -> PciAddr {
    PciAddr {
        domain: 0,
        bus: 0x19 + 0x22 * nic as u8,
        device: 0,
        function: 0,
    }
}

pub fn vf_bus(nic: u32, vf: u32) -> PciAddr {
    PciAddr {
        function: 2 + vf as u8,
        ..pf_bus(nic)
    }
}

fn char_dev(kind: RdmaCharKind, n: u32, port: Option<u32>) -> RdmaCharDev {
    let (name, minor) = match kind {
        RdmaCharKind::Uverbs => (format!("uverbs{n}"), 192 + n),
        RdmaCharKind::Umad => (format!("umad{n}"), n),
        RdmaCharKind::Issm => (format!("issm{n}"), 64 + n),
    };
    RdmaCharDev {
        kind,
        name,
        port,
        dev: DevNum { major: 231, minor },
    }
}

fn rdma_dev(name: String, n: u32, link_layer: LinkLayer) -> RdmaDev {
    RdmaDev {
        name,
        node_guid: None,
        ports: vec![RdmaPort {
            num: 1,
            state: "ACTIVE".into(),
            link_layer,
            gids: vec![],
        }],
        char_devs: vec![
            char_dev(RdmaCharKind::Issm, n, Some(1)),
            char_dev(RdmaCharKind::Umad, n, Some(1)),
            char_dev(RdmaCharKind::Uverbs, n, None),
        ],
    }
}

fn nic(i: u32) -> RdmaNic {
    let layer = if i.is_multiple_of(2) {
        LinkLayer::InfiniBand
    } else {
        LinkLayer::Ethernet
    };
    let vfs = (0..4)
        .map(|j| {
            let n = 5 + i * 4 + j;
            Vf {
                index: j,
                bus_id: vf_bus(i, j),
                netdev: Some(format!("ens{i}f0v{j}")),
                more_netdevs: Vec::new(),
                rdma: Some(rdma_dev(format!("mlx5_{n}"), n, layer)),
                driver: Some("mlx5_core".into()),
            }
        })
        .collect();
    RdmaNic {
        bus_id: pf_bus(i),
        driver: Some("mlx5_core".into()),
        rdma: rdma_dev(format!("mlx5_{i}"), i, layer),
        netdevs: vec![format!("ens{i}f0")],
        topology: numa(u32::from(i >= 2)),
        sriov_total_vfs: 8,
        sriov_num_vfs: 4,
        vfs,
        health: Health::Healthy,
    }
}

fn numa(node: u32) -> Topology {
    Topology {
        numa_node: Some(node),
        ..Topology::default()
    }
}

/// The allocation annotation of one VF: VF `vf` of mlx5 PF 0, RDMA minor 0.
pub fn one_vf_allocation(vf: u32) -> String {
    format!(
        r#"{{"rdma":[{{"minor":0,"extension":{{"vfs":[{{"busID":"{}"}}]}}}}]}}"#,
        vf_bus(0, vf)
    )
}

pub fn hgx() -> Inventory {
    let gpus = (0..8)
        .map(|i| Gpu {
            index: i,
            minor: i,
            uuid: uuid(i),
            bus_id: PciAddr {
                domain: 0,
                bus: 0x18 + 0x10 * i as u8,
                device: 0,
                function: 0,
            },
            model: "H100".into(),
            memory_bytes: Some(80 << 30),
            topology: numa(u32::from(i >= 4)),
            health: Health::Healthy,
        })
        .collect();
    let mut rdma: Vec<RdmaNic> = (0..4).map(nic).collect();
    let mut irdma = nic(4);
    irdma.rdma = rdma_dev("rocep175s0f0".into(), 30, LinkLayer::Ethernet);
    irdma.vfs.clear();
    irdma.driver = Some("ice".into());
    rdma.push(irdma);
    Inventory {
        gpus,
        nvidia_majors: NvidiaMajors {
            nvidia: Some(195),
            nvidia_uvm: Some(509),
            nvidia_caps: Some(511),
        },
        rdma,
        rdma_cm: Some(DevNum {
            major: 10,
            minor: 58,
        }),
        rdma_netns_mode: None,
        warnings: vec![],
    }
}
