//! Discovery of fixture hosts, checked against the fixture's plan and against hand-written
//! values from the layout documented in `crate::fixture`.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;
use crate::fixture::{Fixture, HostRootBuilder};

pub(super) fn build(b: HostRootBuilder) -> (tempfile::TempDir, Fixture) {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = b.build(dir.path()).expect("fixture");
    (dir, fixture)
}

fn addr(s: &str) -> PciAddr {
    s.parse().expect("test address")
}

fn dev(major: u32, minor: u32) -> DevNum {
    DevNum { major, minor }
}

/// One HGX fixture for every check: writing one takes a while on a slow disk.
#[test]
fn hgx_fixture_is_discovered_exactly() {
    let (_dir, fixture) = build(HostRootBuilder::hgx());
    let inv = discover(fixture.root());
    assert_eq!(inv.warnings, Vec::<String>::new());
    assert_eq!(&inv, fixture.expected());
    assert_eq!(
        &discover_without_openat2(fixture.root()),
        fixture.expected()
    );
    check_hgx_gpus(&inv);
    check_hgx_rdma(&inv);
    check_hgx_affinity(&inv);
    check_hgx_gids(fixture.root());
    check_numvfs_unread(fixture.root(), fixture.expected());
}

/// `sriov_numvfs` is never read (its read waits for a write that creates
/// VFs): the count comes from the `virtfnN` links, whatever the file says.
fn check_numvfs_unread(root: &Path, expected: &Inventory) {
    let numvfs = root.join("sys/bus/pci/devices/0000:19:00.0/sriov_numvfs");
    std::fs::write(&numvfs, "not a number\n").expect("write");
    let inv = discover(root);
    assert_eq!(inv.warnings, Vec::<String>::new());
    assert_eq!(&inv, expected);
}

/// GID tables are read per port on demand: a RoCE port has RoCE v1 and v2 entries,
/// an IB port one entry; bad names read nothing.
fn check_hgx_gids(root: &Path) {
    let table = |ibdev: &str, port: u32| {
        let t = PortGids::open(root, ibdev, port)?;
        let slots = t.indices().iter().copied();
        Some(
            slots
                .map(|i| (i, t.gid_type(i), t.gid(i)))
                .collect::<Vec<_>>(),
        )
    };
    let roce = table("mlx5_1", 1).expect("mlx5_1 port 1");
    let types: Vec<(u32, Option<&str>)> = roce.iter().map(|g| (g.0, g.1.as_deref())).collect();
    assert_eq!(types, [(0, Some("IB/RoCE v1")), (1, Some("RoCE v2"))]);
    assert!(roce
        .iter()
        .all(|g| g.2.as_deref().is_some_and(|v| v.starts_with("fe80:"))));
    let ib = table("mlx5_0", 1).expect("mlx5_0 port 1");
    assert_eq!(ib.len(), 1);
    assert_eq!(ib[0].1.as_deref(), Some("IB/RoCE v1"));
    assert!(table("../mlx5_0", 1).is_none());
    assert!(table("mlx5_0", 9).is_none());
}

fn check_hgx_gpus(inv: &Inventory) {
    let bdfs: Vec<String> = inv.gpus.iter().map(|g| g.bus_id.to_string()).collect();
    let want = [
        "0000:18:00.0",
        "0000:1c:00.0",
        "0000:3a:00.0",
        "0000:3e:00.0",
        "0000:98:00.0",
        "0000:9c:00.0",
        "0000:ba:00.0",
        "0000:be:00.0",
    ];
    assert_eq!(bdfs, want);
    let minors: Vec<u32> = inv.gpus.iter().map(|g| g.minor).collect();
    assert_eq!(minors, [2, 3, 0, 1, 6, 7, 4, 5]);
    let indices: Vec<u32> = inv.gpus.iter().map(|g| g.index).collect();
    assert_eq!(indices, [0, 1, 2, 3, 4, 5, 6, 7]);
    let gpu0 = &inv.gpus[0];
    assert!(
        gpu0.uuid.starts_with("GPU-") && gpu0.uuid.len() == 40,
        "{}",
        gpu0.uuid
    );
    assert_eq!(gpu0.model, "NVIDIA H100 80GB HBM3");
    assert_eq!(gpu0.topology.numa_node, Some(0));
    assert_eq!(gpu0.topology.pcie_root, "pci0000:15");
    assert_eq!(gpu0.topology.pcie_switch, Some(addr("0000:16:00.0")));
    assert_eq!(
        gpu0.topology.pci_path,
        ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0"].map(addr)
    );
    assert_eq!(inv.gpus[4].topology.numa_node, Some(1));
    assert_eq!(inv.gpus[4].topology.pcie_root, "pci0000:95");

    let majors = inv.nvidia_majors;
    assert_eq!(
        (majors.nvidia, majors.nvidia_uvm, majors.nvidia_caps),
        (Some(195), Some(508), Some(511))
    );
    assert_eq!(inv.rdma_cm, Some(dev(10, 58)));
}

fn check_hgx_rdma(inv: &Inventory) {
    let names: Vec<&str> = inv.rdma.iter().map(|n| n.rdma.name.as_str()).collect();
    let want = [
        "mlx5_0",
        "mlx5_1",
        "mlx5_2",
        "mlx5_3",
        "mlx5_4",
        "mlx5_5",
        "mlx5_6",
        "mlx5_7",
        "rocep218s0f0",
        "rocep218s0f1",
    ];
    assert_eq!(names, want);

    let nic0 = &inv.rdma[0];
    assert_eq!(nic0.bus_id, addr("0000:19:00.0"));
    assert_eq!(nic0.driver.as_deref(), Some("mlx5_core"));
    assert_eq!(nic0.netdevs, ["ibp25s0"]);
    assert_eq!(nic0.rdma.ports[0].link_layer, LinkLayer::InfiniBand);
    assert_eq!(nic0.rdma.ports[0].state, "ACTIVE");
    assert_eq!((nic0.sriov_total_vfs, nic0.sriov_num_vfs), (8, 4));
    assert_eq!(inv.rdma[1].rdma.ports[0].link_layer, LinkLayer::Ethernet);
    assert_eq!(inv.rdma[1].netdevs, ["enp29s0np0"]);
    let chars: Vec<(&str, Option<u32>, DevNum)> = nic0
        .rdma
        .char_devs
        .iter()
        .map(|c| (c.name.as_str(), c.port, c.dev))
        .collect();
    assert_eq!(
        chars,
        [
            ("uverbs0", None, dev(231, 192)),
            ("umad0", Some(1), dev(231, 0)),
            ("issm0", Some(1), dev(231, 64))
        ]
    );

    let vf0 = &nic0.vfs[0];
    assert_eq!((vf0.index, vf0.bus_id), (0, addr("0000:19:00.1")));
    assert_eq!(vf0.netdev.as_deref(), Some("ibp25s0v0"));
    assert_eq!(vf0.driver.as_deref(), Some("mlx5_core"));
    let vf0_rdma = vf0.rdma.as_ref().expect("vf rdma");
    assert_eq!(vf0_rdma.name, "mlx5_8");
    assert_eq!(vf0_rdma.char_devs[0].dev, dev(231, 202));

    // The last VF's uverbs is past the 32 fixed minors: dynamic major.
    let last = inv.rdma[7]
        .vfs
        .last()
        .and_then(|v| v.rdma.as_ref())
        .expect("last vf rdma");
    assert_eq!(last.name, "mlx5_39");
    assert_eq!(
        (last.char_devs[0].name.as_str(), last.char_devs[0].dev),
        ("uverbs41", dev(510, 9))
    );
    assert_eq!(inv.rdma[1].vfs[3].netdev.as_deref(), Some("enp29s0v3"));

    let e810 = &inv.rdma[8];
    assert_eq!(
        (e810.bus_id, e810.driver.as_deref()),
        (addr("0000:da:00.0"), Some("ice"))
    );
    assert_eq!(e810.topology.pcie_switch, None);
    assert_eq!(e810.topology.numa_node, Some(1));
    let vfs: Vec<(String, Option<&str>, Option<&str>, bool)> = e810
        .vfs
        .iter()
        .map(|v| {
            (
                v.bus_id.to_string(),
                v.netdev.as_deref(),
                v.driver.as_deref(),
                v.rdma.is_some(),
            )
        })
        .collect();
    assert_eq!(
        vfs,
        [
            (
                "0000:da:01.0".to_owned(),
                Some("enp218s0f0v0"),
                Some("iavf"),
                false
            ),
            ("0000:da:01.1".to_owned(), None, Some("vfio-pci"), false),
        ]
    );
    assert_eq!(e810.health, Health::Healthy);
    let down = Health::Unhealthy {
        reason: "port 1 is DOWN".to_owned(),
    };
    assert_eq!(inv.rdma[9].health, down);
}

fn check_hgx_affinity(inv: &Inventory) {
    let gpu0 = &inv.gpus[0].topology;
    let rel = |nic: usize| relation(gpu0, &inv.rdma[nic].topology);
    let got = [rel(0), rel(1), rel(2), rel(4), rel(8)];
    use PcieRelation::*;
    assert_eq!(got, [Pix, Phb, Node, Sys, Sys]);
    assert_eq!(relation(&inv.gpus[4].topology, &inv.rdma[8].topology), Node);
    assert_eq!(relation(&inv.gpus[0].topology, &inv.gpus[1].topology), Phb);
    let minors = device_cr::rdma_minors(&inv.rdma);
    assert_eq!(minors, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    // Renamed by hand past any index the kernel gives: numbered after the
    // rest, without overflowing.
    let mut renamed = inv.rdma.clone();
    renamed[0].rdma.name = format!("mlx5_{}", u32::MAX);
    renamed[1].rdma.name = "mlx5_65536".into();
    let minors = device_cr::rdma_minors(&renamed);
    assert_eq!(minors, [8, 9, 2, 3, 4, 5, 6, 7, 10, 11]);
}

#[test]
fn knobs_change_what_is_discovered() {
    let b = HostRootBuilder::hgx()
        .gpus(4)
        .nics(2)
        .vfs_per_pf(2)
        .intel_rdma(false)
        .gpu_minors(vec![3, 2, 1, 0])
        .nvidia_major(1)
        .hostname("node-a")
        .vf_netdev_prefix("t7");
    let (_dir, fixture) = build(b);
    let inv = discover(fixture.root());
    assert_eq!(inv.warnings, Vec::<String>::new());
    assert_eq!(&inv, fixture.expected());
    assert_eq!(inv.nvidia_majors.nvidia, Some(1));
    assert_eq!(
        inv.gpus.iter().map(|g| g.minor).collect::<Vec<_>>(),
        [3, 2, 1, 0]
    );
    assert_eq!(fixture.vf_netdevs(), ["t70v0", "t70v1", "t71v0", "t71v1"]);
    assert_eq!(inv.rdma.len(), 2);
    assert_eq!(host_name(fixture.root()).expect("hostname"), "node-a");
    // Four slots on two root complexes, one per NUMA node.
    let roots: Vec<&str> = inv
        .gpus
        .iter()
        .map(|g| g.topology.pcie_root.as_str())
        .collect();
    assert_eq!(
        roots,
        ["pci0000:15", "pci0000:15", "pci0000:95", "pci0000:95"]
    );
}

#[test]
fn small_and_empty_hosts() {
    for (gpus, nics) in [(0, 0), (1, 0), (3, 5)] {
        let b = HostRootBuilder::hgx()
            .gpus(gpus)
            .nics(nics)
            .intel_rdma(nics % 2 == 1);
        let (_dir, fixture) = build(b);
        let inv = discover(fixture.root());
        assert_eq!(
            inv.warnings,
            Vec::<String>::new(),
            "{gpus} gpus, {nics} nics"
        );
        assert_eq!(&inv, fixture.expected(), "{gpus} gpus, {nics} nics");
    }
    let empty = tempfile::tempdir().expect("tempdir");
    assert_eq!(discover(empty.path()), Inventory::default());
}

/// NVSwitches bind to `nvidia` too (class 0x0680) but are no GPUs and have no procfs entry.
#[test]
fn nvswitches_are_skipped_silently() {
    let (dir, fixture) = build(HostRootBuilder::hgx().gpus(1).nics(0).intel_rdma(false));
    let switch = dir.path().join("sys/devices/pci0000:15/0000:15:05.0");
    fs::create_dir_all(&switch).expect("mkdir");
    fs::write(switch.join("class"), "0x068000\n").expect("write");
    let link = dir.path().join("sys/bus/pci/drivers/nvidia/0000:15:05.0");
    symlink("../../../../devices/pci0000:15/0000:15:05.0", link).expect("symlink");
    let inv = discover(fixture.root());
    assert_eq!(inv.warnings, Vec::<String>::new());
    assert_eq!(&inv, fixture.expected());
}

#[test]
fn bad_knobs_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = [
        HostRootBuilder::hgx().gpus(9),
        HostRootBuilder::hgx().vfs_per_pf(17),
        HostRootBuilder::hgx().gpu_minors(vec![0, 1]),
        HostRootBuilder::hgx().gpus(2).gpu_minors(vec![1, 1]),
        HostRootBuilder::hgx().gpus(1).gpu_minors(vec![255]),
        HostRootBuilder::hgx().vf_netdev_names(|_, _| "same".to_owned()),
        HostRootBuilder::hgx().vf_netdev_prefix("much-too-long-name"),
    ];
    for b in bad {
        assert!(b.build(dir.path()).is_err(), "{b:?}");
    }
}

/// Rewrites every symlink of the tree with an absolute target (as a copied or hand-made tree
/// may have): discovery must resolve them inside the root and find the same devices.
#[test]
fn absolute_symlinks_resolve_inside_the_root() {
    let (dir, fixture) = build(HostRootBuilder::hgx().gpus(2).nics(2));
    absolutize(dir.path(), dir.path()).expect("absolutize");
    for inv in [
        discover(fixture.root()),
        discover_without_openat2(fixture.root()),
    ] {
        assert_eq!(inv.warnings, Vec::<String>::new());
        assert_eq!(&inv, fixture.expected());
    }
}

pub(super) fn absolutize(root: &Path, dir: &Path) -> std::io::Result<()> {
    let entries: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    for entry in entries {
        let path = entry.path();
        let meta = fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&path)?;
            let parent = path.parent().unwrap_or(root);
            let resolved = lexical_join(parent, &target);
            let inside = resolved.strip_prefix(root).map_err(std::io::Error::other)?;
            fs::remove_file(&path)?;
            symlink(Path::new("/").join(inside), &path)?;
        } else if meta.is_dir() {
            absolutize(root, &path)?;
        }
    }
    Ok(())
}

fn lexical_join(base: &Path, rel: &Path) -> std::path::PathBuf {
    let mut out = base.to_path_buf();
    for c in rel.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[path = "discover_rdma_tests.rs"]
mod rdma_devices;

#[path = "discover_netdev_tests.rs"]
mod netdevs;
