//! What the bench reads of the plugin's process in `/proc`: its CPU time,
//! its release threads and its RSS.

use std::time::{Duration, Instant};

use crate::support::SLOW;

/// `ns` nanoseconds of CPU spread over `count` requests, in milliseconds each.
pub fn ms_each(ns: u64, count: usize) -> f64 {
    ns as f64 / 1e6 / count as f64
}

/// CPU time of all of a process's threads, in nanoseconds: the first field of each
/// `/proc/<pid>/task/<tid>/schedstat` (time on a CPU, nanosecond precision, unlike
/// the clock ticks of `stat`). Threads that ended are not counted: the plugin's
/// threads live as long as it does (its release workers wait for the next
/// release), except each release's own thread in builds before the workers,
/// which the bench waits out before it measures again (`wait_releases_ended`).
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| {
            let text = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
            text.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The CPU time of a whole process, threads that ended included (its CPU
/// clock, `clock_getcpuclockid(3)`), in nanoseconds.
pub fn process_cpu_ns(pid: u32) -> u64 {
    let mut clock: libc::clockid_t = 0;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: out-pointers to locals of the types the calls fill.
    let read = unsafe {
        libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) == 0
            && libc::clock_gettime(clock, &mut ts) == 0
    };
    if read {
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    } else {
        0
    }
}

/// Waits until no thread of the plugin named `release` runs, so that no
/// release adds to a measured window and none ends in it (taking its CPU time
/// out of `cpu_ns`'s sum): a worker bears that name only while it runs a
/// release (`release-idle` between them); builds before the workers started
/// a thread of that name for each release.
pub fn wait_releases_ended(pid: u32) {
    let releasing = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.filter_map(Result::ok).any(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == "release")
                })
            })
            .unwrap_or(false)
    };
    let deadline = Instant::now() + SLOW;
    while releasing() {
        assert!(
            Instant::now() < deadline,
            "a release thread outlived {SLOW:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
