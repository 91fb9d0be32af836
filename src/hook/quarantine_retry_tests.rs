//! Hooks-only mode has no process that retries quarantined GPUs on a timer:
//! the next container that wants one retries it before its admission.

use super::*;

fn gpu0(w: &World) -> String {
    w.fixture.expected().gpus[0].uuid.clone()
}

fn quarantine(w: &World, uuid: &str) {
    Ledger::open(&w.env.state_dir)
        .unwrap()
        .quarantine(&DeviceId::Gpu(uuid.to_string()), "gpu 0 open in pids [42]")
        .unwrap();
}

fn is_quarantined(w: &World, uuid: &str) -> bool {
    w.ledger()
        .devices
        .get(&DeviceId::Gpu(uuid.to_string()).to_string())
        .is_some_and(|d| d.quarantine.is_some())
}

#[test]
fn a_quarantined_gpu_nobody_holds_is_cleaned_and_admitted() {
    let w = world();
    let uuid = gpu0(&w);
    quarantine(&w, &uuid);
    let mut os = FakeOs::default();
    w.create_runtime("c1", 7, &mut os).unwrap();
    assert_eq!(os.retried, vec![vec![uuid.clone()]]);
    assert!(!is_quarantined(&w, &uuid));
    assert!(w.ledger().pods["c1"]
        .claims
        .iter()
        .any(|c| c.device == DeviceId::Gpu(uuid.clone())));
}

#[test]
fn a_gpu_still_in_use_stays_quarantined_and_refuses_the_container() {
    let w = world();
    let uuid = gpu0(&w);
    quarantine(&w, &uuid);
    let mut os = FakeOs {
        fail: Some("gpu"),
        ..FakeOs::default()
    };
    let e = w.create_runtime("c1", 7, &mut os).unwrap_err().to_string();
    assert!(e.contains("quarantined: gpu 0 open in pids [42]"), "{e}");
    assert_eq!(os.retried, vec![vec![uuid.clone()]]);
    assert!(is_quarantined(&w, &uuid));
    assert!(w.ledger().pods.is_empty(), "nothing claimed");
    assert!(os.nodes.is_empty() && os.attached.is_empty());
}

#[test]
fn a_gpu_a_pod_still_holds_is_not_retried() {
    let w = world();
    let uuid = gpu0(&w);
    let mut first = FakeOs::default();
    w.create_runtime("a", 7, &mut first).unwrap();
    quarantine(&w, &uuid);
    let mut os = FakeOs::default();
    let e = w.create_runtime("b", 8, &mut os).unwrap_err().to_string();
    assert!(e.contains("quarantined") || e.contains("held"), "{e}");
    assert!(os.retried.is_empty(), "{:?}", os.retried);
    assert!(is_quarantined(&w, &uuid));
}

#[test]
fn a_failed_teardown_serves_again_once_its_pod_is_reaped_and_the_gpu_is_clean() {
    let w = world();
    let uuid = gpu0(&w);
    let mut first = FakeOs::default();
    w.create_runtime("a", 7, &mut first).unwrap();
    let mut failing = FakeOs {
        fail: Some("gpu"),
        ..FakeOs::default()
    };
    w.run(
        Stage::Poststop,
        &state("a", "stopped", None, &[]),
        &mut failing,
    )
    .unwrap_err();
    assert!(is_quarantined(&w, &uuid));
    // The pod's init is gone: the next create reaps it, then retries the GPU,
    // which its reap left quarantined.
    set_start(&w.env.roots.proc_root, 7, None);
    let mut os = FakeOs::default();
    w.create_runtime("b", 8, &mut os).unwrap();
    assert_eq!(*os.gpu_torn.borrow(), ["a"]);
    assert_eq!(os.retried, vec![vec![uuid.clone()]]);
    let l = w.ledger();
    assert_eq!(l.pods.keys().collect::<Vec<_>>(), ["b"]);
    assert!(l.devices.values().all(|d| d.quarantine.is_none()), "{l:?}");
}
