//! A few recent entries, the most recent first: the caches of what the plugin
//! derives from a pod (its parsed allocation, its prepared plan). Kubelet starts
//! pods side by side, so the pod whose container arrives is not always the last
//! one the plugin saw (another pod's sandbox may have started in between); a
//! handful of entries covers a node's concurrent pod starts, and a lookup stays
//! a short scan that a pod's further containers end at its first entry.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// How many pods' entries are kept.
pub const RECENT_PODS: usize = 8;

#[derive(Debug)]
pub struct Recent<K, V> {
    entries: Mutex<VecDeque<(K, Arc<V>)>>,
}

impl<K, V> Default for Recent<K, V> {
    fn default() -> Self {
        Recent {
            entries: Mutex::new(VecDeque::new()),
        }
    }
}

impl<K, V> Recent<K, V> {
    /// The value of the most recent entry whose key `hit` accepts.
    pub fn find(&self, hit: impl Fn(&K) -> bool) -> Option<Arc<V>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .find(|(k, _)| hit(k))
            .map(|(_, v)| Arc::clone(v))
    }

    /// Keeps `value` as the most recent entry, in place of any entry whose key
    /// `replaces(&key, old)` accepts; the oldest entries go past [`RECENT_PODS`].
    pub fn put(&self, key: K, value: Arc<V>, replaces: impl Fn(&K, &K) -> bool) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|(k, _)| !replaces(&key, k));
        entries.push_front((key, value));
        entries.truncate(RECENT_PODS);
    }

    /// Drops every entry `which` accepts.
    pub fn remove(&self, which: impl Fn(&K) -> bool) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|(k, _)| !which(k));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_recent_entries_are_kept_one_per_key() {
        let recent: Recent<u32, String> = Recent::default();
        for i in 0..RECENT_PODS as u32 + 2 {
            recent.put(i, Arc::new(format!("v{i}")), |new, old| new == old);
        }
        assert_eq!(recent.len(), RECENT_PODS);
        // The two oldest went; the rest are found.
        assert!(recent.find(|k| *k == 0).is_none() && recent.find(|k| *k == 1).is_none());
        assert_eq!(*recent.find(|k| *k == 2).unwrap(), "v2");
        // A key put again replaces its entry and becomes the most recent.
        recent.put(2, Arc::new("w2".into()), |new, old| new == old);
        assert_eq!(recent.len(), RECENT_PODS);
        assert_eq!(*recent.find(|_| true).unwrap(), "w2");
        recent.remove(|k| *k == 2);
        assert!(recent.find(|k| *k == 2).is_none());
        assert_eq!(recent.len(), RECENT_PODS - 1);
    }
}
