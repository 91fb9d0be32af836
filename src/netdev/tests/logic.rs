//! Attach and detach against the kernel model in `fake`: end states, rollback
//! from every failure point, idempotence, and the ways a VF can come home.

use super::rig::*;
use crate::netdev::fake::{Call, FakeNet, HOST};
use crate::netdev::settings::{LinkState, RateConfig};
use crate::netdev::{Cause, VfError, VfSettings};
use nri::ErrorChain;

#[test]
fn attach_applies_everything_and_detach_puts_it_back() {
    let mut rig = Rig::new(model());
    let before = rig.m().world();
    rig.attach(&[action()]).unwrap();
    {
        let m = rig.m();
        let net1 = m.links.iter().find(|l| l.link.name == "net1").unwrap();
        assert_eq!(net1.ns, POD);
        assert!(net1.link.up);
        assert_eq!(net1.link.mtu, 9000);
        assert_eq!(
            net1.link.mac.as_ref().unwrap().to_string(),
            "02:00:00:00:00:11"
        );
        assert!(!m
            .links
            .iter()
            .any(|l| l.ns == HOST && l.link.name == "ens1f0v3"));
        let s = &m.vfs[&(PF, 3)];
        assert_eq!(s.mac.to_string(), "02:00:00:00:00:11");
        assert_eq!((s.vlan.vlan, s.vlan.qos), (100, 2));
        assert_eq!(
            (s.spoofchk, s.trust, s.link_state),
            (Some(false), Some(true), LinkState::Enable)
        );
        assert_eq!(s.rate, RateConfig { min: 0, max: 1000 });
        assert_eq!(m.rdma["mlx5_3"].1, POD);
        assert!(m.arp_notify.contains(&net1.link.index), "{:?}", m.calls);
    }
    assert_eq!(rig.records(), 1);
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.m().world(), before);
    assert_eq!(rig.records(), 0);
}

#[test]
fn settings_the_driver_does_not_report_are_restored_to_the_restrictive_value() {
    let mut m = model();
    m.unreported_flags = true;
    // Off and off before the pod: what devgate cannot read back.
    m.vfs.get_mut(&(PF, 3)).unwrap().spoofchk = Some(false);
    let mut rig = Rig::new(m);
    rig.attach(&[action()]).unwrap();
    let s = rig.m().vfs[&(PF, 3)].clone();
    assert_eq!((s.spoofchk, s.trust), (Some(false), Some(true)));
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let s = rig.m().vfs[&(PF, 3)].clone();
    // The pod's trust is taken back, and spoof checking is left on rather
    // than assumed off.
    assert_eq!((s.spoofchk, s.trust), (Some(true), Some(false)));
    assert_eq!(
        s.vlan.vlan, 0,
        "what the PF did report is restored as saved"
    );
    assert_eq!(rig.records(), 0);
}

#[test]
fn settings_the_driver_neither_reports_nor_sets_fail_the_attach_and_roll_back() {
    let mut m = model();
    (m.unreported_flags, m.unsupported_flags) = (true, true);
    let mut rig = Rig::new(m);
    let before = rig.m().world();
    let err = rig.attach(&[action()]).unwrap_err();
    says(&err, "set pf vf spoofchk");
    // The rollback put back what was set before the refusal and, the
    // driver having no setter for them, left spoof checking and trust.
    assert_eq!(rig.m().world(), before);
    assert_eq!(rig.records(), 0, "{}", ErrorChain(&err));
}

#[test]
fn a_reported_setting_the_driver_stops_supporting_fails_the_restore() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    // After the attach set them, the driver neither reports nor sets them
    // (a reload into another mode): what the pod was given, reported before
    // it, cannot be taken back.
    rig.m().unreported_flags = true;
    rig.m().unsupported_flags = true;
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "set pf vf spoofchk");
    assert_eq!(rig.records(), 1, "the record stays for a later try");
    assert_eq!(rig.m().vfs[&(PF, 3)].trust, Some(true));
}

#[test]
fn a_failure_at_any_step_rolls_everything_back() {
    let mut probe = Rig::new(model());
    probe.attach(&[action()]).unwrap();
    let steps = probe.m().calls.len();
    assert!(steps >= 10, "{:?}", probe.m().calls);
    for k in 0..steps {
        let mut rig = Rig::new(model());
        let before = rig.m().world();
        rig.m().fail_at = Some(k);
        let err = rig.attach(&[action()]).unwrap_err();
        let text = ErrorChain(&err).to_string();
        assert!(text.starts_with("vf 0000:3b:02.3 (ens1f0v3): "), "{text}");
        assert_eq!(rig.m().world(), before, "failure at call {k}: {text}");
        assert_eq!(rig.records(), 0, "failure at call {k}");
    }
}

/// A VF still resetting after its PF-side MAC was set may answer its own
/// MAC's set with EAGAIN or EBUSY for a while: tried again, as sriov-cni
/// does, not a failed attach.
#[test]
fn a_busy_vf_gets_its_mac_on_a_later_try() {
    let mut probe = Rig::new(model());
    probe.attach(&[action()]).unwrap();
    let set_mac = probe
        .m()
        .calls
        .iter()
        .position(|c| matches!(c, Call::SetLink { mac: Some(_), .. }))
        .expect("a mac set");
    for errno in [libc::EAGAIN, libc::EBUSY] {
        let mut rig = Rig::new(model());
        {
            let mut m = rig.m();
            (m.fail_at, m.fail_errno) = (Some(set_mac), Some(errno));
        }
        rig.attach(&[action()]).unwrap();
        let m = rig.m();
        let net1 = m.links.iter().find(|l| l.link.name == "net1").unwrap();
        assert_eq!(
            net1.link.mac.as_ref().unwrap().to_string(),
            "02:00:00:00:00:11"
        );
    }
}

#[test]
fn detach_twice_or_without_a_record_changes_nothing() {
    let mut rig = Rig::new(model());
    assert_eq!(rig.detach("ctr1").unwrap(), 0);
    rig.attach(&[action()]).unwrap();
    rig.detach("ctr1").unwrap();
    let calls = rig.m().calls.len();
    assert_eq!(rig.detach("ctr1").unwrap(), 0);
    assert_eq!(rig.detach("other").unwrap(), 0);
    assert_eq!(rig.m().calls.len(), calls);
}

#[test]
fn a_second_stage_for_the_same_container_is_a_no_op() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    let calls = rig.m().calls.len();
    rig.attach(&[action()]).unwrap();
    assert_eq!(rig.m().calls.len(), calls);
    // Half done (the link is down, as after a crash): restored, then attached again.
    let before_attach = FakeNet::new(model()).model.borrow().world();
    rig.m()
        .links
        .iter_mut()
        .filter(|l| l.ns == POD)
        .for_each(|l| l.link.up = false);
    rig.attach(&[action()]).unwrap();
    assert!(rig
        .m()
        .links
        .iter()
        .any(|l| l.ns == POD && l.link.name == "net1" && l.link.up));
    // Cut short before the RDMA move, the last step: it is not taken as done.
    rig.m().rdma.get_mut("mlx5_3").unwrap().1 = HOST;
    rig.attach(&[action()]).unwrap();
    assert_eq!(rig.m().rdma["mlx5_3"].1, POD);
    rig.detach("ctr1").unwrap();
    assert_eq!(rig.m().world(), before_attach);
}

#[test]
fn a_vf_held_by_another_pods_container_is_refused() {
    let mut m = model();
    m.add_link(3, "lo", "00:00:00:00:00:00", false);
    let mut rig = Rig::new(m);
    rig.attach(&[action()]).unwrap();
    let calls = rig.m().calls.len();
    let err = rig.attach_as("ctr2", 3).unwrap_err();
    assert_eq!(rig.m().calls.len(), calls, "nothing changed");
    assert!(
        matches!(
            err,
            VfError::Step {
                cause: Cause::Held { .. },
                ..
            }
        ),
        "{}",
        ErrorChain(&err).to_string()
    );
}

#[test]
fn netns_gone_vf_comes_home_under_its_pod_name_or_dev_ifindex() {
    for host_has_net1 in [false, true] {
        let mut m = model();
        if host_has_net1 {
            m.add_link(HOST, "net1", "0e:99:00:00:00:01", false);
        }
        let mut rig = Rig::new(m);
        let before = host_world(&rig.m());
        rig.attach(&[action()]).unwrap();
        rig.m().destroy_ns(POD);
        let want = if host_has_net1 {
            format!("dev{VF_NETDEV}")
        } else {
            "net1".to_string()
        };
        assert!(rig
            .m()
            .links
            .iter()
            .any(|l| l.ns == HOST && l.link.name == want));
        assert_eq!(rig.detach("ctr1").unwrap(), 1);
        assert_eq!(
            host_world(&rig.m()),
            before,
            "host_has_net1 {host_has_net1}"
        );
        assert_eq!(rig.records(), 0);
    }
}

#[test]
fn a_taken_pod_name_fails_before_any_change() {
    let mut m = model();
    m.add_link(POD, "net1", "0a:00:00:00:00:09", false);
    let mut rig = Rig::new(m);
    let err = rig.attach(&[action()]).unwrap_err();
    says(
        &err,
        "check container name: net1 already exists in the pod netns",
    );
    assert!(rig.m().calls.is_empty());
    assert_eq!(rig.records(), 0);
}

#[test]
fn a_taken_host_name_keeps_the_record_until_freed() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    let squatter = rig
        .m()
        .add_link(HOST, "ens1f0v3", "0e:77:00:00:00:01", false);
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "host name ens1f0v3 is taken");
    assert_eq!(rig.records(), 1);
    // The VF stays usable in the pod, whole: its VLAN and the rest of its PF
    // settings, and its RDMA device, are still the pod's.
    assert!(rig
        .m()
        .links
        .iter()
        .any(|l| l.ns == POD && l.link.name == "net1" && l.link.up));
    assert_eq!(rig.m().vfs[&(PF, 3)].vlan.vlan, 100);
    assert_eq!(rig.m().vfs[&(PF, 3)].spoofchk, Some(false));
    assert_eq!(rig.m().rdma["mlx5_3"].1, POD);
    // Untouched, its record is not marked: the pod's next container finds
    // the VF whole, rather than refused as one a restore began on.
    let rec = &rig.store.all().unwrap()[0];
    assert!(!rec.restoring, "{rec:?}");
    assert!(rig.store.moved_whole(rec.vf()));
    rig.m().links.retain(|l| l.link.index != squatter);
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.records(), 0);
}

#[test]
fn altnames_left_by_renames_are_removed() {
    let mut m = model();
    m.altname_on_rename = true;
    let mut rig = Rig::new(m);
    let mut a = action();
    a.move_rdma = false;
    // The move keeps the name and the rename after it leaves the old one as an altname.
    rig.attach(&[a]).unwrap();
    rig.m()
        .links
        .iter()
        .for_each(|l| assert!(!l.link.altnames.contains(&"ens1f0v3".to_string()), "{l:?}"));
    rig.detach("ctr1").unwrap();
    rig.m()
        .links
        .iter()
        .for_each(|l| assert!(l.link.altnames.is_empty(), "{l:?}"));
}

#[test]
fn without_a_pf_only_the_netdev_mac_is_set() {
    let mut rig = Rig::new(model());
    let mut a = action();
    a.pf_netdev = "ens9f9".to_string();
    let err = rig.attach(&[a.clone()]).unwrap_err();
    assert!(
        matches!(
            err,
            VfError::Step {
                step: "find pf",
                cause: Cause::NoPf { .. },
                ..
            }
        ),
        "{}",
        ErrorChain(&err).to_string()
    );
    assert!(rig.m().calls.is_empty());
    a.settings = VfSettings {
        mac: a.settings.mac.clone(),
        mtu: Some(1400),
        ..VfSettings::default()
    };
    a.move_rdma = false;
    let before = rig.m().world();
    rig.attach(&[a]).unwrap();
    assert!(!rig
        .m()
        .calls
        .iter()
        .any(|c| matches!(c, Call::SetVf { .. })));
    rig.detach("ctr1").unwrap();
    assert_eq!(rig.m().world(), before);
}

#[test]
fn shared_rdma_mode_is_refused_and_rolled_back() {
    let mut m = model();
    m.rdma_shared = true;
    let mut rig = Rig::new(m);
    let before = rig.m().world();
    let err = rig.attach(&[action()]).unwrap_err();
    says(&err, "rdma netns mode is shared");
    assert_eq!(rig.m().world(), before);
    // Refused before anything changed: no call to undo, no record.
    assert_eq!(rig.m().calls, Vec::new());
    assert_eq!(rig.records(), 0);
}

/// A record whose RDMA device never left the host, as an attach in shared
/// mode leaves it (refused after its netdev moved, by builds before the mode
/// was checked first): the restore moves the netdev back and leaves the RDMA
/// device alone, since the kernel refuses every move in shared mode.
#[test]
fn a_restore_in_shared_rdma_mode_leaves_the_rdma_device_alone() {
    let mut rig = Rig::new(model());
    let before = rig.m().world();
    rig.attach(&[action()]).unwrap();
    {
        let mut m = rig.m();
        m.rdma.values_mut().for_each(|dev| dev.1 = HOST);
        m.rdma_shared = true;
    }
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(rig.records(), 0);
    rig.m().rdma_shared = false;
    assert_eq!(rig.m().world(), before);
}

#[test]
fn a_later_vf_failing_undoes_the_earlier_ones() {
    let mut m = model();
    m.add_link(HOST, "ens1f0v4", "0e:00:00:00:00:04", false);
    let mut rig = Rig::new(m);
    let before = rig.m().world();
    let mut second = action();
    second.vf_bus_id = "0000:3b:02.4".parse().unwrap();
    second.host_netdev = "ens1f0v4".to_string();
    second.container_ifname = "net2".to_string();
    second.vf_index = 4; // the PF has no VF 4
    second.rdma_device = None;
    second.move_rdma = false;
    let err = rig.attach(&[action(), second]).unwrap_err();
    says(&err, "pf ens1f0 reports no vf 4");
    assert_eq!(rig.m().world(), before);
    assert_eq!(rig.records(), 0);
}

#[test]
fn a_batch_with_duplicates_is_refused() {
    let mut rig = Rig::new(model());
    let err = rig.attach(&[action(), action()]).unwrap_err();
    says(&err, "vf is listed twice");
    let mut bad = action();
    bad.container_ifname = "a/b".to_string();
    let err = rig.attach(&[bad]).unwrap_err();
    says(&err, "validate");
    assert!(rig.m().calls.is_empty());
}
