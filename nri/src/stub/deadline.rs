//! How long the runtime waits for the answer to the request a handler is
//! answering.
//!
//! A runtime bounds each request to a plugin with its request timeout
//! (containerd's `plugin_request_timeout`, 2 s unless configured) and sends
//! what is left of it as the ttrpc request's `timeout_nano`; an answer after
//! it makes the runtime drop the plugin's connection. NRI v0.7 and later
//! also state the timeout in Configure, but containerd 1.7 (NRI v0.6) states
//! nothing there: each request's own deadline is the one word on it every
//! runtime gives. The stub takes the shorter of the two for each request
//! (`Service::call`); handlers run on the stub's thread, one at a time, so
//! it is kept for that thread while the handler runs.

use std::cell::Cell;
use std::time::Duration;

/// The runtime's default request timeout (`pkg/api/timeouts.go`): what a
/// runtime that states none at Configure waits for an answer.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// By when a handler answers a request the runtime waits `timeout` for:
/// three quarters of it, leaving room for the reply to travel.
pub fn answer_budget(timeout: Duration) -> Duration {
    timeout * 3 / 4
}

thread_local! {
    static CURRENT: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// How long the runtime waits for the answer to the request this thread is
/// handling: the shorter of the timeout it stated at Configure (2 s where it
/// stated none) and the request's own deadline. `None` outside a handler.
pub fn request_timeout() -> Option<Duration> {
    CURRENT.with(Cell::get)
}

/// Runs `f` as a handler of a request the runtime waits `timeout` for, for
/// tests of code that reads [`request_timeout`].
#[cfg(feature = "test-util")]
pub fn with_request_timeout<R>(timeout: Duration, f: impl FnOnce() -> R) -> R {
    let _scope = RequestScope::enter(timeout);
    f()
}

/// Keeps a request's timeout for this thread until it is dropped.
pub(super) struct RequestScope {
    before: Option<Duration>,
}

impl RequestScope {
    pub(super) fn enter(timeout: Duration) -> RequestScope {
        RequestScope {
            before: CURRENT.with(|c| c.replace(Some(timeout))),
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
    fn a_requests_timeout_is_seen_only_while_it_is_handled() {
        let ms = Duration::from_millis;
        assert_eq!(request_timeout(), None);
        {
            let _scope = RequestScope::enter(ms(1500));
            assert_eq!(request_timeout(), Some(ms(1500)));
            {
                let _inner = RequestScope::enter(ms(700));
                assert_eq!(request_timeout(), Some(ms(700)));
            }
            assert_eq!(request_timeout(), Some(ms(1500)));
            // Another thread answers no request.
            assert_eq!(std::thread::spawn(request_timeout).join().unwrap(), None);
        }
        assert_eq!(request_timeout(), None);
    }
}
