//! A stand-in for the API server's core v1 pods endpoint, for tests and demos: plain
//! HTTP on 127.0.0.1, one thread per connection, speaking the list and watch JSON
//! (resourceVersion, chunked watch streams, `410 Gone` for compacted versions) and
//! able to drop every open watch connection the way a restarted API server does.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The limit [`FakeApi::pages`] records for a list asked from the cache
/// (`resourceVersion=0`), which is never paged.
pub const CACHED: usize = 0;

use serde_json::{json, Value};

mod http;

#[derive(Default)]
struct State {
    version: u64,
    /// uid -> pod object.
    pods: BTreeMap<String, Value>,
    /// (version, type, object) of every change.
    events: Vec<(u64, &'static str, Value)>,
    /// Watches from a version below this get 410 Gone.
    compacted_below: u64,
    /// Bumped to make every open watch close its connection abruptly.
    drops: u64,
    /// Bumped to make every open watch send an ERROR 410 event.
    expiries: u64,
    requests: Vec<String>,
    /// The pages listed: (`continue` offset, `limit`); [`CACHED`] for a
    /// list from the cache.
    pages: Vec<(usize, usize)>,
    /// When set, every list page holds this many made-up pods and a
    /// `continue` token: a server that never ends its list.
    endless_list: Option<usize>,
    /// Lists asked no older than a version answer 504, as an API server
    /// whose cache lags the version (after an etcd restore) does.
    cache_lags: bool,
    /// Watches still to answer 504 "Too large resource version", as an API
    /// server whose watch cache lags the version asked.
    watch_lags: usize,
    /// When set, every watch answers 200 and then an ERROR event with this
    /// code, as an API server whose watch of etcd fails does.
    watch_error: Option<u16>,
    /// Lists still to refuse, with this status and `Retry-After` (seconds):
    /// 429 as API Priority and Fairness answers a flow over its share, 503 as
    /// an API server that is starting does.
    throttled: (usize, u16, u64),
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub struct FakeApi {
    url: String,
    shared: Arc<Shared>,
}

impl FakeApi {
    /// Listens on an ephemeral port of 127.0.0.1.
    pub fn start() -> std::io::Result<FakeApi> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}", listener.local_addr()?);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                version: 100,
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("fake-api".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    let s = Arc::clone(&s);
                    let _ = std::thread::Builder::new()
                        .name("fake-api-conn".into())
                        .spawn(move || http::serve(stream, &s));
                }
            })?;
        Ok(FakeApi { url, shared })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// An endpoint of this server for `node`, without credentials.
    pub fn endpoint(&self, node: &str) -> super::settings::Endpoint {
        super::settings::Endpoint {
            base: self.url.clone(),
            token: None,
            ca: None,
            client: None,
            node_name: node.to_string(),
            watch_timeout_secs: 30,
        }
    }

    fn change(&self, kind: &'static str, mut pod: Value) {
        let mut s = self.shared.lock();
        s.version += 1;
        let v = s.version;
        pod["metadata"]["resourceVersion"] = json!(v.to_string());
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if kind == "DELETED" {
            s.pods.remove(&uid);
        } else {
            s.pods.insert(uid, pod.clone());
        }
        s.events.push((v, kind, pod));
        drop(s);
        self.shared.changed.notify_all();
    }

    /// Adds or replaces a pod (ADDED or MODIFIED).
    pub fn put_pod(&self, pod: Value) {
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = if self.shared.lock().pods.contains_key(&uid) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.change(kind, pod);
    }

    pub fn delete_pod(&self, uid: &str) {
        let pod = self.shared.lock().pods.get(uid).cloned();
        if let Some(pod) = pod {
            self.change("DELETED", pod);
        }
    }

    /// Closes every open watch connection without ending the stream.
    pub fn drop_watches(&self) {
        self.shared.lock().drops += 1;
        self.shared.changed.notify_all();
    }

    /// Forgets history: watches from any version before the current one
    /// get 410 Gone.
    pub fn compact(&self) {
        let mut s = self.shared.lock();
        s.compacted_below = s.version;
        s.events.clear();
    }

    /// Open watches send an ERROR event with a 410 Status, as when etcd compacted.
    pub fn expire_watches(&self) {
        self.compact();
        self.shared.lock().expiries += 1;
        self.shared.changed.notify_all();
    }

    /// Makes lists asked no older than a version fail with 504.
    pub fn lag_cache(&self) {
        self.shared.lock().cache_lags = true;
    }

    /// Answers the next `watches` watches 504 "Too large resource version".
    pub fn lag_watches(&self, watches: usize) {
        self.shared.lock().watch_lags = watches;
    }

    /// Every watch from now on sends an ERROR event with `code` first.
    pub fn fail_watches(&self, code: u16) {
        self.shared.lock().watch_error = Some(code);
        self.drop_watches();
    }

    /// Refuses the next `lists` lists with `code` (429 or 503) and
    /// `Retry-After: <secs>`.
    pub fn throttle(&self, code: u16, lists: usize, secs: u64) {
        self.shared.lock().throttled = (lists, code, secs);
    }

    /// Makes every list page `pods` made-up pods long, with no end.
    pub fn list_without_end(&self, pods: usize) {
        self.shared.lock().endless_list = Some(pods);
    }

    /// Request lines seen so far (`list ...` or `watch <version>`).
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }

    /// The list pages asked for: (offset the `continue` token stands for,
    /// `limit`), the limit [`CACHED`] for a list asked from the cache.
    pub fn pages(&self) -> Vec<(usize, usize)> {
        self.shared.lock().pages.clone()
    }

    /// Waits until `pred` holds for the requests seen, up to `timeout`.
    pub fn wait_requests(&self, timeout: Duration, pred: impl Fn(&[String]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if pred(&self.requests()) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        pred(&self.requests())
    }
}

/// A pod bound to `node` whose containers request `resources` (name, quantity).
pub fn pod(
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
    resources: &[(&str, &str)],
) -> Value {
    let requests: BTreeMap<&str, &str> = resources.iter().copied().collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": namespace, "uid": uid,
                      "annotations": { "unrelated": "x" }, "managedFields": [{ "manager": "kubectl" }] },
        "spec": { "nodeName": node, "containers": [{
            "name": "main", "image": "busybox",
            "resources": { "requests": requests, "limits": requests },
        }]},
        "status": { "phase": "Pending" },
    })
}
