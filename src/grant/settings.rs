//! Config of the grant check and where the API server is.
//!
//! In a pod (the DaemonSet), the API server is found as every in-cluster client
//! finds it: `KUBERNETES_SERVICE_HOST`/`_PORT` and the service account's token and
//! CA under `/var/run/secrets/kubernetes.io/serviceaccount`. Outside a pod,
//! `kube_api.kubeconfig` (kubelet's, to watch as the node; see [`super::kubeconfig`])
//! or `kube_api.url` names it. `http://` is accepted only as an explicit `url` and
//! never with a token (a bearer token is not sent in clear text): for a local
//! authenticating proxy such as `kubectl proxy`, or a test API server.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::credentials::{ClientCert, Secret};
use super::{kubeconfig, node_identity};
use crate::config::ConfigError;

/// The service account directory of a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// kubelet's kubeconfig on a kubeadm node: the host install's API server.
pub const KUBELET_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";
/// NRI's default request timeout: the grant wait must end well inside it.
pub const NRI_TIMEOUT_MS: u64 = 2000;
/// Largest `grant_wait_ms` accepted: leaves the rest of NRI's 2 s to the plan,
/// the claim and the runtime.
pub const MAX_WAIT_MS: u64 = 1500;
/// Default wait for a pod the watch has not delivered: kubelet creates the
/// sandbox only after it saw the pod from the same API server, so the watch is
/// normally far ahead.
pub const DEFAULT_WAIT_MS: u64 = 800;

/// `grant_check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantCheck {
    /// Trust the annotation (the admission policy is then the only guard).
    Off,
    /// Grant only what the pod's containers request, per the API server.
    Requests,
}

/// `[kube_api]`: how to reach the API server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubeApiConfig {
    /// `https://host:port` (or `http://` for a local proxy); empty = in-cluster.
    pub url: String,
    /// A kubeconfig to take the server and credentials from, e.g. kubelet's
    /// `/etc/kubernetes/kubelet.conf`; excludes `url`, `token_file`, `ca_file`.
    pub kubeconfig: PathBuf,
    /// The kubeconfig's context; empty = its `current-context`.
    pub context: String,
    /// Bearer token file, re-read at each connection (tokens rotate); empty = the
    /// service account's in a pod, none otherwise.
    pub token_file: PathBuf,
    /// PEM CA bundle of the API server; empty = the service account's in a pod,
    /// public web roots otherwise.
    pub ca_file: PathBuf,
    /// This node's name as the API server knows it; empty = `$NODE_NAME`, else the
    /// host name.
    pub node_name: String,
    /// Seconds the API server keeps one watch request open.
    pub watch_timeout_secs: u64,
}

impl Default for KubeApiConfig {
    fn default() -> Self {
        KubeApiConfig {
            url: String::new(),
            kubeconfig: PathBuf::new(),
            context: String::new(),
            token_file: PathBuf::new(),
            ca_file: PathBuf::new(),
            node_name: String::new(),
            watch_timeout_secs: 240,
        }
    }
}

/// Everything the watch needs, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Scheme, host and port, no trailing slash.
    pub base: String,
    /// Bearer token, re-read at each connection when a file.
    pub token: Option<Secret>,
    /// CA bundle of the API server; none = public web roots.
    pub ca: Option<Secret>,
    /// Client certificate and key (kubelet's identity), re-read at each connection.
    pub client: Option<ClientCert>,
    pub node_name: String,
    pub watch_timeout_secs: u64,
}

/// What the grant check will do, from the config and the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Off,
    Requests(Endpoint),
    /// `grant_check = "requests"` but no API server: every allocation is refused
    /// (or, with `failure_policy = "ignore"`, applied unverified).
    Unavailable(String),
}

/// Checks the keys of the grant check; called from `Config::parse`.
pub fn validate(cfg: &crate::config::Config) -> Result<(), ConfigError> {
    let invalid = |key: &str, reason: String| ConfigError::Invalid {
        key: key.to_string(),
        reason,
    };
    if cfg.grant_wait_ms > MAX_WAIT_MS {
        return Err(invalid(
            "grant_wait_ms",
            format!(
                "{} is over {MAX_WAIT_MS}: NRI times out after {NRI_TIMEOUT_MS} ms",
                cfg.grant_wait_ms
            ),
        ));
    }
    let api = &cfg.kube_api;
    // Relative, each would be read from the plugin's working directory
    // (`/` under systemd, the image's WORKDIR in the DaemonSet): a mistake
    // said at start, not a refusal of every pod later.
    for (key, path) in [
        ("kube_api.kubeconfig", &api.kubeconfig),
        ("kube_api.token_file", &api.token_file),
        ("kube_api.ca_file", &api.ca_file),
    ] {
        if !path.as_os_str().is_empty() && !path.is_absolute() {
            return Err(invalid(
                key,
                format!("{} is not an absolute path", path.display()),
            ));
        }
    }
    if !api.kubeconfig.as_os_str().is_empty() {
        if !api.url.is_empty()
            || !api.token_file.as_os_str().is_empty()
            || !api.ca_file.as_os_str().is_empty()
        {
            return Err(invalid(
                "kube_api.kubeconfig",
                "takes the server and credentials from the file: set no url, token_file or ca_file with it".into(),
            ));
        }
    } else if !api.context.is_empty() {
        return Err(invalid(
            "kube_api.context",
            "names a context of kube_api.kubeconfig, which is not set".into(),
        ));
    }
    if !api.url.is_empty() {
        let rest = api
            .url
            .strip_prefix("https://")
            .or_else(|| api.url.strip_prefix("http://"))
            .ok_or_else(|| {
                invalid(
                    "kube_api.url",
                    format!("{:?} is not an http(s) url", api.url),
                )
            })?;
        if rest.is_empty() || rest.contains(['?', '#', ' ']) {
            return Err(invalid(
                "kube_api.url",
                format!("{:?} has no host or has a query", api.url),
            ));
        }
        if api.url.starts_with("http://")
            && (!api.token_file.as_os_str().is_empty() || !api.ca_file.as_os_str().is_empty())
        {
            return Err(invalid(
                "kube_api.url",
                "an http:// url takes no token_file or ca_file: a token is never sent in clear text".into(),
            ));
        }
    }
    if !api.node_name.is_empty() && !valid_node_name(&api.node_name) {
        return Err(invalid(
            "kube_api.node_name",
            format!("{:?} is not a node name", api.node_name),
        ));
    }
    if !(10..=3600).contains(&api.watch_timeout_secs) {
        return Err(invalid(
            "kube_api.watch_timeout_secs",
            "must be 10..=3600".into(),
        ));
    }
    for (key, list) in [
        ("allowed_namespaces", &cfg.allowed_namespaces),
        ("denied_namespaces", &cfg.denied_namespaces),
    ] {
        if let Some(bad) = list.iter().find(|n| !valid_namespace(n)) {
            return Err(invalid(key, format!("{bad:?} is not a namespace name")));
        }
    }
    Ok(())
}

/// RFC 1123 subdomain: lower-case alphanumerics, `-` and `.`, at most 253,
/// starting and ending with an alphanumeric.
pub(crate) fn valid_node_name(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && s.bytes().next().is_some_and(alnum)
        && s.bytes().last().is_some_and(alnum)
}

/// RFC 1123 label: lower-case alphanumerics and `-`, at most 63.
fn valid_namespace(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The mode for a process of this node: [`resolve`] with this process's
/// environment and service account, the kernel's host name under `host_root`
/// (kubelet's default node name) and kubelet's kubeconfig at `kubelet_conf`.
pub fn resolve_on_host(cfg: &crate::config::Config, host_root: &Path, kubelet_conf: &Path) -> Mode {
    resolve(
        cfg,
        &|k| std::env::var(k).ok(),
        Path::new(SERVICE_ACCOUNT_DIR),
        kubelet_conf,
        &crate::inventory::host_name(host_root).unwrap_or_default(),
    )
}

/// The mode, from the config, environment lookups, the service account directory,
/// kubelet's kubeconfig and the host name (parameters, so that tests do not
/// depend on the machine).
///
/// Where the config names no API server, devgate finds one the way it runs:
/// in a pod, its service account; on the host (bootstrap's systemd unit),
/// kubelet's own kubeconfig, `kubelet_conf`, watching as the node. Only where
/// neither exists is the check off.
pub fn resolve(
    cfg: &crate::config::Config,
    env: &dyn Fn(&str) -> Option<String>,
    sa_dir: &Path,
    kubelet_conf: &Path,
    hostname: &str,
) -> Mode {
    resolve_in(cfg, env, sa_dir, kubelet_conf, hostname, Path::new("/"))
}

/// [`resolve`] as another process would, whose root is `root`
/// (`/proc/<pid>/root`): the paths given are that process's paths below
/// `root`, and the paths inside a kubeconfig are taken under `root`. Those
/// this reads or looks for (a kubeconfig and the files it names, the
/// service account's token, kubelet's kubeconfig) have their links followed
/// in `root` ([`crate::fsutil::follow_below_root`]), since the kernel would
/// take an absolute one met through `/proc/<pid>/root` (kubelet's
/// `kubelet-client-current.pem` is one) from this process's root; the token
/// and CA paths handed to the watch stay as given.
pub fn resolve_in(
    cfg: &crate::config::Config,
    env: &dyn Fn(&str) -> Option<String>,
    sa_dir: &Path,
    kubelet_conf: &Path,
    hostname: &str,
    root: &Path,
) -> Mode {
    if cfg.grant_check == Some(GrantCheck::Off) {
        return Mode::Off;
    }
    let api = &cfg.kube_api;
    // The node name: configured, `$NODE_NAME` (the DaemonSet's downward API),
    // the one a node's client certificate carries, or the host name.
    let named = [api.node_name.clone(), env("NODE_NAME").unwrap_or_default()]
        .into_iter()
        .find(|n| !n.is_empty());
    let node_name = |client: Option<&ClientCert>| {
        named
            .clone()
            .or_else(|| client.and_then(node_identity::node_name))
            .unwrap_or_else(|| {
                // Cloud nodes often register under another name (an EC2
                // node's private DNS name): the list would then be empty.
                tracing::warn!(node = %hostname.to_ascii_lowercase(), "grant check: no node name given (kube_api.node_name, NODE_NAME): the host name is used");
                hostname.to_ascii_lowercase()
            })
    };
    let path = |p: &PathBuf| (!p.as_os_str().is_empty()).then(|| Secret::File(p.clone()));
    let endpoint = |base: String, token, ca, client: Option<ClientCert>| Endpoint {
        base,
        token,
        ca,
        node_name: node_name(client.as_ref()),
        client,
        watch_timeout_secs: api.watch_timeout_secs,
    };
    // A kubeconfig, configured or found, that cannot be used fails closed: it
    // never turns the check off.
    let via_kubeconfig =
        |file: &Path, context: &str, what: &str| match kubeconfig::load_in(file, context, root) {
            Ok(k) => Mode::Requests(endpoint(k.server, k.token, k.ca, k.client)),
            Err(e) => Mode::Unavailable(format!("{what}: {e}")),
        };
    if !api.kubeconfig.as_os_str().is_empty() {
        return via_kubeconfig(&api.kubeconfig, &api.context, "kube_api.kubeconfig");
    }
    if !api.url.is_empty() {
        let base = api.url.trim_end_matches('/').to_string();
        return Mode::Requests(endpoint(
            base,
            path(&api.token_file),
            path(&api.ca_file),
            None,
        ));
    }
    let token = sa_dir.join("token");
    if let (Some(host), Some(port)) = (
        env("KUBERNETES_SERVICE_HOST"),
        env("KUBERNETES_SERVICE_PORT"),
    ) {
        if crate::fsutil::follow_below_root(root, &token).exists() {
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host
            };
            return Mode::Requests(endpoint(
                format!("https://{host}:{port}"),
                path(&api.token_file).or(Some(Secret::File(token))),
                path(&api.ca_file).or(Some(Secret::File(sa_dir.join("ca.crt")))),
                None,
            ));
        }
    }
    if crate::fsutil::follow_below_root(root, kubelet_conf).exists() {
        // Found rather than configured: the error says how to turn the check off.
        let what = format!(
            "kubelet's kubeconfig {} (set kube_api.kubeconfig, or grant_check = \"off\")",
            kubelet_conf.display()
        );
        return via_kubeconfig(kubelet_conf, "", &what);
    }
    match cfg.grant_check {
        Some(GrantCheck::Requests) => Mode::Unavailable(
            "grant_check is \"requests\" but no api server is configured (kube_api.kubeconfig or kube_api.url) or found (in-cluster service account)".into(),
        ),
        _ => Mode::Off,
    }
}
