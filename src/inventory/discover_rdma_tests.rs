//! Discovery of RDMA devices that are not where the host's class directory
//! shows them: moved into a pod's netns, soft devices on a NIC's netdev, two
//! devices on one function.
use std::fs;
use std::path::Path;

use super::*;
use crate::config::RdmaNetnsMode;

/// The inventory of `root`, with no warning, and the RDMA device of the first
/// NIC's VF `bus_id`.
fn discover_vf_rdma(root: &Path, bus_id: crate::inventory::PciAddr) -> (Inventory, RdmaDev) {
    let inv = discover(root);
    assert_eq!(inv.warnings, Vec::<String>::new());
    let found = inv.rdma[0]
        .vfs
        .iter()
        .find(|v| v.bus_id == bus_id)
        .and_then(|v| v.rdma.clone())
        .expect("the vf keeps its rdma device");
    (inv, found)
}

/// A VF's RDMA device moved into a pod in exclusive netns mode: gone from the
/// host's `class/infiniband` (netns-tagged), its uverbs and umad class devices
/// still there. The VF keeps its device, char devices and port numbers, the
/// ports' state unknown from here.
#[test]
fn an_rdma_device_in_another_netns_is_found_through_its_char_devices() {
    let (_dir, fixture) = build(HostRootBuilder::hgx());
    let expected = fixture.expected().clone();
    let vf = expected.rdma[0]
        .vfs
        .iter()
        .find(|v| v.rdma.is_some())
        .expect("a vf with an rdma device")
        .clone();
    let dev = vf.rdma.clone().unwrap();
    let root = fixture.root();
    let class_link = root.join("sys/class/infiniband").join(&dev.name);
    let ibdir = fs::canonicalize(&class_link).unwrap();
    fs::remove_file(&class_link).unwrap();
    fs::remove_dir_all(&ibdir).unwrap();

    let (inv, found) = discover_vf_rdma(root, vf.bus_id);
    assert_eq!(found.name, dev.name);
    assert_eq!(found.char_devs, dev.char_devs);
    let ports: Vec<(u32, &str)> = found
        .ports
        .iter()
        .map(|p| (p.num, p.state.as_str()))
        .collect();
    let want: Vec<(u32, &str)> = dev
        .ports
        .iter()
        .map(|p| (p.num, rdma::HIDDEN_PORT_STATE))
        .collect();
    assert_eq!(ports, want);
    // Everything else is as it was.
    let mut rest = inv.clone();
    let mut was = expected;
    for i in [&mut rest, &mut was] {
        for v in i.rdma.iter_mut().flat_map(|n| n.vfs.iter_mut()) {
            if v.bus_id == vf.bus_id {
                v.rdma = None;
            }
        }
    }
    assert_eq!(rest, was);

    // Without `ib_umad` no node names its ports: a VF's one port, 1.
    for c in dev
        .char_devs
        .iter()
        .filter(|c| c.kind != crate::inventory::RdmaCharKind::Uverbs)
    {
        fs::remove_file(root.join("sys/class/infiniband_mad").join(&c.name)).unwrap();
    }
    let (_, found) = discover_vf_rdma(root, vf.bus_id);
    let ports: Vec<(u32, &str)> = found
        .ports
        .iter()
        .map(|p| (p.num, p.state.as_str()))
        .collect();
    assert_eq!(ports, [(1, rdma::HIDDEN_PORT_STATE)]);
}

/// `rdma link add siw0 type siw netdev <the NIC's>` (and rxe on older
/// kernels): the soft device's `device` link is the NIC's PCI function. The
/// NIC keeps its own device, and nothing warns.
#[test]
fn a_soft_rdma_device_on_a_nics_netdev_does_not_take_its_function() {
    let (_dir, fixture) = build(HostRootBuilder::hgx());
    let root = fixture.root();
    let nic = &fixture.expected().rdma[0];
    let pci = pci_dir_of(root, &nic.rdma.name);
    for soft in ["siw0", "rxe_ens1f0"] {
        add_rdma_dev(root, &pci, soft);
    }
    let inv = discover(root);
    assert_eq!(inv.warnings, Vec::<String>::new());
    assert_eq!(&inv.rdma, &fixture.expected().rdma);
}

/// The PCI function directory the RDMA device `name` sits on
/// (`<pci>/infiniband/<name>`), symlinks resolved.
fn pci_dir_of(root: &Path, name: &str) -> std::path::PathBuf {
    let own = fs::canonicalize(root.join("sys/class/infiniband").join(name)).unwrap();
    own.parent().unwrap().parent().unwrap().to_path_buf()
}

/// An RDMA device `name` on the PCI function at `pci`, as sysfs shows one.
fn add_rdma_dev(root: &Path, pci: &Path, name: &str) {
    let dir = pci.join("infiniband").join(name);
    fs::create_dir_all(dir.join("ports/1")).unwrap();
    fs::write(dir.join("ports/1/state"), "4: ACTIVE\n").unwrap();
    fs::write(dir.join("ports/1/link_layer"), "Ethernet\n").unwrap();
    fs::write(dir.join("node_type"), "1: CA\n").unwrap();
    // Relative, as sysfs writes them.
    std::os::unix::fs::symlink("../..", dir.join("device")).unwrap();
    let canonical_root = fs::canonicalize(root).unwrap();
    let target = Path::new("../../..").join(dir.strip_prefix(&canonical_root).unwrap());
    std::os::unix::fs::symlink(target, root.join("sys/class/infiniband").join(name)).unwrap();
}

/// A second RDMA device on a NIC's PCI function, one no soft-device name
/// gives away: the first by name stays the function's, as koordlet reports
/// it, so the scheduler's minors keep meaning the same devices; the other is
/// named in a warning.
#[test]
fn of_two_rdma_devices_on_one_function_the_first_by_name_is_kept() {
    let (_dir, fixture) = build(HostRootBuilder::hgx());
    let root = fixture.root();
    let nic = &fixture.expected().rdma[0];
    let pci = pci_dir_of(root, &nic.rdma.name);
    add_rdma_dev(root, &pci, "roce_a");
    let inv = discover(root);
    assert_eq!(&inv.rdma, &fixture.expected().rdma);
    assert_eq!(inv.warnings.len(), 1, "{:?}", inv.warnings);
    let want = format!(
        "shares its PCI function with RDMA device {}, which is kept",
        nic.rdma.name
    );
    assert!(
        inv.warnings[0].contains("roce_a") && inv.warnings[0].contains(&want),
        "{:?}",
        inv.warnings
    );
}

/// ib_core's `netns_mode` parameter gives the kernel's mode (`Y` shared, `N`
/// exclusive); absent (ib_core not loaded), none; anything else is a warning.
#[test]
fn the_kernels_rdma_netns_mode_is_read_from_ib_core() {
    let (_dir, fixture) = build(HostRootBuilder::hgx());
    let root = fixture.root();
    let param = root.join(crate::inventory::NETNS_MODE_PARAM);
    assert_eq!(discover(root).rdma_netns_mode, None);
    fs::create_dir_all(param.parent().unwrap()).unwrap();
    for (text, want) in [
        ("Y\n", Some(RdmaNetnsMode::Shared)),
        ("N\n", Some(RdmaNetnsMode::Exclusive)),
        ("1", Some(RdmaNetnsMode::Shared)),
        ("0", Some(RdmaNetnsMode::Exclusive)),
    ] {
        fs::write(&param, text).unwrap();
        let inv = discover(root);
        assert_eq!(inv.rdma_netns_mode, want, "{text:?}");
        assert_eq!(inv.warnings, Vec::<String>::new());
    }
    fs::write(&param, "maybe\n").unwrap();
    let inv = discover(root);
    assert_eq!(inv.rdma_netns_mode, None);
    assert!(
        inv.warnings.iter().any(|w| w.contains("netns_mode")),
        "{:?}",
        inv.warnings
    );
}

/// The simulated host's knob writes what discovery reads.
#[test]
fn the_fixture_writes_the_kernels_rdma_netns_mode() {
    for mode in [
        None,
        Some(RdmaNetnsMode::Shared),
        Some(RdmaNetnsMode::Exclusive),
    ] {
        let (_dir, fixture) = build(HostRootBuilder::hgx().rdma_netns_mode(mode));
        assert_eq!(discover(fixture.root()).rdma_netns_mode, mode);
        assert_eq!(fixture.expected().rdma_netns_mode, mode);
    }
}
