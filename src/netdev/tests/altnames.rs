//! Names a VF picks up in a pod (an altname a container with `NET_ADMIN`
//! adds, or the old name a rename left there) do not keep it from coming
//! home whole; the host's own altnames stay.

use super::rig::*;
use crate::netdev::fake::{Call, HOST};

const HOST_ALTNAME: &str = "enp59s2f3";

/// A model whose VF has the altname udev gives it on the host.
fn model_with_altname() -> crate::netdev::fake::Model {
    let mut m = model();
    m.links[1].link.altnames.push(HOST_ALTNAME.to_string());
    m
}

fn add_altname(rig: &Rig, ns: u64, name: &str) {
    let mut m = rig.m();
    let vf = m
        .links
        .iter_mut()
        .find(|l| l.ns == ns && l.link.index == VF_NETDEV)
        .unwrap();
    vf.link.altnames.push(name.to_string());
}

/// A pod names its VF after a host link (its PF): the move home would fail
/// with EEXIST after the PF reset its VLAN, leaving the VF in the pod
/// without isolation. The name goes first; the VF comes home as it left.
#[test]
fn an_altname_taken_on_the_host_is_dropped_before_the_pf_reset() {
    for planted in ["ens1f0", "eth9"] {
        let mut rig = Rig::new(model_with_altname());
        let before = host_world(&rig.m());
        rig.attach(&[action()]).unwrap();
        add_altname(&rig, POD, planted);
        assert_eq!(rig.detach("ctr1").unwrap(), 1, "{planted}");
        assert_eq!(host_world(&rig.m()), before, "{planted}");
        assert_eq!(rig.records(), 0);
    }
}

/// A hook killed between the rename into the pod and the removal of the old
/// name it left as an altname (some kernels and udev keep it): the VF holds
/// its host name as an altname, and a device cannot be renamed to its own
/// altname. Found in the pod, or back on the host with its netns gone.
#[test]
fn the_saved_name_held_as_an_altname_does_not_block_the_restore() {
    for netns_gone in [false, true] {
        let mut rig = Rig::new(model_with_altname());
        let before = host_world(&rig.m());
        rig.attach(&[action()]).unwrap();
        add_altname(&rig, POD, "ens1f0v3");
        add_altname(&rig, POD, "planted0");
        if netns_gone {
            rig.m().destroy_ns(POD);
        }
        assert_eq!(rig.detach("ctr1").unwrap(), 1, "netns gone {netns_gone}");
        assert_eq!(host_world(&rig.m()), before, "netns gone {netns_gone}");
    }
}

/// A record written before altnames were saved knows only the saved name is
/// not the host's: that one goes, any other stays.
#[test]
fn a_record_without_altnames_drops_only_the_saved_name() {
    let mut rig = Rig::new(model_with_altname());
    rig.attach(&[action()]).unwrap();
    let mut rec = rig.store.all().unwrap().remove(0);
    rec.host.altnames = None;
    rig.store.save(&rec).unwrap();
    add_altname(&rig, POD, "ens1f0v3");
    add_altname(&rig, POD, "planted0");
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let m = rig.m();
    let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
    assert_eq!((vf.ns, vf.link.name.as_str()), (HOST, "ens1f0v3"));
    assert_eq!(vf.link.altnames, [HOST_ALTNAME, "planted0"]);
}

/// The pod gave its VF the host name back before its netns went: it comes
/// home under that name, and the altnames the pod added go all the same.
#[test]
fn altnames_of_a_vf_home_under_its_own_name_go_too() {
    let mut rig = Rig::new(model_with_altname());
    let before = host_world(&rig.m());
    rig.attach(&[action()]).unwrap();
    add_altname(&rig, POD, "planted0");
    {
        let mut m = rig.m();
        let vf = m
            .links
            .iter_mut()
            .find(|l| l.link.index == VF_NETDEV)
            .unwrap();
        vf.link.name = "ens1f0v3".into();
    }
    rig.m().destroy_ns(POD);
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(host_world(&rig.m()), before);
}

/// A host link took one of the VF's own altnames while the VF was in its
/// pod (another pod's VF came home holding it): the move home would fail.
/// The host's holder keeps it, as the kernel's own return of a device from
/// a dying netns does, and the VF comes home without it.
#[test]
fn a_saved_altname_another_host_link_took_is_dropped_and_the_vf_comes_home() {
    let mut rig = Rig::new(model_with_altname());
    rig.attach(&[action()]).unwrap();
    let other = rig.m().add_link(HOST, "ens9", "0e:00:00:00:00:99", true);
    {
        let mut m = rig.m();
        let l = m.links.iter_mut().find(|l| l.link.index == other).unwrap();
        l.link.altnames.push(HOST_ALTNAME.into());
    }
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let m = rig.m();
    let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
    assert_eq!((vf.ns, vf.link.name.as_str()), (HOST, "ens1f0v3"));
    assert!(vf.link.altnames.is_empty(), "{:?}", vf.link.altnames);
    let holder = m.links.iter().find(|l| l.link.index == other).unwrap();
    assert_eq!(holder.link.altnames, [HOST_ALTNAME]);
    assert_eq!(m.vfs[&(PF, 3)].vlan.vlan, 0, "pf settings restored");
}

/// The pod's container names its VF after a host link (the PF) and brings
/// it up again after the hook brought it down: the name is read again and
/// dropped before the move, and the VF comes home as it left.
#[test]
fn a_name_the_pod_gives_its_vf_during_the_restore_is_dropped_before_the_move() {
    let mut rig = Rig::new(model_with_altname());
    let before = host_world(&rig.m());
    rig.attach(&[action()]).unwrap();
    let start = rig.m().calls.len();
    rig.m().meddle = Some(crate::netdev::fake::Meddle {
        after: start,
        index: VF_NETDEV,
        altname: "ens1f0".into(),
        to_ns: None,
    });
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert!(rig.m().meddle.is_none(), "the pod acted");
    assert_eq!(host_world(&rig.m()), before);
    assert_eq!(rig.records(), 0);
}

/// A pod that deleted the VF's host altname in its netns (altnames move
/// with their device): the restore puts it back; where a host link holds
/// that name meanwhile, the VF comes home without it, and the restore still
/// succeeds.
#[test]
fn a_host_altname_the_pod_deleted_is_put_back_unless_taken() {
    for taken in [false, true] {
        let mut rig = Rig::new(model_with_altname());
        let before = host_world(&rig.m());
        rig.attach(&[action()]).unwrap();
        rig.m()
            .links
            .iter_mut()
            .find(|l| l.link.index == VF_NETDEV)
            .unwrap()
            .link
            .altnames
            .retain(|a| a != HOST_ALTNAME);
        if taken {
            let other = rig.m().add_link(HOST, "eth7", "0e:00:00:00:00:77", false);
            let mut m = rig.m();
            let l = m.links.iter_mut().find(|l| l.link.index == other).unwrap();
            l.link.altnames.push(HOST_ALTNAME.to_string());
        }
        assert_eq!(rig.detach("ctr1").unwrap(), 1, "taken {taken}");
        assert_eq!(rig.records(), 0);
        let m = rig.m();
        let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
        assert_eq!(vf.ns, HOST);
        assert_eq!(vf.link.altnames.contains(&HOST_ALTNAME.to_string()), !taken);
        if !taken {
            assert_eq!(host_world(&m), before);
        }
    }
}

/// A saved altname the kernel refuses for another reason than its being
/// taken (a link's property list full, EINVAL): the restore goes on and
/// succeeds, the VF home and whole but for that name.
#[test]
fn an_altname_the_kernel_refuses_does_not_fail_the_restore() {
    let deleted_in_pod = |rig: &Rig| {
        let mut m = rig.m();
        let vf = m.links.iter_mut().find(|l| l.link.index == VF_NETDEV);
        vf.unwrap().link.altnames.retain(|a| a != HOST_ALTNAME);
    };
    // Where the restore adds the name, among its calls.
    let mut rig = Rig::new(model_with_altname());
    rig.attach(&[action()]).unwrap();
    deleted_in_pod(&rig);
    let attached = rig.m().calls.len();
    rig.detach("ctr1").unwrap();
    let calls = rig.m().calls.clone();
    let add = calls
        .iter()
        .position(|c| matches!(c, Call::AddAltname { .. }));
    let add = add.expect("the restore adds the name");
    assert!(add >= attached);

    let mut rig = Rig::new(model_with_altname());
    rig.attach(&[action()]).unwrap();
    deleted_in_pod(&rig);
    (rig.m().fail_at, rig.m().fail_errno) = (Some(add), Some(libc::EINVAL));
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.records(), 0);
    let m = rig.m();
    let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
    assert_eq!((vf.ns, vf.link.name.as_str()), (HOST, "ens1f0v3"));
    assert!(!vf.link.altnames.contains(&HOST_ALTNAME.to_string()));
}
