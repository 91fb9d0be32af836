//! Which netdev a PCI function's `net/` names: a PF's own before its
//! representors, a VF with a netdev per port.
use super::*;

/// In switchdev mode a PF's `net/` also holds its VFs' representors, whose
/// names may sort first: the PF's own netdev (its `phys_port_name` a
/// physical port's, or none) is listed first.
#[test]
fn a_pfs_own_netdev_comes_before_its_representors() {
    let (dir, _fixture) = build(HostRootBuilder::hgx().gpus(1).nics(2));
    let net = dir.path().join("sys/bus/pci/devices/0000:1d:00.0/net");
    let port = |name: &str, port: &str| {
        std::fs::create_dir_all(net.join(name)).unwrap();
        std::fs::write(net.join(name).join("phys_port_name"), format!("{port}\n")).unwrap();
    };
    port("enp29s0np0", "p0");
    port("enp29s0_0", "pf0vf0");
    port("enp29s0_1", "c1pf0vf1");
    port("enp29s0_sf", "pf0sf2");
    port("enp29s0_pf", "pf0");
    let netdevs = || {
        let inv = discover(dir.path());
        let nic = inv
            .rdma
            .into_iter()
            .find(|n| n.bus_id == addr("0000:1d:00.0"));
        nic.unwrap().netdevs
    };
    let listed = netdevs();
    assert_eq!(
        listed,
        [
            "enp29s0np0",
            "enp29s0_0",
            "enp29s0_1",
            "enp29s0_pf",
            "enp29s0_sf"
        ]
    );
    // No port names at all (a driver without devlink ports): by name.
    for name in &listed[1..] {
        std::fs::remove_dir_all(net.join(name)).unwrap();
    }
    std::fs::remove_file(net.join("enp29s0np0/phys_port_name")).unwrap();
    port("enp29s0a", "");
    std::fs::remove_file(net.join("enp29s0a/phys_port_name")).unwrap();
    assert_eq!(netdevs(), ["enp29s0a", "enp29s0np0"]);
}

/// A VF function with a netdev per port lists them all, so that the plan can
/// refuse it: the hook moves one netdev per VF.
#[test]
fn a_vf_with_a_netdev_per_port_lists_the_others() {
    let (dir, fixture) = build(HostRootBuilder::hgx().gpus(1).nics(1).vfs_per_pf(2));
    let vf = fixture.expected().rdma[0].vfs[0].clone();
    let first = vf.netdev.clone().expect("the fixture's vf has a netdev");
    let net = dir
        .path()
        .join(format!("sys/bus/pci/devices/{}/net", vf.bus_id));
    for name in ["zz1", "zz0"] {
        std::fs::create_dir_all(net.join(format!("{first}{name}"))).unwrap();
    }
    let inv = discover(dir.path());
    let found = inv.rdma[0]
        .vfs
        .iter()
        .find(|v| v.bus_id == vf.bus_id)
        .unwrap();
    assert_eq!(found.netdev.as_deref(), Some(first.as_str()));
    assert_eq!(
        found.more_netdevs,
        [format!("{first}zz0"), format!("{first}zz1")]
    );
    let view = serde_json::to_value(crate::inventory::view::InventoryView::new(&inv)).unwrap();
    let vfs = &view["rdma"][0]["vfs"];
    assert_eq!(vfs[0]["more_netdevs"][1], format!("{first}zz1"));
    // One netdev, as every other VF: the field is left out.
    assert!(vfs[1].get("more_netdevs").is_none(), "{vfs}");
}

/// A netdev renamed to bytes that are not UTF-8 is listed all the same, so
/// that a VF with it beside another netdev is still seen to have two, and
/// the plan, which takes only plain names, refuses either.
#[test]
fn a_netdev_name_that_is_not_utf8_is_listed() {
    use std::os::unix::ffi::OsStrExt;
    let (dir, fixture) = build(HostRootBuilder::hgx().gpus(1).nics(1).vfs_per_pf(2));
    let vfs = &fixture.expected().rdma[0].vfs;
    let net = |n: usize| {
        dir.path()
            .join(format!("sys/bus/pci/devices/{}/net", vfs[n].bus_id))
    };
    let odd = std::ffi::OsStr::from_bytes(b"ens\xff");
    std::fs::create_dir_all(net(0).join(odd)).unwrap();
    let only = net(1);
    std::fs::remove_dir_all(&only).unwrap();
    std::fs::create_dir_all(only.join(odd)).unwrap();
    let inv = discover(dir.path());
    let found = |n: usize| {
        let vf = inv.rdma[0].vfs.iter().find(|v| v.bus_id == vfs[n].bus_id);
        vf.unwrap().clone()
    };
    let first = vfs[0].netdev.clone().unwrap();
    let two = found(0);
    let mut names: Vec<String> = two.netdev.into_iter().chain(two.more_netdevs).collect();
    names.sort();
    assert_eq!(names, ["ens\u{fffd}".to_string(), first]);
    assert_eq!(found(1).netdev.as_deref(), Some("ens\u{fffd}"));
    assert!(!crate::inventory::plain_name("ens\u{fffd}", 15));
}
