//! A createRuntime's time for releasing other exited pods is bounded: its own
//! pod goes first and always, then one other at least (from a point that
//! moves from hook to hook), and what is left waits for the next hook.

use std::time::Instant;

use super::*;

/// Container `id` of pod `sandbox` (init `pid`, alive) asking for GPU `gpu` alone.
fn create_gpu(w: &World, id: &str, sandbox: &str, pid: u32, gpu: usize) -> FakeOs {
    set_start(&w.env.roots.proc_root, pid, Some(1000 + u64::from(pid)));
    let g = &w.fixture.expected().gpus[gpu];
    let alloc = format!(
        r#"{{"gpu":[{{"minor":{},"id":"{}","resources":{{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}}}]}}"#,
        g.minor, g.uuid
    );
    let ann = [
        (DEVICE_ALLOCATED, alloc.as_str()),
        ("io.kubernetes.cri.sandbox-id", sandbox),
    ];
    let mut os = FakeOs::default();
    w.run(
        Stage::CreateRuntime,
        &state(id, "creating", Some(pid), &ann),
        &mut os,
    )
    .unwrap();
    os
}

fn pods(w: &World) -> Vec<String> {
    w.ledger().pods.into_keys().collect()
}

#[test]
fn a_create_past_its_time_releases_its_own_pod_and_one_other() {
    let mut w = world();
    let exited = [("a", 10, 1), ("b", 11, 2), ("sb", 12, 3)];
    for (pod, pid, gpu) in exited {
        create_gpu(&w, pod, pod, pid, gpu);
    }
    for (_, pid, _) in exited {
        set_start(&w.env.roots.proc_root, pid, None);
    }
    w.reap_until = Instant::now();
    // A new container of pod sb, whose only container exited: sb first, though
    // it sorts last, then one of the others; the next create takes the other.
    let os = create_gpu(&w, "sb2", "sb", 13, 3);
    let torn = os.gpu_torn.borrow().clone();
    assert_eq!(torn.len(), 2, "{torn:?}");
    assert_eq!(torn[0], "sb");
    let left = if torn[1] == "a" { "b" } else { "a" };
    assert!(torn[1] == "a" || torn[1] == "b", "{torn:?}");
    assert_eq!(pods(&w), [left, "sb"]);
    assert_eq!(
        w.ledger().pods["sb"].containers.keys().collect::<Vec<_>>(),
        ["sb2"]
    );
    let os = create_gpu(&w, "d", "d", 14, 4);
    assert_eq!(*os.gpu_torn.borrow(), [left]);
    assert_eq!(pods(&w), ["d", "sb"]);
}

#[test]
fn within_its_time_a_create_releases_every_exited_pod() {
    let w = world();
    let exited = [("a", 10, 1), ("b", 11, 2), ("c", 12, 3)];
    for (pod, pid, gpu) in exited {
        create_gpu(&w, pod, pod, pid, gpu);
    }
    for (_, pid, _) in exited {
        set_start(&w.env.roots.proc_root, pid, None);
    }
    let os = create_gpu(&w, "d", "d", 13, 4);
    let mut torn = os.gpu_torn.borrow().clone();
    torn.sort();
    assert_eq!(torn, ["a", "b", "c"]);
    assert_eq!(pods(&w), ["d"]);
}
