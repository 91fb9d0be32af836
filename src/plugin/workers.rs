//! Threads that run releases. A release may wait seconds on processes, so the
//! stub's thread hands it over and answers the runtime at once. Starting a
//! thread for each one cost more CPU than the release's ledger work (clone,
//! stack, exit: two per pod, at its stop and its removal), so a worker that
//! ends a job waits for the next instead. A job never waits behind another:
//! when no worker is idle, one more starts. Workers beyond the first end after
//! [`LINGER`] without work.
//!
//! A worker's name (`comm`) is `release` while it runs a job and
//! `release-idle` while it waits, so `top -H` and `ps -L` show which run.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How long a worker beyond the first waits for work before it ends.
pub const LINGER: Duration = Duration::from_secs(60);

pub type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct State {
    /// Jobs each promised to an idle worker, taken by whichever wakes first.
    queue: VecDeque<Job>,
    /// Waiting workers no queued job is promised to.
    idle: usize,
    threads: usize,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    linger: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub struct Workers {
    shared: Arc<Shared>,
    /// False in tests standing for a process that can start no thread
    /// (`EAGAIN` under a pids limit).
    can_spawn: bool,
}

impl Default for Workers {
    fn default() -> Self {
        Workers::new(LINGER)
    }
}

impl Workers {
    pub fn new(linger: Duration) -> Workers {
        Workers {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                wake: Condvar::new(),
                linger,
            }),
            can_spawn: true,
        }
    }

    /// Workers that can start no thread, as under an exhausted pids limit.
    #[cfg(test)]
    pub fn without_threads() -> Workers {
        Workers {
            can_spawn: false,
            ..Workers::default()
        }
    }

    /// Runs `job` on an idle worker, or on a new one; gives it back when no
    /// thread can start, for the caller to run itself.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        let mut s = self.shared.lock();
        if s.idle > 0 {
            s.idle -= 1;
            s.queue.push_back(job);
            drop(s);
            self.shared.wake.notify_one();
            return Ok(());
        }
        // A thread that cannot start drops its closure: the job waits in a
        // slot of its own, to come back to the caller then.
        let slot = Arc::new(Mutex::new(Some(job)));
        let taken = Arc::clone(&slot);
        let shared = Arc::clone(&self.shared);
        let spawned = if self.can_spawn {
            std::thread::Builder::new()
                .name("release".into())
                .spawn(move || {
                    let first = taken.lock().unwrap_or_else(PoisonError::into_inner).take();
                    if let Some(first) = first {
                        work(&shared, first);
                    }
                })
        } else {
            Err(std::io::Error::from_raw_os_error(libc::EAGAIN))
        };
        match spawned {
            Ok(_) => {
                s.threads += 1;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %nri::ErrorChain(&e), "cannot start a release thread");
                match slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
                    Some(job) => Err(job),
                    None => Ok(()),
                }
            }
        }
    }

    /// Threads started and not ended.
    #[cfg(test)]
    pub fn threads(&self) -> usize {
        self.shared.lock().threads
    }

    /// Workers waiting with no job promised to them.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.shared.lock().idle
    }
}

/// A worker: runs `job`, then each job promised to it, until it has waited
/// [`Shared::linger`] for none while another worker lives.
fn work(shared: &Shared, mut job: Job) {
    loop {
        // A job that panics (in a build that unwinds) ends itself, not the worker.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
            tracing::error!("a release panicked");
        }
        set_name(c"release-idle");
        let mut s = shared.lock();
        s.idle += 1;
        let mut timed_out = false;
        job = loop {
            if let Some(next) = s.queue.pop_front() {
                break next;
            }
            if timed_out && s.threads > 1 {
                s.idle -= 1;
                s.threads -= 1;
                return;
            }
            let (guard, wait) = shared
                .wake
                .wait_timeout(s, shared.linger)
                .unwrap_or_else(PoisonError::into_inner);
            s = guard;
            timed_out = wait.timed_out();
        };
        drop(s);
        set_name(c"release");
    }
}

/// Names the calling thread (`PR_SET_NAME`, at most 15 bytes); a failure
/// only leaves the old name.
fn set_name(name: &std::ffi::CStr) {
    // SAFETY: a NUL-terminated name that outlives the call.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
    }
}

#[cfg(test)]
#[path = "workers_tests.rs"]
pub(super) mod tests;
