//! Hooks-only mode: a network owner that stops while another container of
//! its pod runs in the pod's namespace leaves the VFs there, and the pod's
//! last poststop brings them home with the owner's record.

use std::cell::Cell;
use std::path::PathBuf;

use super::*;
use crate::netdev::{SavedStore, SavedVf};

/// The pod's namespace, as [`SavedVf::example`] records it.
const POD_NS: u64 = 4026532000;

/// A CRI-O container of pod "sb" carrying the world's allocation.
fn in_pod(w: &World, id: &str, pid: u32) -> State {
    let keys = [
        ("io.kubernetes.cri-o.SandboxID", "sb"),
        ("io.kubernetes.pod.namespace", "ns"),
        ("io.kubernetes.pod.name", "p"),
    ];
    w.creating(id, pid, &keys)
}

fn stopped(id: &str) -> State {
    state(id, "stopped", None, &[])
}

/// Puts `pid` of the world's procfs in the namespace `ino`.
fn in_netns(w: &World, pid: u32, ino: u64) {
    let ns = w.env.roots.proc_root.join(pid.to_string()).join("ns");
    std::fs::create_dir_all(&ns).unwrap();
    let _ = std::fs::remove_file(ns.join("net"));
    std::os::unix::fs::symlink(format!("net:[{ino}]"), ns.join("net")).unwrap();
}

/// A fake container side whose restores remove the saved records.
fn restoring(w: &World) -> FakeOs {
    FakeOs {
        store: Some(SavedStore::new(&w.env.state_dir)),
        ..FakeOs::default()
    }
}

/// Owner "a1" (init 7) moved the pod's VF into the pod's namespace and
/// "b1" (init 8) runs beside it there; the store holding a1's record.
fn pod_of_two(w: &World) -> SavedStore {
    for pid in [7, 8] {
        in_netns(w, pid, POD_NS);
    }
    let mut a1 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(w, "a1", 7), &mut a1)
        .unwrap();
    assert_eq!(a1.attached.len(), 1);
    let vf = w.fixture.expected().rdma[0].vfs[1].bus_id;
    let store = SavedStore::new(&w.env.state_dir);
    store
        .save(&SavedVf::example("a1", &vf.to_string()))
        .unwrap();
    let mut b1 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(w, "b1", 8), &mut b1)
        .unwrap();
    assert!(b1.attached.is_empty(), "b1 shares a1's network");
    store
}

#[test]
fn an_owner_leaves_its_vfs_to_a_container_still_running_until_the_last_stops() {
    let w = world();
    let store = pod_of_two(&w);
    set_start(&w.env.roots.proc_root, 7, None);
    let mut os = restoring(&w);
    let out = w.run(Stage::Poststop, &stopped("a1"), &mut os).unwrap();
    assert!(matches!(out, Outcome::Nothing), "{out:?}");
    assert!(os.detached.borrow().is_empty(), "the VF stays for b1");
    let l = w.ledger();
    assert_eq!(l.pods["sb"].network_owner.as_deref(), Some("a1"));
    assert_eq!(l.pods["sb"].containers.len(), 2);
    assert_eq!(store.for_container("a1").unwrap().len(), 1);

    set_start(&w.env.roots.proc_root, 8, None);
    let mut os = restoring(&w);
    let out = w.run(Stage::Poststop, &stopped("b1"), &mut os).unwrap();
    assert!(released_pod(&out), "{out:?}");
    assert_eq!(*os.detached.borrow(), ["b1", "a1"], "a1's VF restored");
    assert!(store.all().unwrap().is_empty());
    assert_eq!(*os.gpu_torn.borrow(), ["sb"]);
    assert!(w.ledger().pods.is_empty(), "the pod released");
}

/// Where nothing of the pod is seen running beside the owner in the VFs'
/// namespace, its poststop restores them as it always did.
#[test]
fn an_owner_restores_its_vfs_when_no_other_container_is_seen_running() {
    type Change = fn(&World, &SavedStore);
    let cases: &[(&str, Change)] = &[
        ("b1 exited", |w, _| {
            set_start(&w.env.roots.proc_root, 8, None)
        }),
        ("b1 in another namespace", |w, _| in_netns(w, 8, POD_NS + 1)),
        ("b1's pid is another process's", |w, _| {
            set_start(&w.env.roots.proc_root, 8, Some(5))
        }),
        ("a1's VF left part way", |_, store| {
            let mut rec = store.for_container("a1").unwrap().remove(0);
            rec.restoring = true;
            store.save(&rec).unwrap();
        }),
    ];
    for (what, change) in cases {
        let w = world();
        let store = pod_of_two(&w);
        set_start(&w.env.roots.proc_root, 7, None);
        change(&w, &store);
        let mut os = restoring(&w);
        w.run(Stage::Poststop, &stopped("a1"), &mut os).unwrap();
        assert_eq!(*os.detached.borrow(), ["a1"], "{what}");
        assert!(store.all().unwrap().is_empty(), "{what}");
        let l = w.ledger();
        assert_eq!(l.pods["sb"].network_owner, None, "{what}");
        assert!(!l.pods["sb"].containers.contains_key("a1"), "{what}");
    }
}

/// A container created in the pod after the owner stopped finds the VF in
/// the namespace and keeps it there past the stop of the one before it.
#[test]
fn a_container_created_after_the_owner_stopped_keeps_the_vfs() {
    let w = world();
    let store = pod_of_two(&w);
    set_start(&w.env.roots.proc_root, 7, None);
    w.run(Stage::Poststop, &stopped("a1"), &mut restoring(&w))
        .unwrap();
    in_netns(&w, 9, POD_NS);
    let mut c1 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(&w, "c1", 9), &mut c1)
        .unwrap();
    assert!(c1.attached.is_empty(), "the VF is in the pod already");

    set_start(&w.env.roots.proc_root, 8, None);
    let mut os = restoring(&w);
    w.run(Stage::Poststop, &stopped("b1"), &mut os).unwrap();
    assert_eq!(*os.detached.borrow(), ["b1"], "c1 still runs on the VF");
    assert_eq!(store.for_container("a1").unwrap().len(), 1);

    set_start(&w.env.roots.proc_root, 9, None);
    let mut os = restoring(&w);
    w.run(Stage::Poststop, &stopped("c1"), &mut os).unwrap();
    assert_eq!(*os.detached.borrow(), ["c1", "a1"]);
    assert!(w.ledger().pods.is_empty(), "the pod released");
}

/// `pod_of_two` with the VF's netdev away from the host (in the pod), then
/// a1 exited and started again under its id (podman's `start`) with b1
/// running: it finds the VF in the pod, and its creation failing after that
/// forgets its record but keeps it the owner, the VF being away. The
/// netdev's host directory and where it was moved.
fn owner_forgotten_with_its_vf_away(w: &World) -> (PathBuf, PathBuf) {
    pod_of_two(w);
    let vf = w.fixture.expected().rdma[0].vfs[1].bus_id;
    let pci = w.env.host_root.join("sys/bus/pci/devices");
    let net = pci.join(vf.to_string()).join("net");
    let away = net.with_extension("in-pod");
    std::fs::rename(&net, &away).unwrap();
    set_start(&w.env.roots.proc_root, 7, None);
    w.run(Stage::Poststop, &stopped("a1"), &mut restoring(w))
        .unwrap();
    in_netns(w, 9, POD_NS);
    let mut again = FakeOs {
        fail: Some("nodes"),
        ..restoring(w)
    };
    w.run(Stage::CreateRuntime, &in_pod(w, "a1", 9), &mut again)
        .unwrap_err();
    assert!(again.attached.is_empty(), "the VF is in the pod already");
    let l = w.ledger();
    assert_eq!(l.pods["sb"].network_owner.as_deref(), Some("a1"));
    assert!(!l.pods["sb"].containers.contains_key("a1"));
    (net, away)
}

/// The pod's last poststop restores a forgotten owner's VF before the
/// release, instead of releasing the pod with the VF left configured in the
/// namespace and its record holding it from every later pod.
#[test]
fn an_owner_forgotten_with_its_vfs_away_has_them_restored_by_the_last_poststop() {
    let w = world();
    owner_forgotten_with_its_vf_away(&w);
    set_start(&w.env.roots.proc_root, 8, None);
    let mut os = restoring(&w);
    let out = w.run(Stage::Poststop, &stopped("b1"), &mut os).unwrap();
    assert!(released_pod(&out), "{out:?}");
    assert_eq!(*os.detached.borrow(), ["b1", "a1"], "a1's VF restored");
    let store = SavedStore::new(&w.env.state_dir);
    assert!(store.all().unwrap().is_empty());
    assert!(w.ledger().pods.is_empty(), "the pod released");
}

/// The same where the pod's last container exited without a poststop
/// (podman runs one only at removal): the reap of exited pods at the next
/// createRuntime restores the forgotten owner's VF too.
#[test]
fn the_reap_restores_the_vfs_of_an_owner_forgotten_with_them_away() {
    let w = world();
    let (net, away) = owner_forgotten_with_its_vf_away(&w);
    set_start(&w.env.roots.proc_root, 8, None);
    in_netns(&w, 10, POD_NS + 1);
    let mut c1 = FakeOs {
        on_detach: Some(std::rc::Rc::new(move || {
            if away.exists() {
                std::fs::rename(&away, &net).unwrap();
            }
        })),
        ..restoring(&w)
    };
    w.run(Stage::CreateRuntime, &in_pod(&w, "c1", 10), &mut c1)
        .unwrap();
    assert_eq!(*c1.detached.borrow(), ["b1", "a1"], "a1's VF restored");
    assert_eq!(*c1.gpu_torn.borrow(), ["sb"], "the exited pod released");
    assert_eq!(c1.attached.len(), 1, "the VF moved in again");
}

/// A restore that fails in the reap does not keep the pod's other
/// containers' VFs from theirs: each is tried, and the pod is kept.
#[test]
fn the_reap_tries_every_containers_restore() {
    let w = world();
    owner_forgotten_with_its_vf_away(&w);
    set_start(&w.env.roots.proc_root, 8, None);
    in_netns(&w, 10, POD_NS + 1);
    let mut c1 = FakeOs {
        refuse_detach: Some("b1"),
        ..restoring(&w)
    };
    let _ = w.run(Stage::CreateRuntime, &in_pod(&w, "c1", 10), &mut c1);
    assert_eq!(*c1.detached.borrow(), ["a1"], "a1's tried after b1 failed");
    let store = SavedStore::new(&w.env.state_dir);
    assert!(store.for_container("a1").unwrap().is_empty());
    assert!(c1.gpu_torn.borrow().is_empty(), "the pod is kept");
}

/// A restore of the VFs an owner kept that fails quarantines them and keeps
/// the pod, its owner's record and claims, for the reap of exited pods. The
/// network was given up before the restore began: a container created in
/// the pod meanwhile takes it over and finishes the restore
/// ([`crate::netdev`]'s takeover of an unfinished restore).
#[test]
fn a_failed_restore_of_kept_vfs_quarantines_them_and_keeps_the_pod() {
    let w = world();
    let store = pod_of_two(&w);
    set_start(&w.env.roots.proc_root, 7, None);
    w.run(Stage::Poststop, &stopped("a1"), &mut restoring(&w))
        .unwrap();
    set_start(&w.env.roots.proc_root, 8, None);
    let mut os = FakeOs {
        refuse_detach: Some("a1"),
        ..restoring(&w)
    };
    w.run(Stage::Poststop, &stopped("b1"), &mut os).unwrap_err();
    let l = w.ledger();
    assert_eq!(l.pods["sb"].network_owner, None);
    assert!(l.pods["sb"].containers.contains_key("a1"));
    let vf = w.fixture.expected().rdma[0].vfs[1].bus_id;
    let vf_record = &l.devices[&crate::ledger::DeviceId::Vf(vf).to_string()];
    assert!(vf_record.quarantine.is_some(), "{vf_record:?}");
    assert_eq!(store.for_container("a1").unwrap().len(), 1);
    assert!(os.gpu_torn.borrow().is_empty(), "nothing released");
}

/// A record of another pod's VF that cannot be read (a newer release's, or
/// edited by hand) changes nothing of this pod's decisions: the VF stays
/// while a container of the pod runs beside it.
#[test]
fn an_unreadable_record_elsewhere_does_not_take_the_vfs_from_a_running_container() {
    let w = world();
    let store = pod_of_two(&w);
    std::fs::write(w.env.state_dir.join("vf/0000:99:00.1.json"), "{").unwrap();
    set_start(&w.env.roots.proc_root, 7, None);
    let mut os = restoring(&w);
    w.run(Stage::Poststop, &stopped("a1"), &mut os).unwrap();
    assert!(os.detached.borrow().is_empty(), "b1 runs on the VF");

    in_netns(&w, 9, POD_NS);
    w.run(
        Stage::CreateRuntime,
        &in_pod(&w, "c1", 9),
        &mut FakeOs::default(),
    )
    .unwrap();
    set_start(&w.env.roots.proc_root, 8, None);
    let mut os = restoring(&w);
    w.run(Stage::Poststop, &stopped("b1"), &mut os).unwrap();
    assert_eq!(*os.detached.borrow(), ["b1"], "c1 runs on the VF");
    assert_eq!(store.for_container("a1").unwrap().len(), 1);
    assert_eq!(w.ledger().pods["sb"].network_owner.as_deref(), Some("a1"));
}

/// A container whose creation fails after its admission held the VFs in
/// place while its init ran: with no other container of the pod running
/// in their namespace, its failure gives them back and forgets their owner.
#[test]
fn a_creation_failing_after_its_admission_gives_back_vfs_kept_for_no_one() {
    let w = world();
    let store = pod_of_two(&w);
    set_start(&w.env.roots.proc_root, 7, None);
    w.run(Stage::Poststop, &stopped("a1"), &mut restoring(&w))
        .unwrap();
    // b1 runs on, but no longer in the pod's namespace.
    in_netns(&w, 8, POD_NS + 1);
    in_netns(&w, 9, POD_NS);
    let mut os = FakeOs {
        fail: Some("nodes"),
        ..restoring(&w)
    };
    w.run(Stage::CreateRuntime, &in_pod(&w, "s1", 9), &mut os)
        .unwrap_err();
    assert_eq!(*os.detached.borrow(), ["a1"]);
    assert!(store.all().unwrap().is_empty());
    let l = w.ledger();
    assert_eq!(l.pods["sb"].network_owner, None);
    assert_eq!(l.pods["sb"].containers.keys().collect::<Vec<_>>(), ["b1"]);
}

/// Stops b1 while a1 runs (b1 moved nothing), then ends a1's init: a1's
/// poststop is next, with nothing of the pod running beside its VF.
fn owner_alone_and_exited(w: &World) -> SavedStore {
    let store = pod_of_two(w);
    set_start(&w.env.roots.proc_root, 8, None);
    w.run(Stage::Poststop, &stopped("b1"), &mut restoring(w))
        .unwrap();
    set_start(&w.env.roots.proc_root, 7, None);
    in_netns(w, 9, POD_NS);
    store
}

/// createRuntime of "c1" (init 9) at the checkpoint `at` of another hook;
/// how many VFs it moved in, once it ran.
fn admit_c1_at<'w>(
    w: &'w World,
    at: &'static str,
    moved: &'w Cell<Option<usize>>,
) -> impl Fn(&'static str) + 'w {
    move |name| {
        if name == at && moved.get().is_none() {
            let mut c1 = FakeOs::default();
            w.run(Stage::CreateRuntime, &in_pod(w, "c1", 9), &mut c1)
                .unwrap();
            moved.set(Some(c1.attached.len()));
        }
    }
}

/// A container admitted into the pod between the owner's first look and its
/// decision under the VFs' turns keeps the VF in the pod: the owner's
/// poststop gives nothing up, and the joiner's own stop brings it home.
#[test]
fn a_container_admitted_while_the_owner_stops_keeps_the_vfs() {
    let w = world();
    let store = owner_alone_and_exited(&w);
    let moved = Cell::new(None);
    let mut os = restoring(&w);
    let at_turns = admit_c1_at(&w, "restore-turns", &moved);
    let out = w
        .run_with(Stage::Poststop, &stopped("a1"), &mut os, &at_turns)
        .unwrap();
    assert_eq!(moved.get(), Some(0), "c1 joins a1's network");
    assert!(matches!(out, Outcome::Nothing), "{out:?}");
    assert!(os.detached.borrow().is_empty(), "the VF stays for c1");
    let l = w.ledger();
    assert_eq!(l.pods["sb"].network_owner.as_deref(), Some("a1"));
    assert!(l.pods["sb"].containers.contains_key("a1"));
    assert_eq!(store.for_container("a1").unwrap().len(), 1);

    set_start(&w.env.roots.proc_root, 9, None);
    let mut os = restoring(&w);
    let out = w.run(Stage::Poststop, &stopped("c1"), &mut os).unwrap();
    assert!(released_pod(&out), "{out:?}");
    assert_eq!(*os.detached.borrow(), ["c1", "a1"], "a1's VF restored");
    assert!(store.all().unwrap().is_empty());
}

/// A container admitted once the owner gave the network up finds no owner:
/// it takes the network over (its hook moves the VF in once it is home)
/// instead of starting beside a VF on its way out.
#[test]
fn a_container_admitted_after_the_owner_gave_up_takes_the_network() {
    let w = world();
    let store = owner_alone_and_exited(&w);
    let moved = Cell::new(None);
    let mut os = restoring(&w);
    let at_restore = admit_c1_at(&w, "fake-detached", &moved);
    w.run_with(Stage::Poststop, &stopped("a1"), &mut os, &at_restore)
        .unwrap();
    assert_eq!(moved.get(), Some(1), "c1 moves the VF in");
    assert_eq!(*os.detached.borrow(), ["a1"]);
    assert!(store.for_container("a1").unwrap().is_empty());
    let l = w.ledger();
    assert_eq!(l.pods["sb"].network_owner.as_deref(), Some("c1"));
    assert!(!l.pods["sb"].containers.contains_key("a1"), "a1 forgotten");
}

/// The owner's own restore failing after it gave the network up quarantines
/// the VF and keeps the owner's record for a later release; the pod's next
/// container takes the network over (its hook finishes that restore before
/// it moves the VF in) rather than join a network on its way out.
#[test]
fn a_failed_restore_of_the_owners_vfs_leaves_the_network_to_the_next_container() {
    let w = world();
    let store = owner_alone_and_exited(&w);
    let mut os = FakeOs {
        refuse_detach: Some("a1"),
        ..restoring(&w)
    };
    w.run(Stage::Poststop, &stopped("a1"), &mut os).unwrap_err();
    let l = w.ledger();
    assert_eq!(l.pods["sb"].network_owner, None);
    assert!(
        l.pods["sb"].containers.contains_key("a1"),
        "kept for a release"
    );
    let vf = w.fixture.expected().rdma[0].vfs[1].bus_id;
    let vf_record = &l.devices[&crate::ledger::DeviceId::Vf(vf).to_string()];
    assert!(vf_record.quarantine.is_some(), "{vf_record:?}");
    assert_eq!(store.for_container("a1").unwrap().len(), 1);

    let mut c1 = FakeOs::default();
    w.run(Stage::CreateRuntime, &in_pod(&w, "c1", 9), &mut c1)
        .unwrap();
    assert_eq!(c1.attached.len(), 1, "c1 moves the VF in");
    assert_eq!(w.ledger().pods["sb"].network_owner.as_deref(), Some("c1"));
}

/// A poststop whose config cannot be read does its network part all the
/// same: the owner leaves its VF to a container still running beside it,
/// and that container's poststop, its config still unreadable, brings the
/// VF home; the claims stay for a release with a config.
#[test]
fn a_poststop_without_its_config_keeps_and_restores_vfs_as_with_it() {
    let w = world();
    let store = pod_of_two(&w);
    let leave = |id: &str, os: &mut FakeOs| {
        let defaults = Config::default();
        let mut run = HooksOnly {
            env: &w.env,
            config: &defaults,
            os,
            checkpoint: &|_| {},
            reap_until: w.reap_until,
        };
        crate::hook::release::leave_without_config(&mut run, &stopped(id));
    };
    set_start(&w.env.roots.proc_root, 7, None);
    let mut os = restoring(&w);
    leave("a1", &mut os);
    assert!(os.detached.borrow().is_empty(), "the VF stays for b1");
    assert_eq!(store.for_container("a1").unwrap().len(), 1);

    set_start(&w.env.roots.proc_root, 8, None);
    let mut os = restoring(&w);
    leave("b1", &mut os);
    assert_eq!(*os.detached.borrow(), ["b1", "a1"], "a1's VF restored");
    assert!(store.all().unwrap().is_empty());
    assert!(!w.ledger().pods["sb"].claims.is_empty(), "claims kept");
}
