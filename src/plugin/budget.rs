//! The waits a request's handling may spend, fitted to how long the runtime
//! waits for the plugin's answer.
//!
//! containerd and CRI-O give a plugin 2 s by default and let operators
//! change it (containerd's `plugin_request_timeout`, CRI-O's
//! `nri_plugin_request_timeout`); NRI v0.7 and later state it in Configure
//! (`request_timeout`). An answer later than that is worse than a refusal:
//! the runtime drops the plugin's connection, and what it creates before the
//! plugin is back gets nothing of it. So each wait on the request path ends
//! within a share of the timeout stated, and of 2 s where none is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What containerd and CRI-O wait for a plugin's answer unless configured
/// otherwise, and what a runtime that does not state its own is taken to.
pub use nri::stub::DEFAULT_REQUEST_TIMEOUT;

/// The waits for one request timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// A creation answers by then, counted from its start, whatever it
    /// waits for: the API watch's copy of its pod (the grant check), then
    /// the release of a device it claims. The stub's answer budget (three
    /// quarters of the timeout) leaves the rest to the plan, the claim and
    /// the runtime.
    pub answer_by: Duration,
    /// Longest a pod's stop waits for the restore of its VFs, which
    /// otherwise goes on after the answer (three fifths of the timeout).
    pub stop_restore: Duration,
}

impl Waits {
    /// The waits for a runtime that waits `timeout`; never longer than at
    /// the default, since the runtime holds its other NRI calls meanwhile.
    pub fn for_timeout(timeout: Duration) -> Waits {
        let timeout = timeout.min(DEFAULT_REQUEST_TIMEOUT);
        Waits {
            answer_by: nri::stub::answer_budget(timeout),
            stop_restore: timeout * 3 / 5,
        }
    }
}

/// The waits of the request being answered, from how long the runtime waits
/// for its answer (`nri::stub::request_timeout`: the shorter of the timeout
/// the runtime stated at Configure and the request's own deadline, which
/// every runtime sends; containerd 1.7 states no timeout at Configure, yet
/// holds each request to its `plugin_request_timeout`).
#[derive(Debug, Default)]
pub struct Budget {
    /// The last request timeout logged, in tens of milliseconds.
    noted: AtomicU64,
}

impl Budget {
    /// The waits of the request this thread answers; those of the default
    /// timeout outside a request.
    pub fn waits(&self) -> Waits {
        Waits::for_timeout(nri::stub::request_timeout().unwrap_or(DEFAULT_REQUEST_TIMEOUT))
    }

    /// Logs how long the runtime waits for the request this thread answers
    /// when it is not what was logged last (to 10 ms: what is left of the
    /// runtime's timeout when it sent the request is a little under it).
    pub fn note_request(&self) {
        let Some(timeout) = nri::stub::request_timeout() else {
            return;
        };
        let tens = timeout.as_millis().div_ceil(10) as u64;
        // Read first: the same deadline each time writes nothing.
        if self.noted.load(Ordering::Relaxed) != tens
            && self.noted.swap(tens, Ordering::Relaxed) != tens
        {
            tracing::info!(
                request_deadline_ms = tens * 10,
                answer_by_ms = Waits::for_timeout(timeout).answer_by.as_millis() as u64,
                "the runtime's deadline for a request: the waits of one are shares of it"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn waits_are_shares_of_the_timeout_up_to_those_of_the_default() {
        for (timeout, answer_by, stop_restore) in [
            (ms(2000), ms(1500), ms(1200)),
            (ms(1000), ms(750), ms(600)),
            (ms(400), ms(300), ms(240)),
            (
                ms(1),
                Duration::from_micros(750),
                Duration::from_micros(600),
            ),
            (ms(10_000), ms(1500), ms(1200)),
        ] {
            assert_eq!(
                Waits::for_timeout(timeout),
                Waits {
                    answer_by,
                    stop_restore
                },
                "{timeout:?}"
            );
        }
    }

    /// Each request's waits are shares of how long the runtime waits for
    /// it; outside a request, of the default.
    #[test]
    fn a_requests_timeout_sets_its_waits() {
        let budget = Budget::default();
        let short = nri::stub::with_request_timeout(ms(1000), || budget.waits());
        assert_eq!(short, Waits::for_timeout(ms(1000)));
        let long = nri::stub::with_request_timeout(ms(5000), || budget.waits());
        assert_eq!(long, Waits::for_timeout(DEFAULT_REQUEST_TIMEOUT));
        assert_eq!(
            budget.waits(),
            Waits::for_timeout(DEFAULT_REQUEST_TIMEOUT),
            "outside a request"
        );
    }
}
