//! A released pod's process that forks as it is ended: the child, which no
//! scan saw, holds the GPU too (fake host).

use super::fake_host::FakeProc;
use super::pod;
use super::teardown::{claim, dev, node, resets};
use crate::gpu::host::Signal;
use crate::ledger::Share;

fn forking(times: u32) -> FakeProc {
    FakeProc {
        devs: vec![dev(0)],
        cgroup: "0::/kubepods/poduid-a\n".into(),
        start: 1,
        forks_on_term: times,
        ..FakeProc::default()
    }
}

/// A child forked while its parent was ended is found by looking again, and
/// ended before the GPU is reset.
#[test]
fn a_child_forked_as_its_parent_ends_is_ended_too() {
    let n = node(|_| {});
    n.ledger
        .claim(&pod("a"), &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    n.host.add_proc(50, forking(1));
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert_eq!(
        n.host.signals(),
        vec![(50, Signal::Term), (1050, Signal::Term)]
    );
    assert!(n.host.procs.lock().unwrap().is_empty());
    assert_eq!(resets(&n.nvml, "GPU-0"), 1);
}

/// One that forks at every SIGTERM outlasts the rounds: the release fails
/// and the GPU, still held, is neither reset nor handed on.
#[test]
fn a_process_forking_at_every_end_keeps_the_gpu_quarantined() {
    let n = node(|_| {});
    n.ledger
        .claim(&pod("a"), &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    n.host.add_proc(50, forking(u32::MAX));
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    let reason = &out.failed[0].reason;
    assert!(
        reason.contains("pids [3050] of the released pod still hold it after 3 rounds"),
        "{reason}"
    );
    assert_eq!(resets(&n.nvml, "GPU-0"), 0);
    let state = n.ledger.snapshot().unwrap();
    assert!(state.devices["gpu GPU-0"].quarantine.is_some());
}
