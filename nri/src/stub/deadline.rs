//! The runtime's deadline for the request a handler is answering.
//!
//! A runtime bounds each request to a plugin with its request timeout
//! (containerd's `plugin_request_timeout`, 2 s unless configured) and sends
//! what is left of it as the ttrpc request's `timeout_nano`; an answer after
//! it makes the runtime drop the plugin's connection. NRI v0.7 and later
//! also state the timeout in Configure, but containerd 1.7 (NRI v0.6) states
//! nothing there: each request's own deadline is the one word on it every
//! runtime gives. Handlers run on the stub's thread, one at a time, so the
//! deadline of the request being answered is kept for that thread while its
//! handler runs.

use std::cell::Cell;
use std::time::Duration;

thread_local! {
    static CURRENT: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// How long the runtime gives the request this thread is answering, as its
/// `timeout_nano` said; `None` outside a handler, or where the runtime set
/// no deadline.
pub fn request_timeout() -> Option<Duration> {
    CURRENT.with(Cell::get)
}

/// Runs `f` as a handler of a request whose deadline is `timeout`, for tests
/// of code that reads [`request_timeout`].
#[cfg(feature = "test-util")]
pub fn with_request_timeout<R>(timeout: Duration, f: impl FnOnce() -> R) -> R {
    let nanos = i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX);
    let _scope = RequestScope::enter(nanos);
    f()
}

/// Keeps a request's deadline for this thread until it is dropped.
pub(super) struct RequestScope {
    before: Option<Duration>,
}

impl RequestScope {
    pub(super) fn enter(timeout_nano: i64) -> RequestScope {
        let timeout = u64::try_from(timeout_nano)
            .ok()
            .filter(|n| *n > 0)
            .map(Duration::from_nanos);
        RequestScope {
            before: CURRENT.with(|c| c.replace(timeout)),
        }
    }
}

impl Drop for RequestScope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.before));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requests_deadline_is_seen_only_while_it_is_handled() {
        assert_eq!(request_timeout(), None);
        {
            let _scope = RequestScope::enter(1_500_000_000);
            assert_eq!(request_timeout(), Some(Duration::from_millis(1500)));
            {
                let _none = RequestScope::enter(0);
                assert_eq!(request_timeout(), None, "no deadline set");
            }
            assert_eq!(request_timeout(), Some(Duration::from_millis(1500)));
            // Another thread answers no request.
            assert_eq!(std::thread::spawn(request_timeout).join().unwrap(), None);
        }
        assert_eq!(request_timeout(), None);
        let _negative = RequestScope::enter(-5);
        assert_eq!(request_timeout(), None);
    }
}
