//! The plugin's end on a signal: the teardowns in progress finish while the
//! runtime's requests are still answered.

use std::time::Duration;

use super::DevgatePlugin;

impl DevgatePlugin {
    /// Before the process exits on a signal: lets the teardowns in progress
    /// finish (a VF half way home, a GPU being reset; at most `limit`)
    /// while the runtime's requests are still answered, then keeps requests
    /// out for as long as the returned guard lives, and writes what
    /// [`DevgatePlugin::flush_at_exit`] writes. A request held instead would
    /// pass the runtime's timeout (containerd's `plugin_request_timeout`,
    /// 2 s), which ends the connection, and the runtime then creates that
    /// container without its devices (containerd/nri `isFatalError`).
    pub fn drain_for_exit<'g>(
        &self,
        requests: &'g nri::stub::RequestGate,
        limit: Duration,
    ) -> std::sync::MutexGuard<'g, ()> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let idle = self.wait_for_releases(left);
            let kept_out = requests.hold();
            // The request in progress when the wait ended may have started a
            // release (a pod's stop): waited for too, with the time left.
            let still_idle = self.wait_for_releases(Duration::ZERO);
            if !still_idle && idle && std::time::Instant::now() < deadline {
                drop(kept_out);
                continue;
            }
            if !still_idle {
                tracing::warn!(
                    waited_s = limit.as_secs(),
                    "teardown still running at exit; the next start finishes it"
                );
            }
            self.flush_at_exit();
            return kept_out;
        }
    }
}
