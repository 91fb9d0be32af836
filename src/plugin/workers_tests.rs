use std::sync::mpsc;
use std::time::Instant;

use super::*;

fn tid() -> i64 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

fn comm(tid: i64) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

/// Submits a job that sends back its thread id and name.
fn run(workers: &Workers) -> (i64, String) {
    let (tx, rx) = mpsc::channel();
    workers
        .submit(Box::new(move || {
            let me = tid();
            tx.send((me, comm(me))).unwrap();
        }))
        .unwrap_or_else(|_| panic!("no worker started"));
    rx.recv_timeout(Duration::from_secs(10)).unwrap()
}

/// Waits up to 10 s for `done`; fails saying `what` was awaited.
pub(in crate::plugin) fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_worker_that_ended_its_job_runs_the_next_and_is_named_by_what_it_does() {
    let workers = Workers::default();
    let (first, name) = run(&workers);
    assert_eq!(name, "release");
    // Named before it counts itself idle.
    eventually("the worker goes idle", || workers.idle() == 1);
    assert_eq!(comm(first), "release-idle");
    let (second, name) = run(&workers);
    assert_eq!(second, first, "the same thread");
    assert_eq!(name, "release");
    assert_eq!(workers.threads(), 1);
}

#[test]
fn a_job_never_waits_behind_a_running_one_and_extra_workers_end_when_idle() {
    let workers = Workers::new(Duration::from_millis(50));
    let (release, blocked) = mpsc::channel::<()>();
    let (started, running) = mpsc::channel();
    workers
        .submit(Box::new(move || {
            started.send(tid()).unwrap();
            let _ = blocked.recv();
        }))
        .unwrap_or_else(|_| panic!("no worker started"));
    let stuck = running.recv_timeout(Duration::from_secs(10)).unwrap();
    // The first job still runs: the second gets a thread of its own.
    let (other, _) = run(&workers);
    assert_ne!(other, stuck);
    assert_eq!(workers.threads(), 2);
    drop(release);
    // Both idle now; one ends after the linger, the last one stays.
    eventually("an idle worker ends", || workers.threads() == 1);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(workers.threads(), 1, "the last worker stays");
    let (again, _) = run(&workers);
    assert!(again == stuck || again == other);
}

#[test]
fn jobs_submitted_together_all_run() {
    let workers = Workers::default();
    let (tx, rx) = mpsc::channel();
    for n in 0..20 {
        let tx = tx.clone();
        workers
            .submit(Box::new(move || tx.send(n).unwrap()))
            .unwrap_or_else(|_| panic!("no worker started"));
    }
    let mut got: Vec<i32> = (0..20)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    assert!(workers.threads() <= 20);
}

#[test]
fn a_job_that_panics_leaves_its_worker_serving() {
    let workers = Workers::default();
    let (first, _) = run(&workers);
    eventually("the worker goes idle", || workers.idle() == 1);
    let (tx, rx) = mpsc::channel();
    workers
        .submit(Box::new(move || {
            tx.send(tid()).unwrap();
            panic!("a release bug");
        }))
        .unwrap_or_else(|_| panic!("no worker started"));
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), first);
    eventually("the worker goes idle again", || workers.idle() == 1);
    let (again, _) = run(&workers);
    assert_eq!(again, first);
    assert_eq!(workers.threads(), 1);
}
