//! List and watch of the pods bound to this node (`spec.nodeName=<node>`) against
//! the API server, on one background thread with a small blocking HTTP client.
//!
//! The protocol is the API server's (API concepts, "Efficient detection of
//! changes"): a list gives a resourceVersion; a watch from it streams one JSON
//! event per line; a watch that ends normally (the server's `timeoutSeconds`) is
//! resumed from the last version seen; `410 Gone` (as the response or as an ERROR
//! event) means the version is too old and the cache is rebuilt from a new list,
//! as any other ERROR event does (client-go's reflector lists again after
//! one); any other failure reconnects with exponential backoff (100 ms to 5 s), each
//! pause drawn between half and all of its step, and none shorter than the
//! `Retry-After` of a server that throttled the request (at most a minute).
//!
//! Every node lists at once when the API servers restart (each watch then gets
//! `410`), so the first list is asked with `resourceVersion=0` and a list again
//! with the last version the watch saw and `resourceVersionMatch=NotOlderThan`,
//! both of which the API server answers whole from its watch cache instead of
//! reading etcd, where pods are not indexed by node (client-go's reflector
//! lists so for the same reason). Only a list over the byte bound, or one at
//! a version the cache cannot serve (see `list`), is read from etcd, page by
//! page. Watches ask for a `timeoutSeconds` drawn between the configured one
//! and twice it, so that nodes that connected together do not all reconnect
//! together.

use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use super::cache::PodCache;
use super::credentials::{self, ClientCert, CredentialError, Secret};
use super::model::{Bookmark, Pod, Status, WatchEvent};
use super::settings::Endpoint;

mod list;
mod run;
pub use list::{ListFrom, MAX_PAGES};
pub use run::PodWatch;
pub(super) use run::{jitter, start};

/// Largest list page accepted (a page holds at most [`PAGE`] pods).
pub const MAX_LIST_BYTES: u64 = 64 << 20;
/// Largest watch event accepted. etcd stores at most 1.5 MiB per object
/// (its default request limit), but the JSON of a watch event can be about
/// six times that: control characters in a string take one byte in storage
/// and six (`\u00XX`) in JSON. One larger still is skipped by listing again.
pub const MAX_EVENT_BYTES: u64 = 16 << 20;
/// Largest error body read.
const MAX_STATUS_BYTES: u64 = 64 << 10;
/// Pods per list page, so that a page of pods near etcd's 1.5 MiB each stays
/// within [`MAX_LIST_BYTES`]; a page over it is asked for again half as long.
const PAGE: u32 = 40;
/// Most pods a list may name. The API server leaves finished pods out (see
/// `node_selector`), so this bounds a server that ignores the selector: above
/// the pod garbage collector's default threshold of finished pods
/// (`--terminated-pod-gc-threshold`, 12500) with the node's running pods.
const MAX_LISTED: usize = 16 * 1024;
/// Longest `Retry-After` obeyed: a server that asks for more is asked again
/// after this, so one misconfigured answer cannot stop the watch for hours.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);
/// The longest a watch may stay silent: API servers from 1.27 send a bookmark
/// about once a minute to watchers that allow them, so a connection silent for
/// longer is dropped (a half-open TCP connection gives no error), and a quiet
/// one merely resumes from its version.
const MAX_SILENCE: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("credentials: {0}")]
    Credentials(#[from] CredentialError),
    #[error("request {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    #[error("request {url}: status {code}: {message}")]
    Status {
        url: String,
        code: u16,
        message: String,
        /// The server's `Retry-After`, where it sent one.
        retry_after: Option<Duration>,
    },
    #[error("resource version {version} is gone (410)")]
    Gone { version: String },
    #[error("read {url}: {source}")]
    Read {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("decode {what} from {url}: {source}")]
    Decode {
        url: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "pod list from {url} has more than {} pods not finished or {MAX_LISTED} in all, more than any node runs",
        super::cache::MAX_PODS
    )]
    TooManyPods { url: String },
    #[error("request {url}: a page of the pod list over {max} bytes")]
    PageTooLarge { url: String, max: u64 },
    #[error("watch event from {url} is larger than {MAX_EVENT_BYTES} bytes")]
    EventTooLarge { url: String },
    /// An ERROR event other than 410 (which is [`WatchError::Gone`]).
    #[error("watch {url}: error event {code} {reason}: {message}")]
    ErrorEvent {
        url: String,
        code: u16,
        reason: String,
        message: String,
    },
}

/// A client of the core v1 pods endpoint, for one node.
pub struct PodClient {
    base: String,
    token: Option<Secret>,
    ca: Option<Secret>,
    client: Option<ClientCert>,
    selector: String,
    watch_timeout_secs: u64,
    /// [`MAX_LIST_BYTES`], smaller in tests.
    max_list_bytes: u64,
}

impl PodClient {
    /// The client of `ep`. Its credentials are read now only to report a bad
    /// file at start: a file missing or broken now may be fixed or rotated in
    /// later, so the watch keeps retrying and the check refuses meanwhile.
    pub fn new(ep: &Endpoint) -> Result<PodClient, WatchError> {
        let client = PodClient {
            base: ep.base.clone(),
            token: ep.token.clone(),
            ca: ep.ca.clone(),
            client: ep.client.clone(),
            selector: node_selector(&ep.node_name),
            watch_timeout_secs: ep.watch_timeout_secs,
            max_list_bytes: MAX_LIST_BYTES,
        };
        let usable = client.agent().and_then(|_| match &client.token {
            Some(t) => credentials::bearer(t).map(drop).map_err(WatchError::from),
            None => Ok(()),
        });
        if let Err(e) = usable {
            tracing::warn!(api = %client.base, error = %nri::ErrorChain(&e), "grant check: api credentials unusable for now");
        }
        Ok(client)
    }

    /// With a smaller bound on a list page's bytes, so that tests need not
    /// send 64 MiB to cross it.
    #[cfg(test)]
    pub(crate) fn with_max_list_bytes(mut self, max: u64) -> Self {
        self.max_list_bytes = max;
        self
    }

    /// An agent with the credentials as they are now on disk. One per request:
    /// a request is a list page or a watch of minutes, and a fresh TLS config
    /// picks up kubelet's rotated client certificate (see [`credentials`]).
    fn agent(&self) -> Result<ureq::Agent, WatchError> {
        let tls = credentials::tls_config(self.ca.as_ref(), self.client.as_ref())?;
        Ok(ureq::Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls)
            .max_redirects(0)
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_recv_response(Some(Duration::from_secs(30)))
            // A silent connection is dead once the server's own timeout has passed.
            .timeout_per_read(Some(
                Duration::from_secs(self.watch_timeout_secs + 30).min(MAX_SILENCE),
            ))
            .user_agent("devgate")
            // The API server is reached directly (see `kubeconfig`): proxy
            // variables in the environment are not for it, and ureq, unlike
            // Go, cannot match the service CIDRs a NO_PROXY lists.
            .proxy(None)
            .build()
            .new_agent())
    }

    fn get(&self, query: &str) -> Result<(String, ureq::Body), WatchError> {
        let url = format!(
            "{}/api/v1/pods?fieldSelector={}&{query}",
            self.base, self.selector
        );
        let mut req = self.agent()?.get(&url).header("Accept", "application/json");
        if let Some(token) = &self.token {
            req = req.header("Authorization", credentials::bearer(token)?);
        }
        let resp = req.call().map_err(|e| WatchError::Http {
            url: url.clone(),
            source: Box::new(e),
        })?;
        let code = resp.status().as_u16();
        let retry_after = retry_after(resp.headers().get("retry-after"));
        let body = resp.into_body();
        if code == 200 {
            return Ok((url, body));
        }
        let status: Status = body
            .into_with_config()
            .limit(MAX_STATUS_BYTES)
            .read_to_vec()
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Err(WatchError::Status {
            url,
            code,
            message: status.message,
            retry_after,
        })
    }

    /// Watches from `version`, applying each event to `cache` and advancing
    /// `version`, until the server ends the watch or it fails.
    pub fn watch(&self, version: &mut String, cache: &PodCache) -> Result<(), WatchError> {
        let timeout = Duration::from_secs(self.watch_timeout_secs);
        let query = format!(
            "watch=1&allowWatchBookmarks=true&timeoutSeconds={}&resourceVersion={}",
            (timeout + jitter(timeout)).as_secs(),
            percent_encode(version)
        );
        let (url, body) = match self.get(&query) {
            Err(WatchError::Status { code: 410, .. }) => {
                return Err(WatchError::Gone {
                    version: version.clone(),
                })
            }
            other => other?,
        };
        cache.set_error(None);
        cache.heard();
        let mut reader = BufReader::new(body.into_with_config().limit(u64::MAX).reader());
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = (&mut reader)
                .take(MAX_EVENT_BYTES + 1)
                .read_until(b'\n', &mut line)
                .map_err(|source| WatchError::Read {
                    url: url.clone(),
                    source,
                })?;
            if n == 0 {
                return Ok(());
            }
            if n as u64 > MAX_EVENT_BYTES {
                return Err(WatchError::EventTooLarge { url });
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if let Some(v) = apply_event(&line, cache, &url)? {
                *version = v;
            }
        }
    }
}

/// Applies one watch event; returns the resourceVersion it carries.
fn apply_event(line: &[u8], cache: &PodCache, url: &str) -> Result<Option<String>, WatchError> {
    let decode = |what: &'static str| {
        move |source| WatchError::Decode {
            url: url.to_string(),
            what,
            source,
        }
    };
    let event: WatchEvent = serde_json::from_slice(line).map_err(decode("watch event"))?;
    match event.kind.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" => {
            let pod: Pod = serde_json::from_str(event.object.get()).map_err(decode("pod"))?;
            let version = pod.metadata.resource_version.clone();
            if event.kind == "DELETED" || pod.finished() {
                cache.remove(&pod.metadata.uid);
            } else {
                cache.upsert(pod.summary());
            }
            Ok(Some(version))
        }
        "BOOKMARK" => {
            let b: Bookmark =
                serde_json::from_str(event.object.get()).map_err(decode("bookmark"))?;
            cache.heard();
            Ok(Some(b.metadata.resource_version))
        }
        _ => {
            let s: Status = serde_json::from_str(event.object.get()).unwrap_or_default();
            if s.code == 410 {
                return Err(WatchError::Gone { version: s.message });
            }
            Err(WatchError::ErrorEvent {
                url: url.to_string(),
                code: s.code,
                reason: s.reason,
                message: s.message,
            })
        }
    }
}

/// The field selector of the node's pods that may still run: finished ones
/// (`Succeeded`, `Failed`) stay bound to the node until the pod garbage
/// collector's threshold (12500 cluster-wide by default), each as large as
/// its spec, and would only be skipped. A pod that finishes while watched no
/// longer matches, which the API server sends as its deletion.
fn node_selector(node: &str) -> String {
    percent_encode(&format!(
        "spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed"
    ))
}

/// Percent-encodes everything outside RFC 3986's unreserved set.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl WatchError {
    /// How long the server asked to be left alone, at most [`RETRY_AFTER_MAX`].
    pub(super) fn retry_after(&self) -> Option<Duration> {
        match self {
            WatchError::Status { retry_after, .. } => retry_after.map(|d| d.min(RETRY_AFTER_MAX)),
            _ => None,
        }
    }

    /// 504 "Too large resource version": a cache behind the version asked
    /// (after an etcd restore); other 504s are timeouts.
    pub(super) fn too_large_version(&self) -> bool {
        matches!(self, WatchError::Status { code: 504, message, .. } | WatchError::ErrorEvent { code: 504, message, .. } if message.contains("Too large resource version"))
    }
}

/// A `Retry-After` header in seconds, the form the API server sends
/// (RFC 9110 §10.2.3 also allows a date, which it never sends: ignored).
pub(super) fn retry_after(header: Option<&ureq::http::HeaderValue>) -> Option<Duration> {
    let secs: u64 = header?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(secs))
}
