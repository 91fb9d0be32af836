//! A createRuntime's time for releasing other exited pods is bounded: its own
//! pod goes first and always, then one other at least, and what is left
//! waits for the next hook.

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
    // it sorts last, then a; b is left.
    let os = create_gpu(&w, "sb2", "sb", 13, 3);
    assert_eq!(*os.gpu_torn.borrow(), ["sb", "a"]);
    assert_eq!(pods(&w), ["b", "sb"]);
    assert_eq!(
        w.ledger().pods["sb"].containers.keys().collect::<Vec<_>>(),
        ["sb2"]
    );
    // The next create takes b.
    let os = create_gpu(&w, "d", "d", 14, 4);
    assert_eq!(*os.gpu_torn.borrow(), ["b"]);
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
    assert_eq!(*os.gpu_torn.borrow(), ["a", "b", "c"]);
    assert_eq!(pods(&w), ["d"]);
}
