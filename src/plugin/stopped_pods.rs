//! Sandboxes between their StopPodSandbox and their RemovePodSandbox. The
//! runtime checked a sandbox was ready before a creation reaches the plugin,
//! so a creation can still arrive after the stop: it is refused until the
//! removal, rather than claiming devices the stop is releasing.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// Most sandboxes remembered as stopped until their removal; past it a
/// stopped one is not remembered (its late creation claims as before).
const MAX_STOPPED: usize = 4096;

#[derive(Default)]
pub(super) struct StoppedPods(Mutex<HashSet<String>>);

impl StoppedPods {
    pub(super) fn stopped(&self, sandbox_id: &str) {
        let mut stopped = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if stopped.len() < MAX_STOPPED {
            stopped.insert(sandbox_id.to_string());
        }
    }

    pub(super) fn removed(&self, sandbox_id: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(sandbox_id);
    }

    pub(super) fn contains(&self, sandbox_id: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(sandbox_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_is_stopped_until_removed_and_the_set_is_bounded() {
        let pods = StoppedPods::default();
        pods.stopped("sb-1");
        assert!(pods.contains("sb-1") && !pods.contains("sb-2"));
        pods.removed("sb-1");
        assert!(!pods.contains("sb-1"));
        for i in 0..MAX_STOPPED + 10 {
            pods.stopped(&format!("sb-{i}"));
        }
        assert!(pods.contains(&format!("sb-{}", MAX_STOPPED - 1)));
        assert!(!pods.contains(&format!("sb-{MAX_STOPPED}")));
    }
}
