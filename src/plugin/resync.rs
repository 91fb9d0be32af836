//! A Synchronize whose ledger read failed. The pods gone while the plugin was
//! away would otherwise keep their claims until the next Synchronize, which
//! comes only with the next connection, and every pod given their devices
//! would be refused meanwhile. So the runtime's live pods are kept, every pod
//! run since is added, and the retry round reads the ledger again until it
//! answers.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use crate::ledger::{Gone, Ledger};

/// Most live pods kept for a retry: a node's pods, and every pod started
/// since, many times over.
const MAX_LIVE: usize = 65536;

#[derive(Default)]
pub struct PendingSync(Mutex<Option<HashSet<String>>>);

impl PendingSync {
    /// The runtime's live pods at a Synchronize whose ledger read failed.
    pub fn keep(&self, live: HashSet<String>) {
        *self.lock() = Some(live);
    }

    /// A Synchronize read the ledger: nothing is owed any more.
    pub fn clear(&self) {
        *self.lock() = None;
    }

    /// A pod run after the Synchronize is live. Called before the pod can
    /// claim anything, so a read under the same lock either counts it live
    /// or ran before its claim.
    pub fn note_run(&self, sandbox_id: &str) {
        let mut pending = self.lock();
        let Some(live) = pending.as_mut() else {
            return;
        };
        if live.len() >= MAX_LIVE {
            // Bounded while the ledger stays unreadable: what is owed is
            // given up, and the pods gone keep their claims until the next
            // connection's Synchronize, which is never a wrong release.
            tracing::warn!(pods = live.len(), "synchronize retry given up: the ledger stayed unreadable while many pods started; pods gone while the plugin was away keep their claims until the next synchronize");
            *pending = None;
            return;
        }
        live.insert(sandbox_id.to_string());
    }

    /// The pods to release: those the ledger holds that were neither live at
    /// the Synchronize nor run since. `None` when nothing is owed, or while
    /// the ledger still cannot be read (kept for the next round).
    pub fn stale(&self, ledger: &Ledger) -> Option<Gone> {
        let mut pending = self.lock();
        let live = pending.as_ref()?;
        match ledger.stale_pods(live) {
            Ok(stale) => {
                *pending = None;
                Some(stale)
            }
            Err(e) => {
                tracing::warn!(error = %nri::ErrorChain(&e), "synchronize retry: ledger still unreadable");
                None
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashSet<String>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pods run since an unanswered Synchronize are live for its retry, up
    /// to a bound past which the retry is given up (nothing released).
    #[test]
    fn pods_run_since_are_live_and_the_set_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        let pending = PendingSync::default();
        pending.note_run("before");
        assert!(pending.stale(&ledger).is_none(), "nothing owed");
        pending.keep(HashSet::from(["a".to_string()]));
        pending.note_run("b");
        assert!(pending.lock().as_ref().unwrap().contains("b"));
        for n in 0..MAX_LIVE {
            pending.note_run(&n.to_string());
        }
        assert!(pending.lock().is_none(), "given up at the bound");
        assert!(pending.stale(&ledger).is_none());
    }
}
