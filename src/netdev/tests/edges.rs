//! Attach and detach at their edges: a VF in a live pod, a pod in the host's
//! namespace, a PF gone at restore, an unfinished restore taken over, RDMA
//! char devices numbered anew by the move, and an attach cut part way.

use super::rig::*;
use crate::netdev::fake::{Call, HOST};
use crate::netdev::{attach_all, VfOps};
use nri::ErrorChain;

/// The pod's other containers still run in its netns at a poststop: the VF
/// goes down there before its tenant VLAN and spoof check are reset, and a
/// failure after that leaves it down, never up in the pod without them.
#[test]
fn a_vf_in_a_live_pod_goes_down_before_its_pf_settings_are_reset() {
    let first_set_vf = |calls: &[Call]| calls.iter().position(|c| matches!(c, Call::SetVf { .. }));
    let mut probe = Rig::new(model());
    probe.attach(&[action()]).unwrap();
    let start = probe.m().calls.len();
    probe.detach("ctr1").unwrap();
    let restore = probe.m().calls[start..].to_vec();
    assert!(
        matches!(
            restore[0],
            Call::SetLink {
                ns: POD,
                up: Some(false),
                to_ns: None,
                ..
            }
        ),
        "{restore:?}"
    );
    let set_vf = first_set_vf(&restore).expect("pf settings reset");

    let mut rig = Rig::new(model());
    let before = rig.m().world();
    rig.attach(&[action()]).unwrap();
    rig.m().fail_at = Some(start + set_vf);
    rig.detach("ctr1").unwrap_err();
    {
        let m = rig.m();
        let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
        assert!(!vf.link.up, "{:?}", m.calls);
    }
    assert_eq!(rig.records(), 1, "kept for a later try");
    rig.m().fail_at = None;
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.m().world(), before);
}

/// A hostNetwork pod's netns is the host's: the kernel would skip the move and
/// the VF would be renamed and configured on the host. Refused before any call.
#[test]
fn a_pod_in_the_host_netns_is_refused_before_any_change() {
    let mut rig = Rig::new(model());
    rig.pod = crate::netdev::Netns::fake(HOST);
    let before = rig.m().world();
    let err = rig.attach(&[action()]).unwrap_err();
    let text = ErrorChain(&err).to_string();
    assert!(
        text.starts_with("vf 0000:3b:02.3 (ens1f0v3): check pod netns: the pod has no network namespace of its own (hostNetwork)"),
        "{text}"
    );
    assert!(rig.m().calls.is_empty(), "{:?}", rig.m().calls);
    assert_eq!(rig.m().world(), before);
    assert_eq!(rig.records(), 0);
}

/// A VF whose PF settings cannot be put back (its PF gone meanwhile) comes
/// home but stays down, with its record kept: up on the host it would carry
/// the tenant's VLAN and MAC. The detach that restores it whole brings it up.
#[test]
fn a_vf_whose_pf_settings_are_not_restored_stays_down_on_the_host() {
    let mut rig = Rig::new(model());
    rig.m().links[1].link.up = true;
    let before = rig.m().world();
    rig.attach(&[action()]).unwrap();
    let pf = rig.m().links.remove(0);
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "ens1f0");
    {
        let m = rig.m();
        let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
        assert_eq!((vf.ns, vf.link.name.as_str()), (HOST, "ens1f0v3"));
        assert!(!vf.link.up, "{:?}", m.calls);
        assert_eq!(
            m.vfs[&(PF, 3)].vlan.vlan,
            100,
            "the tenant's vlan is still set"
        );
    }
    assert_eq!(rig.records(), 1, "kept for a later try");
    assert!(
        rig.store.all().unwrap()[0].restoring,
        "marked before the first change"
    );
    rig.m().links.insert(0, pf);
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.m().world(), before);
}

/// An earlier network owner of the same pod whose restore did not finish (its
/// PF was gone meanwhile) left its record: the pod's next owner finishes
/// the restore and moves the VF in again, rather than being refused or
/// starting without it; its own detach then puts everything back.
#[test]
fn the_pods_next_owner_takes_over_an_unfinished_restore() {
    let mut rig = Rig::new(model());
    let before = rig.m().world();
    rig.attach(&[action()]).unwrap();
    let pf = rig.m().links.remove(0);
    rig.detach("ctr1").unwrap_err();
    assert_eq!(rig.records(), 1);
    rig.m().links.insert(0, pf);

    rig.attach_as("ctr2", POD).unwrap();
    {
        let m = rig.m();
        let net1 = m.links.iter().find(|l| l.link.name == "net1").unwrap();
        assert_eq!(net1.ns, POD);
        assert!(net1.link.up);
        assert_eq!(m.vfs[&(PF, 3)].vlan.vlan, 100);
    }
    assert_eq!(rig.records(), 1);
    assert_eq!(
        rig.detach("ctr1").unwrap(),
        0,
        "the record is the new owner's"
    );
    assert_eq!(rig.detach("ctr2").unwrap(), 1);
    assert_eq!(rig.m().world(), before);
}

fn chars(list: &[(&str, u32, u32)]) -> Vec<crate::netdev::CharNum> {
    list.iter()
        .map(|(name, major, minor)| crate::netdev::CharNum {
            name: name.to_string(),
            major: *major,
            minor: *minor,
        })
        .collect()
}

/// Exclusive mode: the kernel registers a moved RDMA device's char devices
/// anew and they may take other minors than the container's nodes name. The
/// attach checks them after the move: the same numbers pass; others fail the
/// attach, which puts everything back, naming both.
#[test]
fn rdma_char_devices_numbered_anew_by_the_move_fail_the_attach() {
    let granted = chars(&[("umad3", 231, 3), ("uverbs3", 231, 195)]);
    // The device has an issm node too, which the container was not given:
    // no concern of the check.
    let with_chars = || {
        let mut m = model();
        let mut on_host = granted.clone();
        on_host.extend(chars(&[("issm3", 231, 67)]));
        m.rdma_chars.insert("mlx5_3".to_string(), on_host);
        m
    };
    let mut a = action();
    a.rdma_chars = granted.clone();
    let mut rig = Rig::new(with_chars());
    rig.attach(&[a.clone()]).unwrap();
    assert_eq!(rig.m().rdma["mlx5_3"].1, POD);
    // The saved record leaves the numbers out (a devgate from before them
    // refuses a record with an unknown field), and a second stage still
    // finds the VF attached as asked.
    let saved = rig.store.all().unwrap();
    assert!(saved[0].attach.rdma_chars.is_empty(), "{saved:?}");
    let calls = rig.m().calls.len();
    rig.attach(&[a.clone()]).unwrap();
    assert_eq!(rig.m().calls.len(), calls, "a second stage is a no-op");

    let mut rig = Rig::new(with_chars());
    let before = rig.m().world();
    rig.m().renumber_on_move.insert(
        "mlx5_3".to_string(),
        chars(&[("umad3", 231, 3), ("uverbs2", 231, 194)]),
    );
    let err = rig.attach(&[a]).unwrap_err();
    says(&err, "rdma device mlx5_3 took other char devices when it moved into the pod (umad3 231:3, uverbs2 231:194; the container's nodes name umad3 231:3, uverbs3 231:195)");
    assert_eq!(rig.m().world(), before, "put back");
    assert_eq!(rig.records(), 0);
}

/// An attach cut after the VF is configured and before its record is marked
/// finished (the process died: no rollback) leaves the record `attaching`,
/// so nothing takes the VF as whole. A finished attach clears it, and a
/// later stage of the same container redoes a cut one rather than taking
/// it as done from a look at the pod.
#[test]
fn an_attach_cut_part_way_is_marked_until_one_finishes() {
    let mut rig = Rig::new(model());
    let pod = crate::netdev::Netns::fake(POD);
    let die_at_rdma = |step: &'static str| {
        if step == "rdma" {
            panic!("killed");
        }
    };
    let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut ops = VfOps {
            env: &mut rig.net,
            store: &rig.store,
            checkpoint: &die_at_rdma,
        };
        attach_all(&mut ops, "ctr1", &pod, None, &[action()])
    }));
    assert!(cut.is_err(), "the attach died at its checkpoint");
    let rec = &rig.store.all().unwrap()[0];
    assert!(rec.attaching && rec.cut(), "{rec:?}");
    assert!(!rig.store.moved_whole(rec.vf()));
    assert_eq!(rig.m().rdma["mlx5_3"].1, POD, "everything applied");
    let calls = rig.m().calls.len();
    rig.attach(&[action()]).unwrap();
    assert!(rig.m().calls.len() > calls, "done again, not taken as done");
    let rec = &rig.store.all().unwrap()[0];
    assert!(!rec.attaching && !rec.cut(), "{rec:?}");
    assert!(rig.store.moved_whole(rec.vf()));
}

/// An RDMA device the plan names that is not on the host (renamed or gone
/// since the inventory was read) fails the attach before anything of it
/// moved. Putting the VF back then finds it nowhere, which for an attach
/// that never finished means it never moved: the VF comes home as it was
/// and no record stays to hold it down and quarantined.
#[test]
fn an_rdma_device_missing_at_the_attach_leaves_the_vf_as_it_was() {
    let mut a = action();
    a.rdma_device = Some("mlx5_9".to_string());
    let mut rig = Rig::new(model());
    let before = rig.m().world();
    let err = rig.attach(&[a]).unwrap_err();
    says(&err, "rdma device mlx5_9");
    let chain = nri::ErrorChain(&err).to_string();
    assert!(!chain.contains("rollback"), "{chain}");
    assert_eq!(rig.m().world(), before, "put back");
    assert_eq!(rig.records(), 0);

    // After a finished attach, a device found nowhere at the detach may be
    // hidden in a namespace the pod made: the record stays.
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    rig.m().rdma.remove("mlx5_3");
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "rdma device mlx5_3 not found");
    assert_eq!(rig.records(), 1, "kept for a later try");
}

/// A restore cut after it reset the VF's PF settings leaves the VF in the
/// pod without its tenant VLAN; a process of the pod with NET_ADMIN may
/// raise its link again. The same container's next attach (podman starting
/// it again) does not take that for done: it restores the VF and attaches it
/// anew, whole.
#[test]
fn a_vf_whose_restore_began_is_not_taken_for_attached() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    let vf = "0000:3b:02.3".parse().unwrap();
    let mut rec = rig.store.load(vf).unwrap().unwrap();
    rec.restoring = true;
    rig.store.save(&rec).unwrap();
    rig.m().vfs.insert((PF, 3), vf_state());
    assert_eq!(rig.m().vfs[&(PF, 3)].vlan.vlan, 0, "reset by the restore");

    rig.attach(&[action()]).unwrap();
    assert_eq!(
        rig.m().vfs[&(PF, 3)].vlan.vlan,
        100,
        "the tenant VLAN again"
    );
    let rec = rig.store.load(vf).unwrap().unwrap();
    assert!(!rec.cut(), "{rec:?}");
    assert!(rig
        .m()
        .links
        .iter()
        .any(|l| l.ns == POD && l.link.name == "net1" && l.link.up));
}

/// The kernel refuses the move home (a name taken on the host, found after
/// it was checked): nothing of the PF side has changed, so the VF stays in
/// its pod with its tenant VLAN and spoof check, down, and the record stays
/// for a later try.
#[test]
fn a_refused_move_home_leaves_the_vf_whole_in_its_pod() {
    let is_move = |c: &Call| {
        matches!(
            c,
            Call::SetLink {
                ns: POD,
                to_ns: Some(HOST),
                ..
            }
        )
    };
    let mut probe = Rig::new(model());
    probe.attach(&[action()]).unwrap();
    let start = probe.m().calls.len();
    probe.detach("ctr1").unwrap();
    let restore = probe.m().calls[start..].to_vec();
    let moved = restore.iter().position(is_move).expect("moved home");
    let set_vf = restore.iter().position(|c| matches!(c, Call::SetVf { .. }));
    assert!(set_vf.is_some_and(|s| s > moved), "{restore:?}");

    let mut rig = Rig::new(model());
    let before = rig.m().world();
    rig.attach(&[action()]).unwrap();
    let attached = rig.m().vfs[&(PF, 3)].clone();
    rig.m().fail_at = Some(start + moved);
    rig.detach("ctr1").unwrap_err();
    {
        let m = rig.m();
        let vf = m.links.iter().find(|l| l.link.index == VF_NETDEV).unwrap();
        assert_eq!((vf.ns, vf.link.up), (POD, false), "{:?}", m.calls);
        assert_eq!(m.vfs[&(PF, 3)], attached, "pf settings untouched");
    }
    assert_eq!(rig.records(), 1, "kept for a later try");
    rig.m().fail_at = None;
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.m().world(), before);
}

/// A container with NET_ADMIN moves its VF into a namespace of its own after
/// the hook brought it down, and brings it up there: found neither in the
/// pod nor on the host, it keeps its tenant VLAN and spoof check, and the
/// record stays for a later try.
#[test]
fn a_vf_a_container_moved_away_during_the_restore_keeps_its_pf_settings() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    let attached = rig.m().vfs[&(PF, 3)].clone();
    let start = rig.m().calls.len();
    rig.m().meddle = Some(crate::netdev::fake::Meddle {
        after: start,
        index: VF_NETDEV,
        altname: "x0".into(),
        to_ns: Some(7),
    });
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "find netdev");
    let m = rig.m();
    assert!(m.meddle.is_none(), "the container acted");
    assert_eq!(m.vfs[&(PF, 3)], attached, "pf settings untouched");
    assert_eq!(rig.records(), 1, "kept for a later try");
}
