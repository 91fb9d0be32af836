//! The VF's RDMA device is found by the index saved at the attach, never by
//! a name a pod can change or another device can take.

use super::rig::*;
use crate::netdev::fake::{Call, HOST};

const VF: &str = "0000:3b:02.3";
/// The index `model()` gives mlx5_3.
const INDEX: u32 = 5;

/// What the pod does with CAP_NET_ADMIN: `rdma dev set mlx5_3 name <to>`.
fn pod_renames(rig: &Rig, to: &str) {
    let mut m = rig.m();
    let dev = m.rdma.remove("mlx5_3").expect("mlx5_3 in the pod");
    assert_eq!(dev, (INDEX, POD));
    m.rdma.insert(to.to_string(), dev);
}

fn saved_index(rig: &Rig) -> Option<u32> {
    rig.store
        .load(VF.parse().unwrap())
        .unwrap()
        .unwrap()
        .rdma_index
}

#[test]
fn the_record_saves_the_index_of_the_device_it_moves() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    assert_eq!(saved_index(&rig), Some(INDEX));

    let mut a = action();
    a.move_rdma = false;
    let mut rig = Rig::new(model());
    rig.attach(&[a]).unwrap();
    assert_eq!(saved_index(&rig), None, "no device moved, none saved");
}

#[test]
fn a_device_the_pod_renamed_comes_home_under_its_host_name() {
    let mut rig = Rig::new(model());
    let before = rig.m().world();
    rig.attach(&[action()]).unwrap();
    pod_renames(&rig, "tenant0");
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.m().world(), before, "{:?}", rig.m().calls);
    assert!(rig.m().calls.contains(&Call::RdmaRename {
        index: INDEX,
        name: "mlx5_3".to_string()
    }));
    assert_eq!(rig.records(), 0);
}

#[test]
fn a_renamed_device_back_with_its_dead_netns_gets_its_name_back() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    pod_renames(&rig, "tenant0");
    rig.m().destroy_ns(POD);
    assert_eq!(rig.m().rdma["tenant0"], (INDEX, HOST), "rdma_dev_exit_net");
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let m = rig.m();
    assert_eq!(m.rdma.len(), 1, "{:?}", m.rdma);
    assert_eq!(m.rdma["mlx5_3"], (INDEX, HOST));
    drop(m);
    assert_eq!(rig.records(), 0);
}

/// The pod renames its device and makes another (a soft RoCE device, say)
/// under the old name. By name, the restore took that one for the VF's,
/// dropped the record and left the VF's own device in the pod.
#[test]
fn a_device_that_took_the_old_name_is_not_taken_for_the_vfs() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    pod_renames(&rig, "tenant0");
    rig.m().rdma.insert("mlx5_3".to_string(), (9, POD));
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "rename rdma device");
    {
        let m = rig.m();
        assert_eq!(m.rdma["tenant0"], (INDEX, HOST), "its own device came out");
        assert_eq!(m.rdma["mlx5_3"], (9, POD), "the other left where it is");
        let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
        assert_eq!(vf.ns, HOST);
        assert!(!vf.link.up, "home, but down until restored whole");
    }
    assert_eq!(rig.records(), 1, "kept for a later try");

    // The name free again (the pod gone, its device with it), a later try
    // finishes.
    rig.m().rdma.remove("mlx5_3");
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.m().rdma["mlx5_3"], (INDEX, HOST));
    assert_eq!(rig.records(), 0);
}

#[test]
fn a_record_from_before_the_index_finds_the_device_by_name() {
    let mut rig = Rig::new(model());
    let before = rig.m().world();
    rig.attach(&[action()]).unwrap();
    let mut rec = rig.store.load(VF.parse().unwrap()).unwrap().unwrap();
    rec.rdma_index = None;
    rig.store.save(&rec).unwrap();
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.m().world(), before);
}

/// Looked up before the VF is touched: a device renamed on the host since
/// the inventory named it refuses the attach with nothing changed.
#[test]
fn a_device_not_found_on_the_host_refuses_the_attach_untouched() {
    let mut rig = Rig::new(model());
    let dev = rig.m().rdma.remove("mlx5_3").unwrap();
    rig.m().rdma.insert("renamed".to_string(), dev);
    let before = rig.m().world();
    let err = rig.attach(&[action()]).unwrap_err();
    says(&err, "rdma device mlx5_3 not found");
    assert_eq!(
        rig.m().calls,
        vec![],
        "nothing changed, nothing rolled back"
    );
    assert_eq!(rig.m().world(), before);
    assert_eq!(rig.records(), 0);
}

/// What a driver rebind, a devlink reload or the driver's recovery from a
/// firmware fault does while the pod runs: the VF's device is unregistered
/// (gone from the pod) and registered again on the host, under a new index.
fn device_made_anew(rig: &Rig, name: &str) -> u32 {
    let mut m = rig.m();
    assert_eq!(m.rdma.remove("mlx5_3"), Some((INDEX, POD)));
    m.rdma.insert(name.to_string(), (21, HOST));
    m.rdma_parent.insert(21, VF.parse().unwrap());
    21
}

/// Looked for by the saved index alone, such a device is nowhere, and the
/// record stayed for good, the VF down and quarantined. It is the VF
/// function's device on the host, found there, its name put back.
#[test]
fn a_device_made_anew_while_away_is_found_as_the_vfs() {
    for name in ["mlx5_3", "mlx5_9"] {
        let mut rig = Rig::new(model());
        rig.attach(&[action()]).unwrap();
        let index = device_made_anew(&rig, name);
        assert_eq!(rig.detach("ctr1").unwrap(), 1, "{name}");
        let m = rig.m();
        assert_eq!(m.rdma.len(), 1, "{:?}", m.rdma);
        assert_eq!(m.rdma["mlx5_3"], (index, HOST), "{name}");
        let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
        assert_eq!((vf.ns, vf.link.name.as_str()), (HOST, "ens1f0v3"));
        drop(m);
        assert_eq!(rig.records(), 0, "{name}");
    }
}

/// Only the function's own device is taken: one of another function, or two
/// of this one, are no grounds to guess, and the record stays.
#[test]
fn no_device_of_the_function_or_several_are_not_guessed_at() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    device_made_anew(&rig, "mlx5_9");
    rig.m()
        .rdma_parent
        .insert(21, "0000:3b:02.4".parse().unwrap());
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "rdma device mlx5_3 not found");
    assert_eq!(rig.records(), 1);

    rig.m().rdma_parent.insert(21, VF.parse().unwrap());
    rig.m().rdma.insert("rxe0".to_string(), (22, HOST));
    rig.m().rdma_parent.insert(22, VF.parse().unwrap());
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "rdma device mlx5_3 not found");
    assert_eq!(rig.records(), 1);
    assert!(!rig
        .m()
        .calls
        .iter()
        .any(|c| matches!(c, Call::RdmaRename { .. })));
}

/// The pod renamed its device, and a device on the host took the old name
/// meanwhile: that name is never freed, so the VF's device comes home under
/// the name it has rather than holding the VF for ever. (A name held inside
/// a namespace is freed with it: that case waits, above.)
#[test]
fn a_name_a_host_device_took_leaves_the_vfs_device_its_own() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    pod_renames(&rig, "tenant0");
    rig.m().rdma.insert("mlx5_3".to_string(), (9, HOST));
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let m = rig.m();
    assert_eq!(m.rdma["tenant0"], (INDEX, HOST));
    assert_eq!(m.rdma["mlx5_3"], (9, HOST), "the host's device untouched");
    let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
    assert_eq!(vf.ns, HOST);
    drop(m);
    assert_eq!(rig.records(), 0);
}

/// A second stage of the same container after the pod renamed its device:
/// the char devices are looked up under the name the device has, so the VF
/// is found attached and nothing is done again.
#[test]
fn a_second_stage_after_a_rename_in_the_pod_changes_nothing() {
    let granted = vec![crate::netdev::CharNum {
        name: "uverbs3".to_string(),
        major: 231,
        minor: 195,
    }];
    let mut m = model();
    m.rdma_chars.insert("mlx5_3".to_string(), granted.clone());
    let mut rig = Rig::new(m);
    let mut a = action();
    a.rdma_chars = granted;
    rig.attach(&[a.clone()]).unwrap();
    pod_renames(&rig, "tenant0");
    {
        let mut m = rig.m();
        let chars = m.rdma_chars.remove("mlx5_3").unwrap();
        m.rdma_chars.insert("tenant0".to_string(), chars);
    }
    let calls = rig.m().calls.len();
    rig.attach(&[a]).unwrap();
    assert_eq!(rig.m().calls.len(), calls, "{:?}", rig.m().calls);
    assert_eq!(rig.m().rdma["tenant0"], (INDEX, POD));
}
