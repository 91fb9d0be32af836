//! The node's daemon pods by UID, as the runtime names them to the plugin
//! (Synchronize, RunPodSandbox, every CreateContainer), so that GPU teardown
//! can tell a node daemon run as a pod from a tenant. Daemons that load NVML (koordlet,
//! NVIDIA's device plugin, DCGM) keep every GPU open: `nvmlInit` attaches to
//! each one. Their cgroups carry their pod's UID, which no `ignored_cgroups`
//! entry can name in advance; `gpu.ignored_pods` names them by namespace and
//! DaemonSet name, in namespaces only the cluster's operators create pods in.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::fsutil::FsError;

use super::PodCgroups;

/// More pods than a node runs (kubelet's default limit is 110).
const MAX_PODS: usize = 4096;
/// The daemon file's bound.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Where the plugin keeps its daemon pods, under its state directory.
pub const DAEMON_PODS_FILE: &str = "daemon-pods.json";

#[derive(serde::Deserialize)]
struct SavedDaemon {
    uid: String,
    pod: String,
}

#[derive(Default)]
pub struct KnownPods {
    /// Sandbox id → (UID, `namespace/name`). By sandbox: a pod's sandbox
    /// recreated keeps its UID, and the old one's removal must not forget
    /// the new one.
    pods: Mutex<HashMap<String, (String, String)>>,
    /// The cap was met and said so once.
    full: AtomicBool,
}

impl KnownPods {
    /// Records a pod sandbox; cheap when it is known already (every
    /// container creation names its pod). True when it was new.
    pub fn note(&self, sandbox_id: &str, uid: &str, namespace: &str, name: &str) -> bool {
        if uid.is_empty() {
            return false;
        }
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        if pods.contains_key(sandbox_id) {
            return false;
        }
        if pods.len() >= MAX_PODS {
            if !self.full.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    max = MAX_PODS,
                    "too many pods to know: gpu.ignored_pods misses the newer ones"
                );
            }
            return false;
        }
        let pod = (uid.to_string(), format!("{namespace}/{name}"));
        pods.insert(sandbox_id.to_string(), pod);
        true
    }

    /// Keeps only the sandboxes the runtime lists now (Synchronize): those
    /// removed while the plugin was away are gone.
    pub fn keep_only(&self, sandbox_ids: &HashSet<&str>) {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.retain(|id, _| sandbox_ids.contains(id.as_str()));
        if pods.len() < MAX_PODS {
            self.full.store(false, Ordering::Relaxed);
        }
    }

    /// How many sandboxes are known.
    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Forgets a removed sandbox; true when it was known.
    pub fn forget(&self, sandbox_id: &str) -> bool {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.remove(sandbox_id).is_some()
    }

    /// The known pods `patterns` names, as (UID, `namespace/name`), sorted.
    pub fn daemons(&self, patterns: &[String]) -> Vec<(String, String)> {
        let pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<(String, String)> = pods
            .values()
            .filter(|(_, pod)| named(patterns, pod))
            .cloned()
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Writes the daemon pods for processes that cannot ask the runtime
    /// (`devgate clear`): `[{"uid": .., "pod": "namespace/name"}]`.
    pub fn save_daemons(&self, patterns: &[String], path: &Path) -> Result<(), FsError> {
        let list: Vec<serde_json::Value> = self
            .daemons(patterns)
            .into_iter()
            .map(|(uid, pod)| serde_json::json!({ "uid": uid, "pod": pod }))
            .collect();
        let text = serde_json::Value::Array(list).to_string();
        crate::fsutil::replace_file_mode(path, text.as_bytes(), 0o600)
    }

    /// What [`Self::save_daemons`] wrote; empty when it cannot be read.
    pub fn load_daemons(path: &Path) -> KnownPods {
        let known = KnownPods::default();
        let Ok(bytes) = crate::fsutil::read_file_bounded(path, MAX_FILE_BYTES) else {
            return known;
        };
        let list: Vec<SavedDaemon> = serde_json::from_slice(&bytes).unwrap_or_default();
        for d in list.iter().take(MAX_PODS) {
            let Some((ns, name)) = d.pod.split_once('/') else {
                continue;
            };
            known.note(&d.uid, &d.uid, ns, name);
        }
        known
    }

    /// The cgroups of the known pods one of `patterns` (`namespace/daemonset`)
    /// names.
    pub fn cgroups_of(&self, patterns: &[String]) -> PodCgroups {
        self.daemons(patterns)
            .iter()
            .fold(PodCgroups::none(), |all, (uid, _)| {
                all.merged(PodCgroups::from_uid(uid))
            })
    }
}

/// Whether one of `patterns` names the pod `namespace/name`.
pub fn is_daemon(patterns: &[String], namespace: &str, name: &str) -> bool {
    patterns.iter().any(|p| names(p, namespace, name))
}

fn named(patterns: &[String], pod: &str) -> bool {
    pod.split_once('/')
        .is_some_and(|(ns, name)| is_daemon(patterns, ns, name))
}

/// `namespace/daemonset` names `namespace/name` when the namespaces are
/// equal and the name is the DaemonSet's followed by one generated suffix
/// (`<daemonset>-<suffix>`, the suffix without `-`): `nvidia-device-plugin`
/// names `nvidia-device-plugin-x7k2p`, never the MPS control daemon's
/// `nvidia-device-plugin-mps-control-daemon-x7k2p`, which runs tenants' work.
fn names(pattern: &str, ns: &str, name: &str) -> bool {
    let Some((pns, daemonset)) = pattern.split_once('/') else {
        return false;
    };
    let suffix = name
        .strip_prefix(daemonset)
        .and_then(|rest| rest.strip_prefix('-'));
    pns == ns && suffix.is_some_and(|s| !s.is_empty() && !s.contains('-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_name_pods_by_namespace_and_name_prefix() {
        let known = KnownPods::default();
        known.note("s1", "u-koordlet", "koordinator-system", "koordlet-x7k2p");
        known.note("s2", "u-tenant", "team-a", "koordlet-fake");
        known.note("s3", "u-dcgm", "gpu-operator", "nvidia-dcgm-exporter-abcde");
        // Its sandbox recreated: the old one's removal keeps the pod.
        known.note("s4", "u-dcgm", "gpu-operator", "nvidia-dcgm-exporter-abcde");
        known.note(
            "s5",
            "u-mps",
            "gpu-operator",
            "nvidia-dcgm-mps-control-daemon-x7k2p",
        );
        let patterns = vec![
            "koordinator-system/koordlet".to_string(),
            "gpu-operator/nvidia-dcgm-exporter".to_string(),
        ];
        let cgroups = known.cgroups_of(&patterns);
        let cg = |uid: &str| format!("0::/kubepods/besteffort/pod{uid}/c1\n");
        assert!(cgroups.contains(&cg("u-koordlet")));
        assert!(cgroups.contains(&cg("u-dcgm")));
        assert!(!cgroups.contains(&cg("u-tenant")), "another namespace");
        assert!(!cgroups.contains(&cg("u-mps")), "another daemonset");
        known.forget("s3");
        assert!(known.cgroups_of(&patterns).contains(&cg("u-dcgm")));
        known.forget("s4");
        assert!(!known.cgroups_of(&patterns).contains(&cg("u-dcgm")));
        // Synchronize: what the runtime no longer lists is forgotten.
        known.keep_only(&["s2"].into_iter().collect());
        assert!(!known.cgroups_of(&patterns).contains(&cg("u-koordlet")));
        assert!(known.cgroups_of(&[]).is_empty());
    }

    #[test]
    fn daemons_are_saved_for_devgate_clear() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DAEMON_PODS_FILE);
        let known = KnownPods::default();
        assert!(known.note("s1", "u-koordlet", "koordinator-system", "koordlet-x7k2p"));
        assert!(!known.note("s1", "u-koordlet", "koordinator-system", "koordlet-x7k2p"));
        known.note("s2", "u-tenant", "team-a", "trainer-0");
        let patterns = vec!["koordinator-system/koordlet".to_string()];
        known.save_daemons(&patterns, &path).unwrap();
        let loaded = KnownPods::load_daemons(&path);
        let cg = |uid: &str| format!("0::/kubepods/besteffort/pod{uid}/c1\n");
        assert!(loaded.cgroups_of(&patterns).contains(&cg("u-koordlet")));
        assert_eq!(loaded.daemons(&["team-a/trainer".to_string()]), vec![]);
        assert!(KnownPods::load_daemons(&dir.path().join("none"))
            .daemons(&patterns)
            .is_empty());
    }
}
