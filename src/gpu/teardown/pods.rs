//! What a teardown keeps of each pod: the cgroups NRI named, by which the
//! pod's leftover processes are found at its release.

use super::GpuTeardown;
use crate::gpu::cgroup::PodCgroups;
use crate::ledger::PodRecord;

impl GpuTeardown {
    /// Forgets what is kept of a pod that is gone.
    pub fn forget_pod(&self, sandbox_id: &str) {
        let mut map = self.pod_cgroups.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(sandbox_id);
    }

    /// The pod's cgroup paths as NRI gave them (sandbox `linux.cgroup_parent`,
    /// containers' `linux.cgroups_path`). Without them the pod UID is used.
    pub fn set_pod_cgroups<S: AsRef<str>>(&self, sandbox_id: &str, paths: &[S]) {
        let mut map = self.pod_cgroups.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(sandbox_id.to_string()).or_default();
        *entry = std::mem::take(entry).merged(PodCgroups::from_paths(paths));
    }

    /// A removed container's own cgroup, no longer the pod's (see
    /// [`PodCgroups::forget_container`]); `pod_paths` are the sandbox's.
    pub fn forget_container_cgroup<S: AsRef<str>>(
        &self,
        sandbox_id: &str,
        pod_paths: &[S],
        container_id: &str,
        container_path: &str,
    ) {
        let mut map = self.pod_cgroups.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get_mut(sandbox_id) {
            let pod = PodCgroups::from_paths(pod_paths);
            entry.forget_container(container_path, container_id, &pod);
        }
    }

    /// The pod's cgroups as kept for its release.
    #[cfg(test)]
    pub fn pod_cgroups(&self, sandbox_id: &str) -> Option<PodCgroups> {
        let map = self.pod_cgroups.lock().unwrap_or_else(|p| p.into_inner());
        map.get(sandbox_id).cloned()
    }

    /// The released pod's processes: by its cgroups and UID, or, while
    /// another sandbox of the same pod holds devices (kubelet recreated the
    /// sandbox; both run in the pod's cgroup), by its own containers' and
    /// sandbox's ids only. Where the ledger cannot say, the narrower choice:
    /// a process of the live sandbox must never be ended for the old one.
    pub(super) fn pod_cgroups_of(&self, pod: &PodRecord) -> PodCgroups {
        let known = {
            let map = self.pod_cgroups.lock().unwrap_or_else(|p| p.into_inner());
            map.get(&pod.pod.sandbox_id).cloned().unwrap_or_default()
        };
        let all = known.merged(PodCgroups::from_uid(&pod.pod.uid));
        let sandbox = &pod.pod.sandbox_id;
        match self.claims.siblings(&pod.pod) {
            Ok(others) if others.is_empty() => return all,
            Ok(others) => {
                tracing::info!(%sandbox, ?others, "another sandbox of the pod holds devices: only this sandbox's containers are ended")
            }
            Err(error) => {
                tracing::warn!(%sandbox, %error, "the pod's other sandboxes unknown: only this sandbox's containers are ended")
            }
        }
        let ids: Vec<&str> = pod
            .containers
            .keys()
            .map(String::as_str)
            .chain([pod.pod.sandbox_id.as_str()])
            .collect();
        all.only_containers(&ids)
    }
}
