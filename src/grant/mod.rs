//! Only the scheduler grants devices: before anything is claimed, the allocation
//! annotation of a pod is compared with what the pod's containers request, as the
//! API server has the pod.
//!
//! Any pod author can write `scheduling.koordinator.sh/device-allocated` into their
//! own pod, and koord-scheduler keeps a pre-set allocation when the pod requests
//! no device resource. The cluster-side guard is the admission policy in
//! `install/kubernetes/validating-admission-policy.yaml`; this is the node-side one.
//!
//! - [`request`]: container resources in Koordinator's device units;
//! - [`check`]: request against allocation (pure);
//! - [`watch`] fills [`cache`] from a list/watch of this node's pods, on its own
//!   thread, so CreateContainer never waits on the network except for a pod the
//!   watch has not delivered yet (at most `grant_wait_ms`);
//! - [`audit`]: a log line per decision and counters for `devgate status`.
//!
//! The watch is a blocking HTTP client (`ureq` with rustls) on one thread and
//! deserializes only the fields it needs, rather than kube-rs with k8s-openapi:
//! the plugin stays one small single-threaded runtime, and nothing of the client
//! runs or is faulted in while the check is off.

pub mod audit;
mod audit_line;
pub mod cache;
pub mod check;
pub mod credentials;
pub mod fake_api;
pub mod kubeconfig;
mod last;
mod late;
pub mod model;
mod node_identity;
pub mod request;
pub mod settings;
pub mod watch;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::allocation::{Allocation, DEVICE_ALLOCATED};
use crate::config::{Config, FailurePolicy};

pub use audit::{Audit, GrantCounters};
pub use settings::{
    validate, Endpoint, GrantCheck, KubeApiConfig, Mode, DEFAULT_WAIT_MS, KUBELET_KUBECONFIG,
    SERVICE_ACCOUNT_DIR,
};

use audit::{Decision, Outcome, RefusalKind};
use cache::{Lookup, PodCache};

#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error(transparent)]
    Namespace(#[from] crate::config::NamespaceRefused),
    #[error(
        "{DEVICE_ALLOCATED}: pod {pod} is not granted {devices}: more than its containers request"
    )]
    Mismatch {
        pod: String,
        devices: String,
        #[source]
        source: check::Mismatch,
    },
    #[error("{DEVICE_ALLOCATED}: pod {pod}: its resource requests cannot be read")]
    BadRequest {
        pod: String,
        #[source]
        source: request::RequestError,
    },
    /// `state`: ` after N ms` (none where the watch was down) and the list's
    /// state; `node`: the node name the watch selects, which a wrong one (the
    /// host name where the node is registered under another) would explain.
    #[error("{DEVICE_ALLOCATED}: pod {pod} (uid {uid}) is not among this node's pods on the api server{state}: its allocation cannot be checked against its requests (pods listed for node {node})")]
    UnknownPod {
        pod: String,
        uid: String,
        state: String,
        node: String,
    },
    #[error("{DEVICE_ALLOCATED}: pod {pod}: the allocation cannot be checked: {reason}")]
    Unavailable { pod: String, reason: String },
    #[error("{DEVICE_ALLOCATED}: pod {pod} is a static pod ({how}): only the scheduler grants devices and it does not place static pods")]
    StaticPod { pod: String, how: String },
}

/// The pod as the runtime names it.
#[derive(Debug, Clone, Copy)]
pub struct PodIdentity<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// The sandbox's UID: `metadata.uid` for pods from the API server; for a
    /// static pod, its config hash, which its mirror pod names in
    /// `kubernetes.io/config.mirror` (see [`model::CONFIG_MIRROR`]).
    pub uid: &'a str,
    /// The sandbox's `kubernetes.io/config.source` annotation, when present.
    pub config_source: Option<&'a str>,
}

/// The grant check of a running plugin: its mode, the pod cache and the audit.
pub struct GrantChecker {
    mode: Mode,
    /// Where an API server may still appear (see [`late`]).
    late: Option<late::LateMode>,
    cache: Arc<PodCache>,
    audit: Audit,
    /// The last decision that let a pod through (see [`last`]).
    last: Mutex<Option<last::LastDecision>>,
    /// Longest wait for a pod the watch has not delivered, whatever
    /// `grant_wait_ms` says (ms; see [`GrantChecker::cap_wait`]).
    wait_cap_ms: AtomicU64,
    // Held for its lifetime: dropping it stops the watch thread.
    _watch: Option<watch::PodWatch>,
}

impl GrantChecker {
    /// Resolves the mode from `config` and this process's environment and starts
    /// the watch when the mode needs one.
    pub fn start(config: &Config, state_dir: &Path) -> GrantChecker {
        GrantChecker::start_at(
            config,
            state_dir,
            Path::new("/"),
            Path::new(KUBELET_KUBECONFIG),
        )
    }

    /// [`GrantChecker::start`] with the host root and kubelet's kubeconfig given.
    pub fn start_at(
        config: &Config,
        state_dir: &Path,
        host_root: &Path,
        kubelet_conf: &Path,
    ) -> GrantChecker {
        let mode = settings::resolve_on_host(config, host_root, kubelet_conf);
        let mut checker = GrantChecker::with_mode(mode, state_dir);
        let looks_again = !matches!(checker.mode, Mode::Requests(_))
            && config.grant_check != Some(GrantCheck::Off);
        if looks_again {
            checker.late = Some(late::LateMode::new(
                config,
                host_root.to_path_buf(),
                kubelet_conf.to_path_buf(),
            ));
        }
        checker
    }

    /// With an explicit mode (tests, and [`GrantChecker::start`]).
    pub fn with_mode(mode: Mode, state_dir: &Path) -> GrantChecker {
        let cache = Arc::new(PodCache::new());
        let (checker_mode, handle) = match mode {
            Mode::Requests(ep) => watch::start(ep, &cache),
            other => (other, None),
        };
        match &checker_mode {
            Mode::Off => tracing::info!("grant check off: allocations are applied as annotated"),
            Mode::Unavailable(reason) => tracing::error!(%reason, "grant check unavailable"),
            Mode::Requests(_) => {}
        }
        GrantChecker {
            mode: checker_mode,
            late: None,
            cache,
            audit: Audit::open(state_dir),
            last: Mutex::new(None),
            wait_cap_ms: AtomicU64::new(u64::MAX),
            _watch: handle,
        }
    }

    /// Bounds the wait for a pod the watch has not delivered to `cap`, below
    /// `grant_wait_ms` where the runtime answers sooner than the 2 s that
    /// setting is bounded for.
    pub fn cap_wait(&self, cap: Duration) {
        let ms = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX);
        // Set at each request: the same cap each time writes nothing.
        if self.wait_cap_ms.load(Ordering::Relaxed) != ms {
            self.wait_cap_ms.store(ms, Ordering::Relaxed);
        }
    }

    /// How long a creation waits for a pod the watch has not delivered.
    fn wait_ms(&self, config: &Config) -> u64 {
        config
            .grant_wait_ms
            .min(self.wait_cap_ms.load(Ordering::Relaxed))
    }

    /// The mode in force: the one resolved at start, or an API server found
    /// since (looked for again when it is time).
    pub fn mode(&self) -> &Mode {
        self.late
            .as_ref()
            .and_then(|l| l.found(&self.cache))
            .unwrap_or(&self.mode)
    }

    pub fn cache(&self) -> &Arc<PodCache> {
        &self.cache
    }

    pub fn counters(&self) -> GrantCounters {
        self.audit.counters()
    }

    /// Writes the decision counters now (at shutdown; they are otherwise written
    /// in the background, see [`audit`]).
    pub fn flush_audit(&self) {
        self.audit.flush();
    }

    /// Whether `pod` may be given `alloc` for `container`. Logs and counts the
    /// decision. A missing cache entry or an unreachable API server refuses unless
    /// `failure_policy = "ignore"`; a mismatch, a namespace rule, a static pod or
    /// unreadable requests always refuse, and the plugin fails the container
    /// whatever `failure_policy` says.
    pub fn check(
        &self,
        config: &Arc<Config>,
        pod: PodIdentity<'_>,
        container: &str,
        alloc: &Allocation,
    ) -> Result<(), GrantError> {
        self.check_held(config, pod, container, alloc, &|| false)
    }

    /// [`GrantChecker::check`], where `held` says whether the ledger holds
    /// the pod's claim already, asked only of a pod the API cache lacks. A
    /// claim is made only once the pod was let through (granted, or
    /// unchecked or unverified as configured then), so a container of a pod
    /// holding its claim is given nothing new: kubelet restarting a container
    /// while the API server is out of reach (a partition, devgate restarted
    /// with an empty cache) is let through, unverified, on the ledger's word
    /// rather than refused until the API server answers.
    pub fn check_held(
        &self,
        config: &Arc<Config>,
        pod: PodIdentity<'_>,
        container: &str,
        alloc: &Allocation,
        held: &dyn Fn() -> bool,
    ) -> Result<(), GrantError> {
        let (mode, inputs) = self.inputs(config, pod, alloc);
        // Held through the decision, so that the kept one is the last the
        // audit saw.
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = last.as_ref().filter(|l| l.is_for(&inputs)) {
            self.audit.record(&kept.decision(container));
            return Ok(());
        }
        *last = None;
        let pod_name = format!("{}/{}", pod.namespace, pod.name);
        let devices = check::describe(alloc);
        let wait = Duration::from_millis(self.wait_ms(config));
        let result = self.decide(config, mode, pod, &pod_name, alloc, wait, held);
        let (outcome, reason) = match &result {
            Ok((outcome, reason)) => (*outcome, reason.clone()),
            Err((kind, e)) => (Outcome::Refused(*kind), nri::ErrorChain(e).to_string()),
        };
        self.audit.record(&Decision {
            pod: &pod_name,
            uid: pod.uid,
            container,
            devices: &devices,
            outcome,
            reason: &reason,
        });
        *last = last::LastDecision::keep(&inputs, pod_name, devices, outcome, reason);
        result.map(|_| ()).map_err(|(_, e)| e)
    }

    /// `wait`: how long a pod the cache lacks is waited for; `held`: see
    /// [`GrantChecker::check_held`].
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        config: &Config,
        mode: &Mode,
        pod: PodIdentity<'_>,
        pod_name: &str,
        alloc: &Allocation,
        wait: Duration,
        held: &dyn Fn() -> bool,
    ) -> Result<(Outcome, String), (RefusalKind, GrantError)> {
        config
            .check_namespace(pod.namespace, pod.name)
            .map_err(|e| (RefusalKind::Namespace, e.into()))?;
        let ignore = config.failure_policy == FailurePolicy::Ignore;
        if config.grant_check == Some(GrantCheck::Off) || *mode == Mode::Off {
            return Ok((Outcome::Unchecked, "grant_check off".into()));
        }
        // A static pod comes from a file on the node, never through the
        // scheduler, so no allocation on it is the scheduler's: refused whatever
        // its mirror pod requests, and whatever failure_policy says.
        let static_pod = |how: String| {
            (
                RefusalKind::StaticPod,
                GrantError::StaticPod {
                    pod: pod_name.to_string(),
                    how,
                },
            )
        };
        if let Some(source) = pod.config_source.filter(|s| *s != "api") {
            return Err(static_pod(format!("{}: {source}", model::CONFIG_SOURCE)));
        }
        match mode {
            Mode::Off => Ok((Outcome::Unchecked, "grant_check off".into())),
            Mode::Unavailable(reason) if ignore => Ok((
                Outcome::Unverified,
                format!("{reason} (failure_policy ignore)"),
            )),
            Mode::Unavailable(reason) => Err((
                RefusalKind::Unavailable,
                GrantError::Unavailable {
                    pod: pod_name.to_string(),
                    reason: reason.clone(),
                },
            )),
            Mode::Requests(ep) => match self.cache.wait_for(pod.uid, wait) {
                Lookup::Found(summary) if summary.mirror_of.is_some() => Err(static_pod(format!(
                    "its mirror pod is {}/{}",
                    summary.namespace, summary.name
                ))),
                Lookup::Found(summary) => {
                    let req = summary.request.clone().map_err(|source| {
                        (
                            RefusalKind::BadRequest,
                            GrantError::BadRequest {
                                pod: pod_name.to_string(),
                                source,
                            },
                        )
                    })?;
                    check::check(&req, alloc).map_err(|source| {
                        (
                            RefusalKind::Mismatch,
                            GrantError::Mismatch {
                                pod: pod_name.to_string(),
                                devices: check::describe(alloc),
                                source,
                            },
                        )
                    })?;
                    Ok((Outcome::Granted, "matches the pod's requests".into()))
                }
                // Unverified, never kept for the pod's next containers: once
                // the watch has the pod, they are checked against it.
                Lookup::Missing { .. } if held() => Ok((
                    Outcome::Unverified,
                    "not in the api cache; the ledger holds the pod's claim, made when it was let through".into(),
                )),
                Lookup::Missing { .. } if ignore => Ok((
                    Outcome::Unverified,
                    "pod not in the api cache (failure_policy ignore)".into(),
                )),
                Lookup::Missing { synced, down } => Err((
                    RefusalKind::UnknownPod,
                    GrantError::UnknownPod {
                        pod: pod_name.to_string(),
                        uid: pod.uid.to_string(),
                        state: match down {
                            false => format!(" after {} ms", wait.as_millis()),
                            true => String::new(),
                        } + &list_state(
                            synced,
                            self.cache.last_error(),
                            self.cache.silent_for(),
                        ) + if down {
                            " (not waited for: the watch is down)"
                        } else {
                            ""
                        },
                        node: ep.node_name.clone(),
                    },
                )),
            },
        }
    }
}

/// Why a pod may be missing from the cache, for [`GrantError::UnknownPod`].
/// `silent_for`: since the api server last spoke, which tells a watch that
/// is slow to deliver (an overloaded api server) from a pod it does not know.
fn list_state(synced: bool, last_error: Option<String>, silent_for: Option<Duration>) -> String {
    match (synced, last_error, silent_for) {
        (false, None, _) => " (the pod list has not loaded yet)".into(),
        (false, Some(e), _) => format!(" (the pod list has not loaded yet: {e})"),
        (true, Some(e), _) => format!(" (the pod watch is reconnecting: {e})"),
        (true, None, Some(silent)) => format!(
            " (the pod watch last heard from the api server {} s ago)",
            silent.as_secs()
        ),
        (true, None, None) => String::new(),
    }
}

#[cfg(test)]
mod list_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
