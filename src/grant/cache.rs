//! The pods bound to this node, as the watch last saw them, keyed by UID. The
//! runtime's CreateContainer reads it without touching the network; for a pod the
//! watch has not delivered yet it waits on a condition variable, bounded.
//!
//! The key is the UID the runtime has for the sandbox, which kubelet sets to its
//! pod's UID (`PodSandboxMetadata.uid`): `metadata.uid` of the API object for
//! pods from the API server. A static pod's UID is its config hash and differs
//! from its mirror pod's `metadata.uid`; the mirror names it in
//! `kubernetes.io/config.mirror`, so it is found through that, and the checker
//! refuses it (see `GrantError::StaticPod`).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::model::PodSummary;

/// Most pods kept: far above kubelet's `maxPods` (110 by default, at most a few
/// hundred in practice), so that a runaway list cannot take the node's memory.
pub const MAX_PODS: usize = 4096;
/// Longest watch error kept for a refusal message.
const MAX_ERROR: usize = 512;
/// A watch whose requests have failed this long, with none succeeding, is
/// down: a lookup does not wait for a pod that cannot arrive before a
/// reconnect, since the runtime holds every other NRI call of the node while
/// a plugin's answer waits. One failure is not: the next try is 100 ms away.
pub const DOWN_AFTER: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    by_uid: HashMap<String, Arc<PodSummary>>,
    /// Static pod UID (as the runtime knows it) -> mirror pod UID.
    by_mirror: HashMap<String, String>,
    /// A full list has been loaded at least once.
    synced: bool,
    /// Why the last list or watch request failed, and since when requests
    /// have failed; none once one succeeds.
    failure: Option<Failure>,
    /// When the api server last said anything: a list, an event or a bookmark.
    heard: Option<Instant>,
}

struct Failure {
    last_error: String,
    since: Instant,
}

impl State {
    fn insert(&mut self, pod: PodSummary) {
        if !self.by_uid.contains_key(&pod.uid) && self.by_uid.len() >= MAX_PODS {
            tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), limit = MAX_PODS, "pod cache full; pod not cached");
            return;
        }
        if let Some(static_uid) = &pod.mirror_of {
            self.by_mirror.insert(static_uid.clone(), pod.uid.clone());
        }
        self.by_uid.insert(pod.uid.clone(), Arc::new(pod));
    }

    /// See [`DOWN_AFTER`].
    fn down(&self) -> bool {
        self.failure
            .as_ref()
            .is_some_and(|f| f.since.elapsed() >= DOWN_AFTER)
    }

    fn get(&self, uid: &str) -> Option<Arc<PodSummary>> {
        self.by_uid.get(uid).cloned().or_else(|| {
            self.by_mirror
                .get(uid)
                .and_then(|m| self.by_uid.get(m).cloned())
        })
    }
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(Arc<PodSummary>),
    /// Not there after the wait; `synced` says whether a full list ever
    /// arrived, `down` that the watch was down, so the lookup did not wait
    /// (or stopped waiting).
    Missing {
        synced: bool,
        down: bool,
    },
}

#[derive(Default)]
pub struct PodCache {
    state: Mutex<State>,
    changed: Condvar,
}

impl PodCache {
    pub fn new() -> PodCache {
        PodCache::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A fresh list: replaces everything (pods deleted while the watch was down go).
    pub fn replace_all(&self, pods: impl IntoIterator<Item = PodSummary>) {
        let failure = self.lock().failure.take();
        let mut next = State {
            synced: true,
            failure,
            heard: Some(Instant::now()),
            ..State::default()
        };
        for p in pods {
            next.insert(p);
        }
        *self.lock() = next;
        self.changed.notify_all();
    }

    pub fn upsert(&self, pod: PodSummary) {
        let mut s = self.lock();
        s.heard = Some(Instant::now());
        s.insert(pod);
        drop(s);
        self.changed.notify_all();
    }

    pub fn remove(&self, uid: &str) {
        let mut s = self.lock();
        s.heard = Some(Instant::now());
        if let Some(p) = s.by_uid.remove(uid) {
            if let Some(static_uid) = &p.mirror_of {
                s.by_mirror.remove(static_uid);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.lock().by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_synced(&self) -> bool {
        self.lock().synced
    }

    /// The api server spoke without changing a pod (a watch bookmark).
    pub fn heard(&self) {
        self.lock().heard = Some(Instant::now());
    }

    /// How long the api server has been silent; none before it first spoke.
    pub fn silent_for(&self) -> Option<Duration> {
        self.lock().heard.map(|t| t.elapsed())
    }

    /// Records why the watch failed (`None`: it is connected), for refusals.
    pub fn set_error(&self, error: Option<String>) {
        let mut s = self.lock();
        let since = s.failure.as_ref().map(|f| f.since);
        s.failure = error.map(|e| Failure {
            last_error: e.chars().take(MAX_ERROR).collect(),
            since: since.unwrap_or_else(Instant::now),
        });
        drop(s);
        // A lookup waiting for a pod stops once the watch is down.
        self.changed.notify_all();
    }

    /// Makes the current failure `by` older, as if it had begun earlier.
    #[cfg(test)]
    pub fn failing_for(&self, by: Duration) {
        if let Some(f) = &mut self.lock().failure {
            f.since = f.since.checked_sub(by).unwrap_or(f.since);
        }
    }

    /// Why the watch last failed, while it has not reconnected.
    pub fn last_error(&self) -> Option<String> {
        self.lock().failure.as_ref().map(|f| f.last_error.clone())
    }

    /// The pod with this UID (or the mirror pod of the static pod with this UID),
    /// waiting up to `wait` for the watch to deliver it.
    pub fn wait_for(&self, uid: &str, wait: Duration) -> Lookup {
        let deadline = Instant::now() + wait;
        let mut s = self.lock();
        loop {
            if let Some(p) = s.get(uid) {
                return Lookup::Found(p);
            }
            let now = Instant::now();
            let down = s.down();
            if now >= deadline || down {
                return Lookup::Missing {
                    synced: s.synced,
                    down,
                };
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::request::DeviceRequest;

    fn pod(uid: &str, mirror_of: Option<&str>) -> PodSummary {
        PodSummary {
            namespace: "ns".into(),
            name: format!("p-{uid}"),
            uid: uid.into(),
            mirror_of: mirror_of.map(String::from),
            request: Ok(DeviceRequest::default()),
            containers: Vec::new(),
        }
    }

    #[test]
    fn missing_pod_waits_then_reports_sync_state() {
        let c = PodCache::new();
        let t = Instant::now();
        assert_eq!(
            c.wait_for("u1", Duration::from_millis(50)),
            Lookup::Missing {
                synced: false,
                down: false
            }
        );
        assert!(t.elapsed() >= Duration::from_millis(50));
        c.replace_all([pod("u2", None)]);
        assert_eq!(
            c.wait_for("u1", Duration::ZERO),
            Lookup::Missing {
                synced: true,
                down: false
            }
        );
    }

    #[test]
    fn a_waiter_wakes_when_the_pod_arrives() {
        let c = Arc::new(PodCache::new());
        let c2 = Arc::clone(&c);
        let waiter = std::thread::spawn(move || c2.wait_for("u1", Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        c.upsert(pod("u1", None));
        match waiter.join().unwrap() {
            Lookup::Found(p) => assert_eq!(p.uid, "u1"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn relist_drops_deleted_pods_and_mirror_pods_resolve_by_static_uid() {
        let c = PodCache::new();
        c.upsert(pod("u1", None));
        c.replace_all([pod("m1", Some("static-1"))]);
        assert!(matches!(
            c.wait_for("u1", Duration::ZERO),
            Lookup::Missing { .. }
        ));
        match c.wait_for("static-1", Duration::ZERO) {
            Lookup::Found(p) => assert_eq!(p.uid, "m1"),
            other => panic!("{other:?}"),
        }
        c.remove("m1");
        assert!(matches!(
            c.wait_for("static-1", Duration::ZERO),
            Lookup::Missing { .. }
        ));
    }

    #[test]
    fn the_cache_is_bounded() {
        let c = PodCache::new();
        c.replace_all((0..MAX_PODS + 10).map(|i| pod(&i.to_string(), None)));
        assert_eq!(c.len(), MAX_PODS);
    }

    /// A refusal of an unknown pod says how long the api server has been
    /// silent: a slow watch reads differently from a pod it does not have.
    #[test]
    fn the_api_servers_silence_is_timed_and_reported() {
        let c = PodCache::new();
        assert_eq!(c.silent_for(), None);
        c.replace_all([pod("u1", None)]);
        let after_list = c.silent_for().expect("heard at the list");
        std::thread::sleep(Duration::from_millis(30));
        assert!(c.silent_for().unwrap() >= after_list + Duration::from_millis(30));
        let t = Instant::now();
        c.heard();
        // Counted from the list, it would be longer than since `t`.
        assert!(
            c.silent_for().unwrap() <= t.elapsed(),
            "heard again: the silence starts anew"
        );
        let list_state = super::super::list_state;
        assert_eq!(
            list_state(true, None, Some(Duration::from_secs(95))),
            " (the pod watch last heard from the api server 95 s ago)"
        );
        // A reconnecting watch or a list not loaded says that instead.
        let reconnecting = list_state(true, Some("eof".into()), Some(Duration::from_secs(95)));
        assert_eq!(reconnecting, " (the pod watch is reconnecting: eof)");
        let unloaded = list_state(false, None, None);
        assert_eq!(unloaded, " (the pod list has not loaded yet)");
    }

    /// A watch failing lately may deliver the pod on reconnecting, so a
    /// lookup waits; one failing for `DOWN_AFTER` is down, and a lookup
    /// waiting for it stops when it fails again.
    #[test]
    fn a_watch_that_is_down_is_not_waited_for() {
        let c = Arc::new(PodCache::new());
        c.replace_all([pod("u2", None)]);
        c.set_error(Some("connection refused".into()));
        let missing = |down| Lookup::Missing { synced: true, down };
        assert_eq!(c.wait_for("u1", Duration::from_millis(20)), missing(false));
        c.set_error(None);
        let waiter = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || c.wait_for("u1", Duration::from_secs(600)))
        };
        std::thread::sleep(Duration::from_millis(50));
        c.set_error(Some("connection refused".into()));
        c.failing_for(DOWN_AFTER);
        c.set_error(Some("connection refused again".into()));
        assert_eq!(waiter.join().unwrap(), missing(true));
        assert_eq!(c.wait_for("u1", Duration::from_secs(600)), missing(true));
        // Replacing the pods leaves the failure as it is; a request that
        // succeeds ends it.
        c.replace_all([]);
        assert_eq!(c.wait_for("u1", Duration::ZERO), missing(true));
        c.set_error(None);
        assert_eq!(c.wait_for("u1", Duration::ZERO), missing(false));
    }
}
