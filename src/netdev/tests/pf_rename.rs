//! A restore finds the PF attach configured by its ifindex, not by a name
//! another PF may hold by then.

use super::rig::*;
use crate::netdev::fake::HOST;
use crate::netdev::vfinfo::VfState;

/// The PFs' names swapped after the attach: the VF's own PF gets its
/// settings back, and the PF now named as the record says keeps its VF's.
#[test]
fn a_pf_renamed_since_the_attach_is_restored_by_its_ifindex() {
    let mut m = model();
    let other = m.add_link(HOST, "ens2f0", "0c:42:a1:00:00:02", true);
    let mut tenant = vf_state();
    tenant.vlan.vlan = 300;
    m.vfs.insert((other, 3), tenant.clone());
    let mut rig = Rig::new(m);
    rig.attach(&[action()]).unwrap();
    {
        let mut m = rig.m();
        for l in m.links.iter_mut().filter(|l| l.ns == HOST) {
            match l.link.name.as_str() {
                "ens1f0" => l.link.name = "ens2f0".into(),
                "ens2f0" => l.link.name = "ens1f0".into(),
                _ => {}
            }
        }
    }
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let m = rig.m();
    assert_eq!(m.vfs[&(PF, 3)], vf_state(), "its own pf restored");
    assert_eq!(m.vfs[&(other, 3)], tenant, "the other pf's vf untouched");
}

const OUR_PF_BUS: &str = "0000:3b:00.0";
const OTHER_PF_BUS: &str = "0000:5e:00.0";

/// The host of [`model`] with both PFs naming their PCI functions, and the
/// other PF's VF 3 configured for another tenant; returns the rig with the VF
/// attached, the other PF's ifindex and that tenant's VF state.
fn two_pfs_attached() -> (Rig, u32, VfState) {
    let mut m = model();
    let other = m.add_link(HOST, "ens2f0", "0c:42:a1:00:00:02", true);
    for l in m.links.iter_mut() {
        match l.link.index {
            i if i == PF => l.link.parent = Some(OUR_PF_BUS.into()),
            i if i == other => l.link.parent = Some(OTHER_PF_BUS.into()),
            _ => {}
        }
    }
    let mut tenant = vf_state();
    tenant.vlan.vlan = 300;
    m.vfs.insert((other, 3), tenant.clone());
    let mut rig = Rig::new(m);
    rig.attach(&[action()]).unwrap();
    (rig, other, tenant)
}

/// Our PF's driver reloaded: its old ifindex is gone, it came back under a
/// new one, and the names swapped (`net.ifnames=0`). Returns the new ifindex.
fn reload_our_pf_with_names_swapped(m: &mut crate::netdev::fake::Model) -> u32 {
    let applied = m.vfs.remove(&(PF, 3)).unwrap();
    m.links.retain(|l| !(l.ns == HOST && l.link.index == PF));
    for l in m.links.iter_mut().filter(|l| l.link.name == "ens2f0") {
        l.link.name = "ens1f0".into();
    }
    let new = m.add_link(HOST, "ens2f0", "0c:42:a1:00:00:01", true);
    let pos = m.links.iter().position(|l| l.link.index == new).unwrap();
    m.links[pos].link.parent = Some(OUR_PF_BUS.into());
    m.vfs.insert((new, 3), applied);
    new
}

/// The PF's ifindex is gone and its name now belongs to another PF: the VF's
/// own PF is found by the PCI address saved at attach, and the other PF's
/// tenant keeps its VF's settings.
#[test]
fn a_pf_back_under_a_new_ifindex_is_restored_by_its_pci_address() {
    let (mut rig, other, tenant) = two_pfs_attached();
    let new = reload_our_pf_with_names_swapped(&mut rig.m());
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let m = rig.m();
    assert_eq!(m.vfs[&(new, 3)], vf_state(), "its own pf restored");
    assert_eq!(m.vfs[&(other, 3)], tenant, "the other pf's vf untouched");
}

/// Neither the ifindex nor the PCI address is on the host, and the saved name
/// belongs to another device now: nothing is reset, the record stays, and the
/// error names both devices.
#[test]
fn a_saved_name_on_another_device_is_not_taken_for_the_pf() {
    let (mut rig, other, tenant) = two_pfs_attached();
    {
        let mut m = rig.m();
        let new = reload_our_pf_with_names_swapped(&mut m);
        m.links.retain(|l| l.link.index != new);
    }
    let err = rig.detach("ctr1").unwrap_err();
    says(
        &err,
        "find pf: pf ens1f0 is now device 0000:5e:00.0, not 0000:3b:00.0 as at attach",
    );
    assert_eq!(
        rig.m().vfs[&(other, 3)],
        tenant,
        "the other pf's vf untouched"
    );
    assert_eq!(rig.records(), 1, "kept for a later try");
}

/// A PF whose device no one reported (a record from before the PCI address
/// was saved, or a driver that names no parent) is found by its name once its
/// ifindex is gone, as before.
#[test]
fn a_pf_of_unknown_device_falls_back_to_its_name() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    let new = {
        let mut m = rig.m();
        let applied = m.vfs.remove(&(PF, 3)).unwrap();
        m.links.retain(|l| !(l.ns == HOST && l.link.index == PF));
        let new = m.add_link(HOST, "ens1f0", "0c:42:a1:00:00:01", true);
        m.vfs.insert((new, 3), applied);
        new
    };
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.m().vfs[&(new, 3)], vf_state());
    assert_eq!(rig.records(), 0);
}

/// Adds a link on our PF's PCI function (a switchdev representor, or a second
/// port), reporting VF 3 or not; returns its ifindex.
fn another_link_on_our_pf(m: &mut crate::netdev::fake::Model, name: &str, reports_vf: bool) -> u32 {
    let index = m.add_link(HOST, name, "0c:42:a1:00:00:09", true);
    let pos = m.links.iter().position(|l| l.link.index == index).unwrap();
    m.links[pos].link.parent = Some(OUR_PF_BUS.into());
    if reports_vf {
        let mut theirs = vf_state();
        theirs.vlan.vlan = 700;
        m.vfs.insert((index, 3), theirs);
    }
    index
}

/// Of the links on the PF's PCI function, the one that reports the VF is the
/// PF; a representor, which reports none, is passed over.
#[test]
fn a_representor_on_the_pf_function_is_not_taken_for_the_pf() {
    let (mut rig, other, tenant) = two_pfs_attached();
    let new = {
        let mut m = rig.m();
        let rep = another_link_on_our_pf(&mut m, "ens2f0r3", false);
        let new = reload_our_pf_with_names_swapped(&mut m);
        assert!(rep < new, "listed first");
        new
    };
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let m = rig.m();
    assert_eq!(m.vfs[&(new, 3)], vf_state(), "its own pf restored");
    assert_eq!(m.vfs[&(other, 3)], tenant);
}

/// Two links on the PF's function both report the VF and neither has the
/// saved name: nothing is reset, and the error names both.
#[test]
fn two_links_reporting_the_vf_are_not_guessed_between() {
    let (mut rig, other, tenant) = two_pfs_attached();
    let second = {
        let mut m = rig.m();
        let new = reload_our_pf_with_names_swapped(&mut m);
        let second = another_link_on_our_pf(&mut m, "ens2f1", true);
        assert_ne!(new, second);
        second
    };
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "find pf: more than one link is on the pf's pci function and reports the vf: [\"ens2f0\", \"ens2f1\"]");
    let m = rig.m();
    assert_eq!(m.vfs[&(second, 3)].vlan.vlan, 700, "untouched");
    assert_eq!(m.vfs[&(other, 3)], tenant);
}

/// Our PF's driver reloaded under the same name, beside a second port on its
/// PCI function that also reports a VF 3: the saved name decides.
#[test]
fn the_saved_name_decides_between_links_reporting_the_vf() {
    let (mut rig, _, _) = two_pfs_attached();
    let (new, port) = {
        let mut m = rig.m();
        let applied = m.vfs.remove(&(PF, 3)).unwrap();
        m.links.retain(|l| !(l.ns == HOST && l.link.index == PF));
        let port = another_link_on_our_pf(&mut m, "ens1f1", true);
        let new = m.add_link(HOST, "ens1f0", "0c:42:a1:00:00:01", true);
        let pos = m.links.iter().position(|l| l.link.index == new).unwrap();
        m.links[pos].link.parent = Some(OUR_PF_BUS.into());
        m.vfs.insert((new, 3), applied);
        (new, port)
    };
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let m = rig.m();
    assert_eq!(m.vfs[&(new, 3)], vf_state(), "its own pf restored");
    assert_eq!(m.vfs[&(port, 3)].vlan.vlan, 700, "the other port untouched");
}

/// A representor alone on the PF's function (the PF's netdev gone) is not
/// taken for the PF: the restore fails naming the PF, and keeps its record.
#[test]
fn a_lone_representor_is_not_taken_for_the_pf() {
    use crate::netdev::fake::Call;
    let set_vf = |rig: &Rig| {
        let m = rig.m();
        m.calls
            .iter()
            .filter(|c| matches!(c, Call::SetVf { .. }))
            .count()
    };
    let (mut rig, _, _) = two_pfs_attached();
    {
        let mut m = rig.m();
        m.vfs.remove(&(PF, 3));
        m.links.retain(|l| !(l.ns == HOST && l.link.index == PF));
        another_link_on_our_pf(&mut m, "ens1f0r3", false);
    }
    let before = set_vf(&rig);
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "find pf: pf ens1f0 not found");
    assert_eq!(set_vf(&rig), before, "no vf setting sent");
    assert_eq!(rig.records(), 1);
}

/// The PF named in the plan is another PF than the VF's own (the names
/// swapped between the plan and the hook): nothing is done, no record is
/// kept, and the other PF's VF of the same number keeps its tenant's settings.
#[test]
fn a_pf_that_is_not_the_vfs_own_is_refused_at_attach() {
    let mut m = model();
    let other = m.add_link(HOST, "ens2f0", "0c:42:a1:00:00:02", true);
    for l in m.links.iter_mut() {
        match l.link.index {
            i if i == PF => l.link.parent = Some(OTHER_PF_BUS.into()),
            i if i == other => l.link.parent = Some(OUR_PF_BUS.into()),
            _ => {}
        }
    }
    let vf = action().vf_bus_id;
    m.physfn.insert(vf, OUR_PF_BUS.parse().unwrap());
    let before = super::rig::host_world(&m);
    let mut rig = Rig::new(m);
    let err = rig.attach(&[action()]).unwrap_err();
    says(
        &err,
        "check pf: pf ens1f0 is device 0000:5e:00.0, but vf 0000:3b:02.3's pf is 0000:3b:00.0",
    );
    assert_eq!(rig.records(), 0);
    assert_eq!(super::rig::host_world(&rig.m()), before);

    // Its own PF under that name: attached.
    let mut m = model();
    m.links[0].link.parent = Some(OUR_PF_BUS.into());
    m.physfn.insert(vf, OUR_PF_BUS.parse().unwrap());
    let mut rig = Rig::new(m);
    rig.attach(&[action()]).unwrap();
    assert_eq!(rig.records(), 1);
}
