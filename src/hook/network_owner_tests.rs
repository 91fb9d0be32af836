//! Hooks-only mode: which container of a pod carries its VFs when an earlier
//! one exited or gave them back without being forgotten.

use std::path::PathBuf;

use super::*;
use crate::inventory::PciAddr;

/// The pod's VF and where its host netdev directory lives under the host root.
fn pod_vf(w: &World) -> (PciAddr, PathBuf) {
    let vf = w.fixture.expected().rdma[0].vfs[1].bus_id;
    let net = w
        .env
        .host_root
        .join("sys/bus/pci/devices")
        .join(vf.to_string())
        .join("net");
    (vf, net)
}

fn in_pod(w: &World, id: &str, pid: u32) -> State {
    w.creating(id, pid, &[("io.kubernetes.cri.sandbox-id", "sb")])
}

/// What the hook's attach leaves for a VF it moved: its saved record.
fn saved_record(w: &World, vf: PciAddr, present: bool) {
    let path = w.env.state_dir.join("vf").join(format!("{vf}.json"));
    if present {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "{}").unwrap();
    } else {
        std::fs::remove_file(path).unwrap();
    }
}

/// The pod's only container exited with its VF in the pod, and no poststop
/// ran: the next container of the pod is created after the pod's release
/// returned the VF, so it reads the VF on the host and moves it in.
#[test]
fn a_container_of_a_pod_whose_containers_exited_moves_the_vfs_in_again() {
    let w = world();
    let mut old = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(&w, "old", 7), &mut old)
        .unwrap();
    assert_eq!(old.attached.len(), 1);
    // The VF's netdev is in the pod's namespace, out of the host's sysfs.
    let (_, net) = pod_vf(&w);
    let away = net.with_extension("in-pod");
    std::fs::rename(&net, &away).unwrap();
    set_start(&w.env.roots.proc_root, 7, None);
    // The release of the exited pod brings the netdev home.
    let (from, to) = (away.clone(), net.clone());
    let mut new = FakeOs {
        meanwhile: Some(std::rc::Rc::new(move || {
            std::fs::rename(&from, &to).unwrap();
        })),
        ..FakeOs::default()
    };
    w.run(Stage::CreateRuntime, &in_pod(&w, "new", 8), &mut new)
        .unwrap();
    assert_eq!(*new.gpu_torn.borrow(), ["sb"], "the exited pod released");
    assert_eq!(new.attached.len(), 1, "the VF moved in again");
    let l = w.ledger();
    assert_eq!(l.pods["sb"].network_owner.as_deref(), Some("new"));
    assert_eq!(l.pods["sb"].containers.keys().collect::<Vec<_>>(), ["new"]);
}

/// The reap of an exited pod gives the pod's network up before its VFs go
/// home, under their release turns, as a poststop does: a container admitted
/// into the pod meanwhile finds no owner whose VFs it could run on.
#[test]
fn the_reap_gives_the_network_up_before_the_vfs_go_home() {
    let w = world();
    let (vf, net) = pod_vf(&w);
    let mut old = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(&w, "old", 7), &mut old)
        .unwrap();
    assert_eq!(w.ledger().pods["sb"].network_owner.as_deref(), Some("old"));
    let away = net.with_extension("in-pod");
    std::fs::rename(&net, &away).unwrap();
    set_start(&w.env.roots.proc_root, 7, None);
    let state_dir = w.env.state_dir.clone();
    let at_detach = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let seen = at_detach.clone();
    let mut new = FakeOs {
        on_detach: Some(std::rc::Rc::new(move || {
            let ledger = Ledger::open(&state_dir).unwrap();
            let owner = ledger.network_owner("sb").unwrap();
            // Another process's attach would wait for the turn held.
            let free = std::process::Command::new("flock")
                .args(["-n", "-x"])
                .arg(
                    state_dir
                        .join("release-locks")
                        .join(format!("vf_{vf}.lock")),
                )
                .arg("true")
                .status()
                .unwrap()
                .success();
            seen.borrow_mut().push((owner, free));
            std::fs::rename(&away, &net).unwrap();
        })),
        ..FakeOs::default()
    };
    w.run(Stage::CreateRuntime, &in_pod(&w, "new", 8), &mut new)
        .unwrap();
    assert_eq!(*new.detached.borrow(), ["old"]);
    assert_eq!(*at_detach.borrow(), [(None, false)], "owner, turn free");
    assert_eq!(*new.gpu_torn.borrow(), ["sb"], "the exited pod released");
    assert_eq!(w.ledger().pods["sb"].network_owner.as_deref(), Some("new"));
}

/// An owner whose VFs are in the pod keeps the network; one whose VFs are
/// back on the host (its poststop restored them and died before forgetting
/// it) hands it to the next container created, which moves them in.
#[test]
fn an_owner_whose_vfs_are_home_hands_the_network_over() {
    let w = world();
    let (vf, _) = pod_vf(&w);
    let mut a1 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(&w, "a1", 7), &mut a1)
        .unwrap();
    saved_record(&w, vf, true);
    let mut b1 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(&w, "b1", 8), &mut b1)
        .unwrap();
    assert!(b1.attached.is_empty(), "the live owner keeps the VFs");
    assert_eq!(w.ledger().pods["sb"].network_owner.as_deref(), Some("a1"));

    saved_record(&w, vf, false);
    let mut a2 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(&w, "a2", 9), &mut a2)
        .unwrap();
    assert_eq!(a2.attached.len(), 1, "the VFs moved in again");
    let l = w.ledger();
    let sb = &l.pods["sb"];
    assert_eq!(sb.network_owner.as_deref(), Some("a2"));
    assert_eq!(sb.containers.len(), 3);
}

/// The owner's attach was cut after the move (its hook killed: podman runs
/// no poststop for a container it did not create), its record still says
/// so, while another container of the pod lives on. While the owner's init
/// lives (its hook may be at work), the next container leaves the VF alone;
/// once it is gone, the next container restores the owner's VF and takes
/// the network over, moving it in whole.
#[test]
fn an_exited_owner_whose_attach_was_cut_hands_over_its_vfs_restored() {
    let w = world();
    let (vf, net, away, store) = owner_cut(&w);

    let mut c1 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(&w, "c1", 9), &mut c1)
        .unwrap();
    assert!(
        c1.detached.borrow().is_empty(),
        "a live owner's vf left alone"
    );
    assert_eq!(w.ledger().pods["sb"].network_owner.as_deref(), Some("a1"));

    set_start(&w.env.roots.proc_root, 7, None);
    set_start(&w.env.roots.proc_root, 10, Some(1010));
    let mut d1 = FakeOs {
        on_detach: Some(std::rc::Rc::new(move || {
            std::fs::rename(&away, &net).unwrap();
            store.remove(vf).unwrap();
        })),
        ..FakeOs::default()
    };
    w.run(Stage::CreateRuntime, &in_pod(&w, "d1", 10), &mut d1)
        .unwrap();
    assert_eq!(*d1.detached.borrow(), ["a1"], "the owner's vf restored");
    assert_eq!(d1.attached.len(), 1, "and moved in again");
    assert_eq!(w.ledger().pods["sb"].network_owner.as_deref(), Some("d1"));
}

/// An exited owner's hook may still be at work (its runtime gone): it holds
/// the VFs' release turns, which the next container waits for before it
/// looks. Here that attach finishes meanwhile, so the VF is shared as it is.
#[test]
fn an_exited_owners_attach_at_work_is_waited_for() {
    let w = world();
    let (vf, _, _, store) = owner_cut(&w);
    set_start(&w.env.roots.proc_root, 7, None);
    let ledger = Ledger::open(&w.env.state_dir).unwrap();
    let turn = ledger.lock_vfs(&[vf]).unwrap();
    std::thread::scope(|s| {
        let next = s.spawn(|| {
            let mut c1 = FakeOs::default();
            let out = w.run(Stage::CreateRuntime, &in_pod(&w, "c1", 9), &mut c1);
            (out.map_err(|e| e.to_string()), c1.detached.take())
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!next.is_finished(), "the next container waits");
        let mut rec = store.load(vf).unwrap().unwrap();
        rec.attaching = false;
        store.save(&rec).unwrap();
        drop(turn);
        let (out, detached) = next.join().unwrap();
        assert!(out.is_ok(), "{out:?}");
        assert!(detached.is_empty(), "a finished attach left alone");
    });
    assert_eq!(w.ledger().pods["sb"].network_owner.as_deref(), Some("a1"));
}

/// A pod whose owner a1 (init 7) moved its VF and whose b1 (init 8) shares
/// it, a1's attach then found cut: the VF, its host netdev's place and
/// where it went, and the store holding a1's record.
fn owner_cut(w: &World) -> (PciAddr, PathBuf, PathBuf, crate::netdev::SavedStore) {
    let (vf, net) = pod_vf(w);
    let mut a1 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(w, "a1", 7), &mut a1)
        .unwrap();
    // What a1's hook did: the record saved, the netdev moved.
    let store = crate::netdev::SavedStore::new(&w.env.state_dir);
    let mut rec = crate::netdev::SavedVf::example("a1", &vf.to_string());
    store.save(&rec).unwrap();
    let away = net.with_extension("in-pod");
    std::fs::rename(&net, &away).unwrap();
    let mut b1 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(w, "b1", 8), &mut b1)
        .unwrap();
    assert!(b1.attached.is_empty(), "b1 shares a1's network");
    // It was cut before it finished.
    rec.attaching = true;
    store.save(&rec).unwrap();
    (vf, net, away, store)
}
