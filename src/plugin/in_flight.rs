//! Releases queued or running on their threads, counted so that an exit can
//! wait for them (a teardown cut short is finished at the next start, but one
//! that completes leaves nothing for it), and kept by sandbox, so that a
//! creation refused for a device a pod being released holds can wait for
//! that pod's release alone.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::lifecycle::Release;

#[derive(Default)]
pub struct InFlight {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    count: usize,
    /// Sandbox id → releases of it queued or running.
    sandboxes: HashMap<String, usize>,
}

/// One queued or running release; dropping it ends it.
pub struct Running {
    flight: Arc<InFlight>,
    sandboxes: Vec<String>,
}

impl InFlight {
    pub fn enter(self: &Arc<Self>, which: &Release) -> Running {
        let sandboxes: Vec<String> = which.ids().cloned().collect();
        let mut s = self.lock();
        s.count += 1;
        for id in &sandboxes {
            *s.sandboxes.entry(id.clone()).or_default() += 1;
        }
        Running {
            flight: Arc::clone(self),
            sandboxes,
        }
    }

    /// Whether a release is queued or runs.
    pub fn busy(&self) -> bool {
        self.lock().count > 0
    }

    /// Whether a release of `sandbox` is queued or runs.
    pub fn releasing(&self, sandbox: &str) -> bool {
        self.lock().sandboxes.contains_key(sandbox)
    }

    /// Waits until no release runs or `limit` passes; true if none runs.
    pub fn wait_idle(&self, limit: Duration) -> bool {
        self.wait_until(limit, |s| s.count == 0)
    }

    /// Waits until no release of `sandbox` runs or `limit` passes; true if
    /// none runs.
    pub fn wait_released(&self, sandbox: &str, limit: Duration) -> bool {
        self.wait_until(limit, |s| !s.sandboxes.contains_key(sandbox))
    }

    fn wait_until(&self, limit: Duration, done: impl Fn(&State) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut s = self.lock();
        while !done(&s) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut s = self.flight.lock();
        s.count -= 1;
        for id in &self.sandboxes {
            if let Some(n) = s.sandboxes.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    s.sandboxes.remove(id);
                }
            }
        }
        drop(s);
        self.flight.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_ends_when_the_last_release_does() {
        let releases = Arc::new(InFlight::default());
        assert!(releases.wait_idle(Duration::ZERO), "nothing runs");
        let running = releases.enter(&Release::Pod("a".into()));
        assert!(!releases.wait_idle(Duration::from_millis(50)));
        let start = Instant::now();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(running);
        });
        assert!(releases.wait_idle(Duration::from_secs(10)));
        assert!(start.elapsed() >= Duration::from_millis(190));
    }

    /// A sandbox counts as being released until the last release naming it
    /// ends, whatever else still runs.
    #[test]
    fn a_sandbox_is_released_when_its_last_release_ends() {
        let releases = Arc::new(InFlight::default());
        let a = releases.enter(&Release::Pod("a".into()));
        let ab = releases.enter(&Release::Pods(crate::ledger::gone(&["a", "b"])));
        let c = releases.enter(&Release::Pod("c".into()));
        assert!(releases.releasing("a") && releases.releasing("b"));
        drop(a);
        assert!(releases.releasing("a"), "still in the second release");
        assert!(!releases.wait_released("a", Duration::from_millis(20)));
        drop(ab);
        assert!(releases.wait_released("a", Duration::ZERO));
        assert!(!releases.releasing("b"));
        assert!(releases.busy() && releases.releasing("c"));
        drop(c);
        assert!(!releases.busy() && releases.wait_idle(Duration::ZERO));
    }
}
