//! What the retry thread waits on between rounds: its interval, or a wake
//! from a release left to it, which then runs in seconds, not an interval
//! later.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

#[derive(Default)]
pub struct RoundWake {
    woken: Mutex<bool>,
    cond: Condvar,
}

impl RoundWake {
    /// Starts the next round now (or as soon as the current one ends).
    pub fn wake(&self) {
        *self.woken.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cond.notify_all();
    }

    /// Waits up to `interval`, or until woken; true if woken.
    pub fn wait(&self, interval: Duration) -> bool {
        let woken = self.woken.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut woken, _) = self
            .cond
            .wait_timeout_while(woken, interval, |w| !*w)
            .unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *woken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_ends_the_wait_and_is_taken_once() {
        let wake = RoundWake::default();
        assert!(
            !wake.wait(Duration::from_millis(1)),
            "not woken: the interval"
        );
        wake.wake();
        assert!(wake.wait(Duration::from_secs(60)), "woken before the wait");
        assert!(!wake.wait(Duration::from_millis(1)), "taken by that wait");
        std::thread::scope(|s| {
            let waiting = s.spawn(|| wake.wait(Duration::from_secs(60)));
            while !waiting.is_finished() {
                wake.wake();
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(waiting.join().unwrap(), "woken while waiting");
        });
    }
}
