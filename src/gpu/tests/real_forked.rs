//! GPU teardown of a pod process that forks as it is ended, against real
//! processes in a real cgroup (see `real_proc`, whose stand-in GPU and helpers
//! it shares; needs root).

use std::path::Path;
use std::time::{Duration, Instant};

use super::real_proc::{require_root, setup, Holder, TestCgroup, SERIAL};

/// Whether `pid` is gone (or a zombie its parent has not reaped yet).
fn ended(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z')) =>
            {
                return true
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    false
}

fn pid_in(file: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(pid) = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pod's process answers SIGTERM by forking a child that inherits the
/// GPU's descriptor, then exits. The child was in no scan: the release looks
/// again after ending the pod's users, ends the child too, and only then
/// resets the GPU and hands it on.
#[test]
fn a_child_forked_while_ending_is_ended_before_the_gpu_is_reset() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create();
    let s = setup(&cgroup);
    let dir = tempfile::tempdir().unwrap();
    let (idle, forked) = (dir.path().join("idle"), dir.path().join("forked"));
    let script = format!(
        "exec 3</dev/full; trap 'sleep 600 & echo $! > {forked}; exit 0' TERM; \
         sleep 600 3<&- & echo $! > {idle}; wait",
        forked = forked.display(),
        idle = idle.display(),
    );
    let parent = Holder::run(&script);
    cgroup.add(parent.pid());
    parent.wait_open();
    let idle = pid_in(&idle);

    let out = s.ledger.release_pod("sb-real", &s.teardown).unwrap();
    let child = pid_in(&forked);
    let still = ended(child);
    // The idle process holds no GPU: left to the runtime, as before.
    unsafe { libc::kill(idle as i32, libc::SIGKILL) };
    if !still {
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
    }
    assert!(still, "the forked child {child} holding the gpu was ended");
    assert_eq!(out.failed, vec![]);
    assert!(!s.nvml.calls().is_empty(), "the released gpu is reset");
    assert!(s.ledger.snapshot().unwrap().devices.is_empty());
}
