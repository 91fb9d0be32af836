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

    /// Synchronize: keeps only the sandboxes the runtime still lists (it
    /// lists a stopped one until its removal), so that a RemovePodSandbox
    /// missed while the plugin was away does not hold a place for good.
    pub(super) fn keep_listed(&self, listed: &HashSet<&str>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|id| listed.contains(id.as_str()));
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

        // A Synchronize that no longer lists them frees their places.
        pods.keep_listed(&["sb-7"].into());
        assert!(pods.contains("sb-7") && !pods.contains("sb-8"));
        pods.stopped(&format!("sb-{MAX_STOPPED}"));
        assert!(pods.contains(&format!("sb-{MAX_STOPPED}")));
    }
}
