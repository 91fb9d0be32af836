//! How the plugin checks grants on this node (`crate::grant`): the API
//! server, the credentials and the node name it resolves from the config and
//! what it has (its environment, a service account, kubelet's kubeconfig).
//! Where a plugin runs, they are read as it has them, through procfs: doctor
//! is often run from a shell on the node, whose environment and files are not
//! those of a plugin in a DaemonSet's pod. Nothing is dialled.
use std::path::{Path, PathBuf};

use super::host::Roots;
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
    /// `None` where its environment cannot be read (not root, or gone).
    fn read(proc_dir: &Path, pid: u32) -> Option<PluginView> {
        use std::io::Read;
        let dir = proc_dir.join(pid.to_string());
        let mut environ = Vec::new();
        std::fs::File::open(dir.join("environ"))
            .and_then(|f| f.take(MAX_ENVIRON_BYTES).read_to_end(&mut environ))
            .ok()?;
        Some(PluginView {
            pid,
            environ,
            root: dir.join("root"),
        })
    }

    fn var(&self, key: &str) -> Option<String> {
        self.environ
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(key.as_bytes())?.strip_prefix(b"="))
            .and_then(|v| String::from_utf8(v.to_vec()).ok())
    }

    /// `path` (absolute) in the plugin's mount namespace.
    fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

/// `plugin`: the pid of the running plugin the checks are about, if any.
pub fn grant_check(roots: &Roots, config: &Config, plugin: Option<u32>) -> Check {
    let hostname = grant::settings::host_name(&roots.host_root);
    let view = plugin.map(|pid| (pid, PluginView::read(&roots.proc_dir, pid)));
    let (mode, whose) = match &view {
        Some((_, Some(p))) => (
            grant::settings::resolve(
                config,
                &|k| p.var(k),
                &p.path(grant::SERVICE_ACCOUNT_DIR),
                &p.path(grant::KUBELET_KUBECONFIG),
                &hostname,
            ),
            format!(", as the running plugin (pid {}) resolves it", p.pid),
        ),
        own => (
            grant::settings::resolve(
                config,
                &|k| std::env::var(k).ok(),
                Path::new(grant::SERVICE_ACCOUNT_DIR),
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
