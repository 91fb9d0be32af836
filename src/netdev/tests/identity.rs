//! Which netdev is the VF: attach moves only the VF the plan names, and a
//! restore changes nothing of a VF it cannot find.
use super::rig::*;
use crate::netdev::fake::HOST;
use nri::ErrorChain;

/// The host netdev named in the plan is another VF's now (that VF came home
/// from a pod that is gone and took the name): nothing moves, and nothing of
/// either VF changes.
#[test]
fn a_host_netdev_of_another_vf_is_refused_before_any_change() {
    let mut m = model();
    m.links[1].link.parent = Some("0000:3b:02.5".to_string());
    let mut rig = Rig::new(m);
    let before = host_world(&rig.m());
    let err = rig.attach(&[action()]).unwrap_err();
    assert_eq!(
        ErrorChain(&err).to_string(),
        "vf 0000:3b:02.3 (ens1f0v3): find host netdev: host netdev ens1f0v3 belongs to 0000:3b:02.5, not to this vf"
    );
    assert!(rig.m().calls.is_empty());
    assert_eq!(host_world(&rig.m()), before);
    assert_eq!(rig.records(), 0);
}

/// The VF's netdev was renamed after the plan read its name (udev names
/// VFs seconds after they appear): it is found by its PCI function, moved
/// in, and goes home under the name it had, while a netdev that took the
/// planned name (another VF's) is left alone.
#[test]
fn a_vf_netdev_renamed_since_the_plan_is_found_by_its_pci_function() {
    for planned_name_taken in [false, true] {
        let mut m = model();
        m.links[1].link.name = "enp59s0f0v3".to_string();
        if planned_name_taken {
            let other = m.add_link(HOST, "ens1f0v3", "0e:00:00:00:00:05", true);
            let other = m.links.iter_mut().find(|l| l.link.index == other).unwrap();
            other.link.parent = Some("0000:3b:02.5".to_string());
        }
        let mut rig = Rig::new(m);
        let before = rig.m().world();
        rig.attach(&[action()]).unwrap();
        let vf = |rig: &Rig| {
            let m = rig.m();
            let l = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
            (l.ns, l.link.name.clone())
        };
        assert_eq!(vf(&rig), (POD, "net1".to_string()));
        let other = rig
            .m()
            .links
            .iter()
            .any(|l| l.ns == HOST && l.link.name == "ens1f0v3");
        assert_eq!(other, planned_name_taken, "the other netdev stays");
        assert_eq!(rig.detach("ctr1").unwrap(), 1);
        assert_eq!(vf(&rig), (HOST, "enp59s0f0v3".to_string()));
        assert_eq!(rig.m().world(), before);
    }
}

/// A container with NET_ADMIN moved the VF out of the pod's netns into one of
/// its own: found neither in the pod nor on the host, the VF keeps its tenant
/// VLAN, spoof check and RDMA device, and its record, rather than stay up
/// wherever it is without them. Once that namespace is gone the kernel puts
/// it back on the host, and the next try restores it whole.
#[test]
fn a_vf_neither_in_its_pod_nor_on_the_host_keeps_its_pf_settings() {
    const NESTED: u64 = 3;
    let mut rig = Rig::new(model());
    let before = rig.m().world();
    rig.attach(&[action()]).unwrap();
    let attached = rig.m().world();
    {
        let mut m = rig.m();
        m.namespaces.insert(NESTED);
        let vf = m
            .links
            .iter_mut()
            .find(|l| l.link.index == VF_NETDEV)
            .unwrap();
        vf.ns = NESTED;
    }
    let start = rig.m().calls.len();
    let err = rig.detach("ctr1").unwrap_err();
    says(
        &err,
        "find netdev: vf netdev ens1f0v3 not found in its pod or on the host",
    );
    assert!(
        rig.m().calls[start..].is_empty(),
        "nothing changed: {:?}",
        &rig.m().calls[start..]
    );
    assert_eq!(
        rig.m().vfs,
        attached.1,
        "the pf-side settings stay the tenant's"
    );
    assert_eq!(rig.records(), 1, "kept for a later try");

    rig.m().destroy_ns(NESTED);
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.m().world(), before);
}

/// VFs listed from a container's records are each read again under their
/// lock: one whose record is another container's by then, or gone (restored
/// meanwhile), is left alone; one still the container's goes home.
#[test]
fn a_listed_vf_is_restored_only_while_its_record_is_the_containers() {
    let mut rig = Rig::new(model());
    let before = host_world(&rig.m());
    rig.attach(&[action()]).unwrap();
    let vf = action().vf_bus_id;
    let mut rec = rig.store.load(vf).unwrap().unwrap();
    rec.container_id = "ctr2".to_string();
    rig.store.save(&rec).unwrap();
    assert_eq!(rig.detach_listed("ctr1", &[vf]).unwrap(), 0);
    assert_eq!(rig.records(), 1, "ctr2's record kept");
    assert_ne!(host_world(&rig.m()), before, "the VF stays in the pod");

    rec.container_id = "ctr1".to_string();
    rig.store.save(&rec).unwrap();
    assert_eq!(rig.detach_listed("ctr1", &[vf]).unwrap(), 1);
    assert_eq!(host_world(&rig.m()), before);
    assert_eq!(rig.records(), 0);
    assert_eq!(rig.detach_listed("ctr1", &[vf]).unwrap(), 0, "nothing left");
}
