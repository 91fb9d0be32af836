//! Release in hooks-only mode: GPU teardown with the pod's last container,
//! quarantine when a restore or teardown fails, and pods whose containers
//! exited without a poststop released at the next createRuntime.

use super::*;
use crate::ledger::DeviceId;

fn created(w: &World, id: &str, pid: u32) -> FakeOs {
    let mut os = FakeOs::default();
    w.create_runtime(id, pid, &mut os).unwrap();
    os
}

/// Created, then its init exited: what a poststop or a reap finds.
fn exited(w: &World, id: &str, pid: u32) -> FakeOs {
    let os = created(w, id, pid);
    set_start(&w.env.roots.proc_root, pid, None);
    os
}

fn stopped(id: &str) -> State {
    state(id, "stopped", None, &[])
}

fn quarantined(w: &World) -> Vec<DeviceId> {
    w.ledger()
        .devices
        .into_values()
        .filter(|d| d.quarantine.is_some())
        .map(|d| d.device)
        .collect()
}

#[test]
fn the_last_container_releases_after_the_gpu_teardown() {
    let w = world();
    let mut os = created(&w, "c1", 7);
    let init = w.ledger().pods["c1"].containers["c1"].init;
    assert_eq!(
        init,
        Some(crate::ledger::InitProcess {
            pid: 7,
            start_ticks: 1007
        })
    );
    assert!(os.gpu_torn.borrow().is_empty());
    w.run(Stage::Poststop, &stopped("c1"), &mut os).unwrap();
    assert_eq!(*os.gpu_torn.borrow(), ["c1"]);
    assert!(w.ledger().pods.is_empty());
}

#[test]
fn a_failed_gpu_teardown_keeps_the_claims_and_quarantines() {
    let w = world();
    created(&w, "c1", 7);
    let mut os = FakeOs {
        fail: Some("gpu"),
        ..FakeOs::default()
    };
    let e = w.run(Stage::Poststop, &stopped("c1"), &mut os).unwrap_err();
    assert!(
        e.to_string().contains("open outside the released pod"),
        "{e}"
    );
    let l = w.ledger();
    assert_eq!(l.pods["c1"].claims.len(), 2);
    assert_eq!(quarantined(&w).len(), 2, "{l:?}");
    // Kept, so that the reap of exited pods retries the release.
    assert!(l.pods["c1"].containers.contains_key("c1"), "{l:?}");
}

#[test]
fn a_failed_vf_restore_quarantines_the_vf_and_keeps_the_record() {
    let w = world();
    created(&w, "c1", 7);
    let mut os = FakeOs {
        fail: Some("detach"),
        ..FakeOs::default()
    };
    let e = w.run(Stage::Poststop, &stopped("c1"), &mut os).unwrap_err();
    assert!(e.to_string().contains("fake detach failure"), "{e}");
    let l = w.ledger();
    assert!(l.pods["c1"].containers.contains_key("c1"));
    let q = quarantined(&w);
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(matches!(q[0], DeviceId::Vf(_)), "{q:?}");
    assert!(os.gpu_torn.borrow().is_empty());
    // The next pod cannot get the VF.
    let mut other = FakeOs::default();
    let e = w.create_runtime("c2", 8, &mut other).unwrap_err();
    assert!(
        e.to_string().contains("quarantined") || e.to_string().contains("held"),
        "{e}"
    );
}

#[test]
fn pods_whose_inits_exited_are_released_at_the_next_create() {
    let w = world();
    created(&w, "a", 7);
    // Alive: the next pod asking for the same devices is refused.
    let mut b = FakeOs::default();
    let e = w.create_runtime("b", 8, &mut b).unwrap_err();
    assert!(e.to_string().contains("is held by pod"), "{e}");
    assert!(b.detached.borrow().is_empty() && b.gpu_torn.borrow().is_empty());

    // Pid 7 reused by another process: a's init is gone, no poststop ran.
    set_start(&w.env.roots.proc_root, 7, Some(5));
    let mut b = FakeOs::default();
    w.create_runtime("b", 8, &mut b).unwrap();
    assert_eq!(*b.detached.borrow(), ["a"], "a's VFs restored");
    assert_eq!(*b.gpu_torn.borrow(), ["a"], "a's GPU torn down");
    let l = w.ledger();
    assert!(
        !l.pods.contains_key("a") && l.pods.contains_key("b"),
        "{l:?}"
    );

    // Exited outright (no /proc entry): released the same way.
    set_start(&w.env.roots.proc_root, 8, None);
    let mut c = FakeOs::default();
    w.create_runtime("c", 9, &mut c).unwrap();
    assert_eq!(*c.detached.borrow(), ["b"]);
    assert_eq!(w.ledger().pods.keys().collect::<Vec<_>>(), ["c"]);
}

#[test]
fn records_without_a_known_init_are_never_stale() {
    let w = world();
    // Pid 5 has no stat: its init cannot be identified.
    created(&w, "a", 5);
    assert_eq!(w.ledger().pods["a"].containers["a"].init, None);
    let mut b = FakeOs::default();
    let e = w.create_runtime("b", 8, &mut b).unwrap_err();
    assert!(e.to_string().contains("is held by pod"), "{e}");
}

#[test]
fn a_container_admitted_into_a_stale_pod_during_its_release_keeps_it() {
    let w = world();
    let alloc = w.allocation();
    let pod_ann = |id: &str| {
        state(
            id,
            "creating",
            Some(7),
            &[
                (DEVICE_ALLOCATED, alloc.as_str()),
                ("io.kubernetes.cri.sandbox-id", "sb"),
            ],
        )
    };
    let mut first = FakeOs::default();
    w.run(Stage::CreateRuntime, &pod_ann("old"), &mut first)
        .unwrap();
    set_start(&w.env.roots.proc_root, 7, None);
    // While the stale pod's GPU is torn down, another hook of the pod (past
    // its own reaping) admits a new container with the pod's claims.
    let dir = w.env.state_dir.clone();
    let admit_new = move || {
        let l = Ledger::open(&dir).unwrap();
        let held = l.snapshot().unwrap().pods["sb"].clone();
        let record = crate::ledger::ContainerRecord {
            name: String::new(),
            devices: Vec::new(),
            applied_unix: 1,
            init: None,
            cgroups: Vec::new(),
            resolved: None,
            resolved_sha256: None,
            hooks_only: true,
        };
        l.admit(&held.pod, &held.claims, "new", record, true)
            .unwrap();
    };
    let mut other = FakeOs {
        meanwhile: Some(std::rc::Rc::new(admit_new)),
        ..FakeOs::default()
    };
    let e = w.create_runtime("x", 8, &mut other).unwrap_err();
    assert!(e.to_string().contains("is held by pod"), "{e}");
    assert_eq!(*other.gpu_torn.borrow(), ["sb"]);
    let l = w.ledger();
    let sb = &l.pods["sb"];
    assert_eq!(sb.claims.len(), 2, "{l:?}");
    assert_eq!(sb.containers.keys().collect::<Vec<_>>(), ["new"]);
    // The reap gave the exited owner's network up before its VFs went home:
    // the container admitted after them takes it over, to move them in.
    assert_eq!(sb.network_owner.as_deref(), Some("new"));
    assert!(!l.pods.contains_key("x"));
    assert!(quarantined(&w).is_empty(), "{l:?}");
}

const LONG_ID: &str = "4f1c0e6a9b2d4e8f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f";

#[test]
fn the_containers_cgroups_reach_the_gpu_teardown() {
    let w = world();
    w.set_cgroup(
        7,
        &format!("5:devices:/libpod_parent/libpod-{LONG_ID}\n0::/libpod_parent/libpod-{LONG_ID}\n"),
    );
    let mut os = created(&w, LONG_ID, 7);
    let own = vec![format!("/libpod_parent/libpod-{LONG_ID}")];
    assert_eq!(w.ledger().pods[LONG_ID].containers[LONG_ID].cgroups, own);
    w.run(Stage::Poststop, &stopped(LONG_ID), &mut os).unwrap();
    assert_eq!(
        *os.teardowns.borrow(),
        [TornDown {
            sandbox_id: LONG_ID.to_string(),
            cgroups: own.clone(),
        }]
    );
    assert!(w.ledger().pods.is_empty());

    // A stale pod's teardown gets them too.
    w.set_cgroup(
        8,
        &format!("0::/machine.slice/libpod-{LONG_ID}.scope/container\n"),
    );
    created(&w, LONG_ID, 8);
    set_start(&w.env.roots.proc_root, 8, None);
    let next = created(&w, "next", 9);
    let torn = next.teardowns.borrow_mut().remove(0);
    assert_eq!(
        torn.cgroups,
        [format!("/machine.slice/libpod-{LONG_ID}.scope")]
    );
    assert_eq!(w.ledger().pods.keys().collect::<Vec<_>>(), ["next"]);
}

#[test]
fn unreadable_cgroups_are_recorded_as_none() {
    let w = world();
    // Pid 7 has a stat but no cgroup file.
    let mut os = created(&w, LONG_ID, 7);
    assert!(w.ledger().pods[LONG_ID].containers[LONG_ID]
        .cgroups
        .is_empty());
    w.run(Stage::Poststop, &stopped(LONG_ID), &mut os).unwrap();
    assert!(os.teardowns.borrow()[0].cgroups.is_empty());
}

#[test]
fn only_the_pods_last_container_builds_a_teardown() {
    let w = world();
    let alloc = w.allocation();
    let ann = [
        (DEVICE_ALLOCATED, alloc.as_str()),
        ("io.kubernetes.cri.sandbox-id", "sb"),
    ];
    let mut os = FakeOs::default();
    for (id, pid) in [("c1", 7), ("c2", 8)] {
        w.run(
            Stage::CreateRuntime,
            &state(id, "creating", Some(pid), &ann),
            &mut os,
        )
        .unwrap();
    }
    w.run(Stage::Poststop, &stopped("c1"), &mut os).unwrap();
    assert!(os.teardowns.borrow().is_empty());
    assert_eq!(
        w.ledger().pods["sb"].containers.keys().collect::<Vec<_>>(),
        ["c2"]
    );
    let out = w.run(Stage::Poststop, &stopped("c2"), &mut os).unwrap();
    assert!(released_pod(&out), "{out:?}");
    assert_eq!(*os.gpu_torn.borrow(), ["sb"]);
    assert!(w.ledger().pods.is_empty() && w.ledger().devices.is_empty());
}

/// The last container's poststop: while its pod's GPU teardown runs (where
/// the runtime's hook timeout may kill the hook), the ledger still holds the
/// container's record beside the claims, so the reap of exited pods finds the
/// pod by its init; the release then drops both in one commit.
#[test]
fn a_last_containers_record_stays_until_its_pods_release_commits() {
    let w = world();
    let mut os = exited(&w, "c1", 7);
    let dir = w.env.state_dir.clone();
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let during = std::rc::Rc::clone(&seen);
    os.meanwhile = Some(std::rc::Rc::new(move || {
        let l = Ledger::open(&dir).unwrap().snapshot().unwrap();
        let pod = &l.pods["c1"];
        let kept: Vec<String> = pod.containers.keys().cloned().collect();
        during.borrow_mut().push((kept, pod.network_owner.clone()));
    }));
    w.run(Stage::Poststop, &stopped("c1"), &mut os).unwrap();
    // Its VFs are back on the host: the pod has no network owner meanwhile.
    assert_eq!(*seen.borrow(), [(vec!["c1".to_string()], None)]);
    assert!(w.ledger().pods.is_empty(), "released with its record");
    // Killed during that teardown instead: the next create reaps the pod.
    let mut first = created(&w, "c2", 8);
    set_start(&w.env.roots.proc_root, 8, None);
    first.meanwhile = Some(std::rc::Rc::new(|| panic!("killed by the hook timeout")));
    let killed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        w.run(Stage::Poststop, &stopped("c2"), &mut first)
    }));
    assert!(killed.is_err());
    assert!(w.ledger().pods["c2"].containers.contains_key("c2"));
    let mut next = FakeOs::default();
    w.create_runtime("c3", 9, &mut next).unwrap();
    assert_eq!(*next.gpu_torn.borrow(), ["c2"], "the reap released it");
    assert_eq!(w.ledger().pods.keys().collect::<Vec<_>>(), ["c3"]);
}

/// A container joins while the last one's release runs: the release finds
/// the set changed and keeps the pod for it, the stopped container alone
/// leaves; the newcomer's own poststop then releases the pod.
#[test]
fn a_container_that_joins_during_the_release_keeps_the_pod() {
    let w = world();
    let mut os = exited(&w, "c1", 7);
    let dir = w.env.state_dir.clone();
    let once = std::cell::Cell::new(true);
    os.meanwhile = Some(std::rc::Rc::new(move || {
        if !once.replace(false) {
            return;
        }
        let l = Ledger::open(&dir).unwrap();
        let held = l.snapshot().unwrap().pods["c1"].clone();
        let mut record = held.containers["c1"].clone();
        record.init = None;
        l.admit(&held.pod, &held.claims, "c2", record, false)
            .unwrap();
    }));
    w.run(Stage::Poststop, &stopped("c1"), &mut os).unwrap();
    let l = w.ledger();
    assert_eq!(l.pods["c1"].containers.keys().collect::<Vec<_>>(), ["c2"]);
    assert_eq!(l.pods["c1"].claims.len(), 2);
    let mut last = FakeOs::default();
    w.run(Stage::Poststop, &stopped("c2"), &mut last).unwrap();
    assert!(w.ledger().pods.is_empty(), "{:?}", w.ledger());
}

/// A create reaps exited pods first, but passes over one whose release runs
/// now (its last container's poststop tearing it down): it does not wait
/// on that teardown, which finishes the pod.
#[test]
fn a_reap_passes_over_a_pod_whose_release_runs() {
    let w = world();
    let _first = exited(&w, "c1", 7);
    let uuid = w.fixture.expected().gpus[0].uuid.clone();
    let locks = w.env.state_dir.join("release-locks");
    std::fs::create_dir_all(&locks).unwrap();
    let held = crate::fsutil::lock_exclusive(&locks.join(format!("gpu_{uuid}.lock"))).unwrap();
    let mut other = FakeOs::default();
    let e = w.create_runtime("c2", 8, &mut other).unwrap_err();
    assert!(e.to_string().contains("is held by pod"), "{e}");
    assert!(other.gpu_torn.borrow().is_empty(), "no teardown waited on");
    drop(held);
    let mut next = FakeOs::default();
    w.create_runtime("c2", 8, &mut next).unwrap();
    assert_eq!(*next.gpu_torn.borrow(), ["c1"]);
}

/// A ledger poststop cannot read (corrupt, or a newer devgate's after a
/// rollback): the container's VFs still go back to the host, and the stage
/// fails naming the ledger, the claims left for a release that can read it.
#[test]
fn an_unreadable_ledger_still_restores_the_vfs_at_poststop() {
    let w = world();
    created(&w, "c1", 7);
    std::fs::write(w.env.state_dir.join("ledger.json"), b"{ not json").unwrap();
    let mut os = FakeOs::default();
    let e = w.run(Stage::Poststop, &stopped("c1"), &mut os).unwrap_err();
    assert!(e.to_string().contains("ledger"), "{e}");
    assert_eq!(*os.detached.borrow(), ["c1"]);
    assert!(
        os.gpu_torn.borrow().is_empty(),
        "no teardown without the claims"
    );
    // Carrying the NRI plugin's annotation, which the ledger cannot vouch for now.
    let mut os = FakeOs::default();
    let resolved = state("c1", "stopped", None, &[(RESOLVED_ANNOTATION, "{}")]);
    let e = w.run(Stage::Poststop, &resolved, &mut os).unwrap_err();
    assert!(e.to_string().contains("ledger"), "{e}");
    assert_eq!(*os.detached.borrow(), ["c1"]);
}
