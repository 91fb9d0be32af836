//! A scan that can start no thread: a node out of pids, or the plugin's pod
//! at its pids limit. `std::thread::scope`'s `spawn` panics then, and the
//! release profile aborts on a panic: the plugin or the hook would die in
//! the middle of a release, at every try while the pids stay taken.

use crate::gpu::scan::scan_on;
use crate::gpu::tests::fake_host::FakeHost;

const GPU: u64 = 0xc3_07;

/// Runs `f` in a forked child, as nobody allowed no further process or
/// thread (RLIMIT_NPROC 0, which binds every user but root); its exit code.
fn without_threads(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs the caller's check and leaves with _exit, never
    // returning into the harness; glibc's fork leaves malloc usable in it.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain syscalls on this process's credentials and limits.
        let dropped = unsafe {
            libc::setgroups(0, std::ptr::null()) == 0
                && libc::setgid(65534) == 0
                && libc::setuid(65534) == 0
                && libc::setrlimit(libc::RLIMIT_NPROC, &limit) == 0
        };
        let code = match dropped {
            true => std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101),
            false => 100,
        };
        // SAFETY: ends the child without unwinding or atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "status {status}");
    libc::WEXITSTATUS(status)
}

#[test]
fn parts_no_thread_could_be_started_for_are_scanned_on_the_callers() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it drops to nobody in a child"
    );
    let host = FakeHost::default();
    for pid in 1..=2000 {
        let devs: &[u64] = if pid % 400 == 0 { &[GPU] } else { &[] };
        host.add(pid, devs, "/kubepods/pod-a/c1");
    }
    let code = without_threads(|| {
        if std::thread::Builder::new().spawn(|| ()).is_ok() {
            return 3;
        }
        match scan_on(&host, &[GPU], &[], 4) {
            Ok(users) if users.of(GPU) == [400, 800, 1200, 1600, 2000] => 0,
            Ok(_) => 1,
            Err(_) => 2,
        }
    });
    assert_eq!(
        code, 0,
        "100: credentials, 101: panicked, 3: a thread started, 2: failed, 1: wrong holders"
    );
}
