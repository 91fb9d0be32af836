//! The worker that finishes a VF restore: on fixture hosts and on real
//! veths in real network namespaces.

use std::process::{Child, Command};

use super::super::workers::tests::eventually;
use super::*;
use crate::netdev::saved::SavedNetns;
use crate::netdev::{NetnsId, SavedStore, SavedVf};

/// The ledger in `state_dir` with pod `sandbox` claiming `vfs`, whose
/// network `owner` owns.
fn owned_by(state_dir: &std::path::Path, owner: &str, vfs: &[PciAddr]) {
    let ledger = Ledger::open(state_dir).unwrap();
    let pod = crate::ledger::tests::pod("sandbox");
    let record = crate::ledger::tests::record(owner);
    let claims: Vec<crate::ledger::Claim> = vfs
        .iter()
        .map(|vf| crate::ledger::Claim {
            device: crate::ledger::DeviceId::Vf(*vf),
            share: crate::ledger::Share::Exclusive,
            pf: None,
        })
        .collect();
    ledger.admit(&pod, &claims, owner, record, true).unwrap();
    assert_eq!(
        ledger.network_owner("sandbox").unwrap().as_deref(),
        Some(owner)
    );
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// An attach at work when the plan read its record holds the VF's
/// release turn: the worker waits for it, and once the attach finished
/// leaves the VF alone. (A restore would first mark the record.)
#[test]
fn an_attach_at_work_is_waited_for_and_left_once_it_finished() {
    let dir = tempfile::tempdir().unwrap();
    let saved = SavedStore::new(dir.path());
    let vf: PciAddr = "0000:ee:09.4".parse().unwrap();
    let mut rec = SavedVf::example("c1", &vf.to_string());
    rec.attaching = true;
    saved.save(&rec).unwrap();
    owned_by(dir.path(), "c1", &[vf]);
    let ledger = Ledger::open(dir.path()).unwrap();
    let turn = ledger.lock_vfs(&[vf]).unwrap();
    let finish = OnWorker::new(dir.path().to_path_buf(), PathBuf::from("/"));
    finish.finish("sandbox", "c1", &[vf]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(finish.0.running().contains("c1"), "the worker waits");
    assert_eq!(saved.load(vf).unwrap().as_ref(), Some(&rec), "untouched");
    rec.attaching = false;
    saved.save(&rec).unwrap();
    drop(turn);
    eventually("c1's worker done", || !finish.0.running().contains("c1"));
    assert_eq!(saved.load(vf).unwrap(), Some(rec), "no restore began");
}

/// On a fixture host: c1's VF away (its netdev gone from the host's
/// sysfs) beside a VF of the pod whose netdev is on the host with
/// another container's record (its restore failed after the netdev came
/// home): the pod is split, so c1's VF is restored (the restore marks
/// its record, then fails here, with no such link). With that VF away
/// too, nothing is.
#[test]
fn a_vf_on_the_host_with_a_record_splits_the_pod() {
    for (other_home, restored) in [(true, true), (false, false)] {
        let dir = tempfile::tempdir().unwrap();
        let fixture = crate::fixture::HostRootBuilder::hgx()
            .build(&dir.path().join("host"))
            .unwrap();
        let nic = &fixture.expected().rdma[0];
        let (mine, other) = (nic.vfs[0].bus_id, nic.vfs[1].bus_id);
        let saved = SavedStore::new(&dir.path().join("state"));
        for (vf, container, home) in [(mine, "c1", false), (other, "c0", other_home)] {
            let mut rec = SavedVf::example(container, &vf.to_string());
            rec.host.name = format!("dgnone-{container}");
            rec.attach.host_netdev = rec.host.name.clone();
            rec.attach.container_ifname = "dgnone-pod".into();
            rec.host.mac = "02:00:00:0d:0e:0f".parse().ok();
            rec.restoring = container == "c0";
            saved.save(&rec).unwrap();
            if !home {
                let net = fixture
                    .root()
                    .join("sys/bus/pci/devices")
                    .join(vf.to_string())
                    .join("net");
                std::fs::remove_dir_all(net).unwrap();
            }
        }
        owned_by(&dir.path().join("state"), "c1", &[mine, other]);
        let finish = OnWorker::new(dir.path().join("state"), fixture.root().to_path_buf());
        finish.finish("sandbox", "c1", &[mine, other]);
        eventually("c1's worker done", || !finish.0.running().contains("c1"));
        let rec = saved.load(mine).unwrap().unwrap();
        assert_eq!(rec.restoring, restored, "other home: {other_home}");
    }
}

/// A veth standing in for a VF, and a process alone in a fresh netns
/// standing in for the pod; both gone on drop.
struct Scene {
    pod: Child,
    host: &'static str,
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = self.pod.kill();
        let _ = self.pod.wait();
        ip(&["link", "del", self.host]);
    }
}

/// On a real kernel: the VF's netdev was moved into the pod as `net1`,
/// and its restore began (the record says so) and stopped there. The
/// worker finishes it: the netdev is home under its own name, the
/// record gone.
#[test]
fn a_half_restored_vf_comes_home() {
    half_done_vf_comes_home("dgfin0v", "dgfin0p", |_, _, rec| {
        rec.restoring = true;
        vec![rec.vf()]
    });
}

/// The same for an attach cut after the move (the runtime died during
/// createRuntime): its record still says `attaching`. While the record
/// says the attach finished (it was at work when the plan read it), the
/// worker leaves it.
#[test]
fn a_half_attached_vf_comes_home() {
    half_done_vf_comes_home("dgfin1v", "dgfin1p", |_, _, rec| {
        rec.attaching = true;
        vec![rec.vf()]
    });
}

/// A VF moved whole into a pod whose other VF is on the host with no
/// record (a restore, or an attach, cut between the two) comes home.
#[test]
fn a_vf_in_a_pod_whose_other_vf_is_home_comes_home() {
    half_done_vf_comes_home("dgfin2v", "dgfin2p", |_, _, rec| {
        vec![rec.vf(), "0000:ee:09.2".parse().unwrap()]
    });
}

/// A VF moved whole comes home beside one of the same attach that was
/// cut (here its netdev is nowhere to be found, so its own restore
/// fails and keeps its record).
#[test]
fn a_vf_beside_a_cut_one_comes_home() {
    half_done_vf_comes_home("dgfin3v", "dgfin3p", |_, saved, rec| {
        let mut other = SavedVf::example("c1", "0000:ee:09.3");
        other.attach.host_netdev = "dgnone3".into();
        other.host.name = "dgnone3".into();
        other.attaching = true;
        saved.save(&other).unwrap();
        vec![rec.vf(), other.vf()]
    });
}

/// A VF moved whole whose container no longer owns the pod's network:
/// its poststop gave the network up and was killed before its restore
/// began (the record not yet marked). No container may use it; it comes
/// home.
#[test]
fn a_vf_whose_owner_gave_the_network_up_comes_home() {
    half_done_vf_comes_home("dgfin4v", "dgfin4p", |state_dir, _, rec| {
        let ledger = Ledger::open(state_dir).unwrap();
        ledger.give_up_network("c1").unwrap();
        assert_eq!(ledger.network_owner("sandbox").unwrap(), None);
        vec![rec.vf()]
    });
}

/// `leave` makes what a run cut part way leaves of the VF moved into a
/// pod (its record), of the pod's other VFs and of the ledger in the
/// state directory: the pod's VFs.
fn half_done_vf_comes_home(
    host: &'static str,
    peer: &str,
    leave: fn(&std::path::Path, &SavedStore, &mut SavedVf) -> Vec<PciAddr>,
) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: it moves links between namespaces"
    );
    let me = std::fs::read_link("/proc/self/ns/net").unwrap();
    let pod = Command::new("unshare")
        .args(["-n", "sleep", "600"])
        .spawn()
        .unwrap();
    let ns_path = PathBuf::from(format!("/proc/{}/ns/net", pod.id()));
    eventually("the pod in its own netns", || {
        std::fs::read_link(&ns_path).is_ok_and(|l| l != me)
    });
    let scene = Scene { pod, host };
    ip(&["link", "del", scene.host]);
    assert!(ip(&[
        "link", "add", scene.host, "type", "veth", "peer", "name", peer
    ]));
    assert!(ip(&[
        "link",
        "set",
        scene.host,
        "address",
        "02:00:00:0a:09:01"
    ]));
    let index: u32 = std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", scene.host))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pid = scene.pod.id().to_string();
    assert!(ip(&[
        "link", "set", scene.host, "netns", &pid, "name", "net1"
    ]));

    let dir = tempfile::tempdir().unwrap();
    let vf: PciAddr = "0000:ee:09.1".parse().unwrap();
    let mut rec = SavedVf::example("c1", &vf.to_string());
    rec.attach.host_netdev = scene.host.to_string();
    rec.host.name = scene.host.to_string();
    rec.host.index = index;
    rec.host.mac = "02:00:00:0a:09:01".parse().ok();
    let ns = std::fs::metadata(&ns_path).unwrap();
    rec.netns = SavedNetns {
        id: NetnsId {
            dev: std::os::unix::fs::MetadataExt::dev(&ns),
            ino: std::os::unix::fs::MetadataExt::ino(&ns),
        },
        path: Some(ns_path),
    };
    let saved = SavedStore::new(dir.path());
    saved.save(&rec).unwrap();
    owned_by(dir.path(), "c1", &[vf]);
    let finish = OnWorker::new(dir.path().to_path_buf(), PathBuf::from("/"));
    // A whole record, as a finished attach leaves it, is kept while its
    // container owns the pod's network.
    finish.finish("sandbox", "c1", &[vf]);
    eventually("c1's worker done", || !finish.0.running().contains("c1"));
    assert!(saved.has_record(vf), "a finished attach's record kept");
    let vfs = leave(dir.path(), &saved, &mut rec);
    saved.save(&rec).unwrap();

    // Only the container whose run was cut: another's record is kept.
    finish.finish("sandbox", "c0", &vfs);
    eventually("c0's worker done", || !finish.0.running().contains("c0"));
    assert!(saved.has_record(vf), "another container's record kept");
    finish.finish("sandbox", "c1", &vfs);
    eventually("c1's worker done", || !finish.0.running().contains("c1"));
    assert!(
        std::path::Path::new("/sys/class/net")
            .join(scene.host)
            .exists(),
        "home under its own name"
    );
    assert!(!saved.has_record(vf), "its record gone");
}
