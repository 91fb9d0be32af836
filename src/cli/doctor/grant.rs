//! How the plugin checks grants on this node (`crate::grant`): the API
//! server, the credentials and the node name it resolves from the config and
//! what it has (its environment, a service account, kubelet's kubeconfig).
//! Where a plugin runs, they are read as it has them, through procfs: doctor
//! is often run from a shell on the node, whose environment and files are not
//! those of a plugin in a DaemonSet's pod. Nothing is dialled.
use std::path::{Path, PathBuf};

use super::host::{Host, Roots};
use super::Check;
use crate::config::Config;
use crate::grant::{self, Mode};

const NAME: &str = "grant check";
/// Longest environment read of the running plugin.
const MAX_ENVIRON_BYTES: u64 = 256 * 1024;

/// The running plugin as the grant check's resolution sees it: the
/// environment it was started with and its root directory.
struct PluginView {
    pid: u32,
    environ: Vec<u8>,
    root: PathBuf,
}

impl PluginView {
    /// `None` where its environment cannot be read (not root, gone: the
    /// kernel gives an exiting process's as empty, or past the bound).
    fn read(roots: &Roots, pid: u32) -> Option<PluginView> {
        let environ = roots.proc_dir.join(pid.to_string()).join("environ");
        let environ = crate::fsutil::read_file_bounded(&environ, MAX_ENVIRON_BYTES).ok()?;
        if environ.is_empty() {
            return None;
        }
        Some(PluginView {
            pid,
            environ,
            root: roots.process_root(pid),
        })
    }

    fn var(&self, key: &str) -> Option<String> {
        self.environ
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(key.as_bytes())?.strip_prefix(b"="))
            .and_then(|v| String::from_utf8(v.to_vec()).ok())
    }

    /// `path` (absolute) in the plugin's mount namespace, as written: what
    /// reads it follows its links in the plugin's root
    /// ([`crate::fsutil::follow_below_root`]).
    fn path(&self, path: impl AsRef<Path>) -> PathBuf {
        crate::fsutil::below_root(&self.root, path.as_ref())
    }

    /// `config` with the files it names as the plugin opens them, in its
    /// mount namespace, wherever doctor read the config from: they are the
    /// plugin's to read. A path not set stays unset; a relative token or CA
    /// file is taken from the plugin's root (the kubeconfig's must be
    /// absolute). The files a kubeconfig names are taken under the plugin's
    /// root too ([`grant::settings::resolve_in`]).
    fn config(&self, config: &Config) -> Config {
        let mut config = config.clone();
        let api = &mut config.kube_api;
        for file in [&mut api.kubeconfig, &mut api.token_file, &mut api.ca_file] {
            if !file.as_os_str().is_empty() {
                *file = self.path(&*file);
            }
        }
        config
    }
}

/// `plugin`: the pid of the running plugin the checks are about, if any.
pub fn grant_check(roots: &Roots, host: &dyn Host, config: &Config, plugin: Option<u32>) -> Check {
    let hostname = crate::inventory::host_name(&roots.host_root).unwrap_or_default();
    let view = plugin.map(|pid| (pid, PluginView::read(roots, pid)));
    let (mode, whose) = match &view {
        Some((_, Some(p))) => (
            grant::settings::resolve_in(
                &p.config(config),
                &|k| p.var(k),
                &p.path(grant::SERVICE_ACCOUNT_DIR),
                &p.path(grant::KUBELET_KUBECONFIG),
                &hostname,
                &p.root,
            ),
            format!(", as the running plugin (pid {}) resolves it", p.pid),
        ),
        own => (
            grant::settings::resolve(
                config,
                &|k| host.env(k),
                &host.service_account_dir(),
                &roots.host_path(Path::new(grant::KUBELET_KUBECONFIG)),
                &hostname,
            ),
            match own {
                Some((pid, None)) => format!(" (resolved with doctor's environment: that of the running plugin, pid {pid}, is unreadable)"),
                _ => String::new(),
            },
        ),
    };
    match mode {
        Mode::Requests(ep) => {
            let with = match (&ep.client, &ep.token) {
                (Some(_), _) => "a client certificate",
                (None, Some(_)) => "a bearer token",
                (None, None) => "no credentials",
            };
            Check::pass(
                NAME,
                format!(
                    "pods of node {} from {} with {with}{whose}",
                    ep.node_name, ep.base
                ),
            )
        }
        Mode::Off => Check::warn(
            NAME,
            format!("off: allocations are applied as the annotation says, unchecked against the pod's requests{whose}"),
            "set kube_api.kubeconfig (kubelet's /etc/kubernetes/kubelet.conf) or run devgate in-cluster",
        ),
        Mode::Unavailable(reason) => Check::fail(
            NAME,
            format!("{reason}: every allocation would be refused{whose}"),
            "fix the kubeconfig or kube_api settings, or set grant_check = \"off\"",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Variables by exact name, the first of a name as getenv takes it;
    /// a value that is not UTF-8 is none.
    #[test]
    fn the_plugins_variables_are_found_by_exact_name() {
        let view = PluginView {
            pid: 1,
            environ: b"NODE_NAMEX=x\0NODE_NAME=a\0NODE_NAME=b\0BAD=\xff\0EMPTY=\0=odd\0".to_vec(),
            root: PathBuf::from("/proc/1/root"),
        };
        assert_eq!(view.var("NODE_NAME").as_deref(), Some("a"));
        assert_eq!(view.var("NODE_NAMEX").as_deref(), Some("x"));
        assert_eq!(view.var("BAD"), None);
        assert_eq!(view.var("EMPTY").as_deref(), Some(""));
        assert_eq!(view.var("NODE"), None);
        assert_eq!(
            view.path("/var/run/x"),
            PathBuf::from("/proc/1/root/var/run/x")
        );
    }
}
