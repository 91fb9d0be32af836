//! The API server and credentials from a kubeconfig file, typically kubelet's own
//! (`/etc/kubernetes/kubelet.conf`): the watch then runs as the node, whom the
//! Node authorizer lets list and watch the pods bound to it (with
//! `fieldSelector=spec.nodeName=<node>` only, since AuthorizeNodeWithSelectors,
//! KEP-4601, beta in 1.32).
//!
//! The subset read is client-go's (`clientcmd/api/v1`): `current-context` (or a
//! named context) selects a cluster and a user; `certificate-authority(-data)`,
//! `client-certificate(-data)`/`client-key(-data)`, `token`/`tokenFile`. `-data`
//! wins over the file, relative paths are relative to the kubeconfig's directory,
//! as in client-go. What would make the connection weaker or run other programs
//! (`insecure-skip-tls-verify`, `exec`, `auth-provider`, basic auth) or what the
//! HTTP client cannot honour (`tls-server-name`, `proxy-url`) is refused rather
//! than ignored.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use super::credentials::{ClientCert, Secret};
use crate::fsutil::BoundedError;

/// Largest kubeconfig read; kubelet's is about 2 KiB with inline certificates.
pub const MAX_KUBECONFIG_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("read kubeconfig {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kubeconfig {path} is larger than {MAX_KUBECONFIG_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("decode kubeconfig: {0}")]
    Decode(String),
    #[error("kubeconfig has no {kind} named {name:?}")]
    Missing { kind: &'static str, name: String },
    #[error("kubeconfig: {what} is not supported: {why}")]
    Unsupported {
        what: &'static str,
        why: &'static str,
    },
    #[error("kubeconfig: {field} is not valid base64: {reason}")]
    Base64 { field: &'static str, reason: String },
    #[error("kubeconfig: cluster {cluster:?}: server {server:?} {reason}")]
    Server {
        cluster: String,
        server: String,
        reason: &'static str,
    },
    #[error("kubeconfig: user {user:?}: {reason}")]
    User { user: String, reason: &'static str },
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct File {
    clusters: Vec<Named<Cluster>>,
    users: Vec<Named<User>>,
    contexts: Vec<Named<Context>>,
    #[serde(rename = "current-context")]
    current_context: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Named<T: Default> {
    name: String,
    // client-go names the inner object after its kind.
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    item: T,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
struct Cluster {
    server: String,
    certificate_authority: String,
    certificate_authority_data: String,
    insecure_skip_tls_verify: bool,
    tls_server_name: String,
    proxy_url: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
struct User {
    client_certificate: String,
    client_certificate_data: String,
    client_key: String,
    client_key_data: String,
    token: String,
    #[serde(rename = "tokenFile")]
    token_file: String,
    username: String,
    password: String,
    exec: Option<serde_yaml_ng::Value>,
    auth_provider: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Context {
    cluster: String,
    user: String,
}

/// What the watch needs from a kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// Scheme, host, port and any path prefix, no trailing slash.
    pub server: String,
    pub ca: Option<Secret>,
    pub client: Option<ClientCert>,
    pub token: Option<Secret>,
}

/// Where the files a kubeconfig names are: relative to its directory, and
/// absolute ones under `root`, `/` for this process, a process's
/// `/proc/<pid>/root` to see them as it does.
#[derive(Debug, Clone, Copy)]
struct Files<'a> {
    dir: &'a Path,
    root: &'a Path,
}

impl Files<'_> {
    /// Where this process finds `file`, with the links on the way followed
    /// as the process whose root is `root` follows them.
    fn at(&self, file: &str) -> PathBuf {
        let file = Path::new(file);
        let in_root = match (file.is_absolute(), self.dir.strip_prefix(self.root)) {
            (true, _) => file.to_path_buf(),
            (false, Ok(dir)) => Path::new("/").join(dir).join(file),
            // A directory outside the root: relative to it as it is.
            (false, Err(_)) => return self.dir.join(file),
        };
        crate::fsutil::resolve_below_root(self.root, &in_root)
    }
}

/// Reads and resolves the kubeconfig at `path` (`context` empty: its
/// `current-context`).
pub fn load(path: &Path, context: &str) -> Result<Credentials, KubeconfigError> {
    load_in(path, context, Path::new("/"))
}

/// [`load`] as the process whose root is `root` loads it: `path` is its path
/// below `root`, read with its links followed there; the files it names are
/// taken under `root` the same way, a relative one beside `path` as written.
pub fn load_in(path: &Path, context: &str, root: &Path) -> Result<Credentials, KubeconfigError> {
    let read = |source| KubeconfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    // Read where `root`'s process finds it; its relative files are beside the
    // path as written, as they are for that process.
    let file = crate::fsutil::follow_below_root(root, path);
    let text = match crate::fsutil::read_text_bounded(&file, MAX_KUBECONFIG_BYTES) {
        Ok(text) => text,
        Err(BoundedError::Io(source)) => return Err(read(source)),
        Err(BoundedError::TooLarge { .. }) => {
            return Err(KubeconfigError::TooLarge {
                path: path.to_path_buf(),
            })
        }
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    parse_in(&text, Files { dir, root }, context)
}

fn find<'a, T: Default>(
    list: &'a [Named<T>],
    kind: &'static str,
    name: &str,
) -> Result<&'a T, KubeconfigError> {
    list.iter()
        .find(|n| n.name == name)
        .map(|n| &n.item)
        .ok_or_else(|| KubeconfigError::Missing {
            kind,
            name: name.to_string(),
        })
}

/// `-data` (base64) if set, else the file, else none.
fn secret(
    data: &str,
    file: &str,
    field: &'static str,
    files: Files<'_>,
) -> Result<Option<Secret>, KubeconfigError> {
    if !data.is_empty() {
        let compact: String = data.split_ascii_whitespace().collect();
        return base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map(|b| Some(Secret::Inline(b)))
            .map_err(|e| KubeconfigError::Base64 {
                field,
                reason: e.to_string(),
            });
    }
    Ok((!file.is_empty()).then(|| Secret::File(files.at(file))))
}

/// Resolves `text` (a kubeconfig whose relative paths are relative to `dir`).
pub fn parse(text: &str, dir: &Path, context: &str) -> Result<Credentials, KubeconfigError> {
    let root = Path::new("/");
    parse_in(text, Files { dir, root }, context)
}

fn parse_in(text: &str, files: Files<'_>, context: &str) -> Result<Credentials, KubeconfigError> {
    let file: File =
        serde_yaml_ng::from_str(text).map_err(|e| KubeconfigError::Decode(e.to_string()))?;
    let name = if context.is_empty() {
        file.current_context.as_str()
    } else {
        context
    };
    if name.is_empty() {
        return Err(KubeconfigError::Missing {
            kind: "current-context",
            name: String::new(),
        });
    }
    let ctx = find(&file.contexts, "context", name)?;
    let cluster = find(&file.clusters, "cluster", &ctx.cluster)?;
    let user = find(&file.users, "user", &ctx.user)?;
    let unsupported = |what, why| Err(KubeconfigError::Unsupported { what, why });
    if cluster.insecure_skip_tls_verify {
        return unsupported(
            "insecure-skip-tls-verify",
            "the api server's certificate is always verified",
        );
    }
    if !cluster.tls_server_name.is_empty() {
        return unsupported(
            "tls-server-name",
            "the server is verified by its url's host",
        );
    }
    if !cluster.proxy_url.is_empty() {
        return unsupported("proxy-url", "the api server is reached directly");
    }
    if user.exec.is_some() || user.auth_provider.is_some() {
        return unsupported(
            "exec and auth-provider credentials",
            "devgate runs no credential plugin; use a client certificate or a token",
        );
    }
    if !user.username.is_empty() || !user.password.is_empty() {
        return unsupported("basic auth", "use a client certificate or a token");
    }
    let server = cluster.server.trim_end_matches('/').to_string();
    let bad_server = |reason| KubeconfigError::Server {
        cluster: ctx.cluster.clone(),
        server: cluster.server.clone(),
        reason,
    };
    let rest = server
        .strip_prefix("https://")
        .or_else(|| server.strip_prefix("http://"))
        .ok_or_else(|| bad_server("is not an http(s) url"))?;
    if rest.is_empty() || rest.contains(['?', '#', ' ']) {
        return Err(bad_server("has no host or has a query"));
    }
    let ca = secret(
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
        "certificate-authority-data",
        files,
    )?;
    let cert = secret(
        &user.client_certificate_data,
        &user.client_certificate,
        "client-certificate-data",
        files,
    )?;
    let key = secret(
        &user.client_key_data,
        &user.client_key,
        "client-key-data",
        files,
    )?;
    let bad_user = |reason| KubeconfigError::User {
        user: ctx.user.clone(),
        reason,
    };
    let client = match (cert, key) {
        (Some(cert), Some(key)) => Some(ClientCert { cert, key }),
        (None, None) => None,
        _ => {
            return Err(bad_user(
                "a client certificate needs both certificate and key",
            ))
        }
    };
    let token = if !user.token.is_empty() {
        Some(Secret::Inline(user.token.trim().as_bytes().to_vec()))
    } else {
        (!user.token_file.is_empty()).then(|| Secret::File(files.at(&user.token_file)))
    };
    if server.starts_with("http://") && (token.is_some() || client.is_some() || ca.is_some()) {
        return Err(bad_server(
            "is http://: credentials are never sent in clear text",
        ));
    }
    Ok(Credentials {
        server,
        ca,
        client,
        token,
    })
}

#[cfg(test)]
#[path = "kubeconfig_tests.rs"]
mod tests;
