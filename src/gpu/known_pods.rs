//! The pods of the node by UID, as the runtime names them to the plugin
//! (Synchronize, every CreateContainer), so that GPU teardown can tell a node
//! daemon run as a pod from a tenant. Daemons that load NVML (koordlet,
//! NVIDIA's device plugin, DCGM) keep every GPU open: `nvmlInit` attaches to
//! each one. Their cgroups carry their pod's UID, which no `ignored_cgroups`
//! entry can name in advance; `gpu.ignored_pods` names them by namespace and
//! pod-name prefix, places only the cluster's operators create pods in.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::PodCgroups;

/// More pods than a node runs (kubelet's default limit is 110).
const MAX_PODS: usize = 4096;

#[derive(Default)]
pub struct KnownPods {
    /// Sandbox id → (UID, `namespace/name`). By sandbox: a pod's sandbox
    /// recreated keeps its UID, and the old one's removal must not forget
    /// the new one.
    pods: Mutex<HashMap<String, (String, String)>>,
}

impl KnownPods {
    /// Records a pod sandbox; cheap when it is known already (every
    /// container creation names its pod).
    pub fn note(&self, sandbox_id: &str, uid: &str, namespace: &str, name: &str) {
        if uid.is_empty() {
            return;
        }
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        if pods.contains_key(sandbox_id) || pods.len() >= MAX_PODS {
            return;
        }
        let pod = (uid.to_string(), format!("{namespace}/{name}"));
        pods.insert(sandbox_id.to_string(), pod);
    }

    pub fn forget(&self, sandbox_id: &str) {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.remove(sandbox_id);
    }

    /// The cgroups of the known pods one of `patterns` (`namespace/name-prefix`)
    /// names.
    pub fn cgroups_of(&self, patterns: &[String]) -> PodCgroups {
        let pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.values()
            .filter(|(_, pod)| patterns.iter().any(|p| names(p, pod)))
            .fold(PodCgroups::none(), |all, (uid, _)| {
                all.merged(PodCgroups::from_uid(uid))
            })
    }
}

/// `namespace/prefix` names `namespace/name` when the namespaces are equal
/// and the name starts with the prefix.
fn names(pattern: &str, pod: &str) -> bool {
    let (Some((pns, prefix)), Some((ns, name))) = (pattern.split_once('/'), pod.split_once('/'))
    else {
        return false;
    };
    pns == ns && name.starts_with(prefix)
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
        let patterns = vec![
            "koordinator-system/koordlet-".to_string(),
            "gpu-operator/nvidia-dcgm-".to_string(),
        ];
        let cgroups = known.cgroups_of(&patterns);
        let cg = |uid: &str| format!("0::/kubepods/besteffort/pod{uid}/c1\n");
        assert!(cgroups.contains(&cg("u-koordlet")));
        assert!(cgroups.contains(&cg("u-dcgm")));
        assert!(!cgroups.contains(&cg("u-tenant")), "another namespace");
        known.forget("s3");
        assert!(known.cgroups_of(&patterns).contains(&cg("u-dcgm")));
        known.forget("s4");
        assert!(!known.cgroups_of(&patterns).contains(&cg("u-dcgm")));
        assert!(known.cgroups_of(&[]).is_empty());
    }
}
