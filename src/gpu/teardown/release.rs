//! A pod's release as the ledger runs it: its GPUs cleaned, and those that
//! could not be named, so that the ledger keeps only them.

use std::collections::BTreeSet;

use crate::ledger::{Claim, DeviceId, PodRecord, Teardown, Unclean};

use super::super::GpuError;
use super::{Fault, GpuTeardown};

impl Teardown for GpuTeardown {
    fn teardown(&self, pod: &PodRecord) -> Result<(), Unclean> {
        let sandbox = pod.pod.sandbox_id.as_str();
        // Faults already: GPUs that could not be looked at (not in the
        // inventory, their claims unreadable), whose holders are neither
        // found nor ended: one of the pod's, still running, could open any
        // GPU of the pod later.
        let (targets, mut faults) = self.targets(pod);
        let unplaced = !faults.is_empty();
        if !targets.is_empty() {
            let cgroups = self.pod_cgroups_of(pod);
            // The containers the ledger recorded for the sandbox (every one
            // of a pod with an allocation, given the GPUs or not): only they
            // can have device rules for the GPUs (the sandbox's processes,
            // or a new sandbox's of the same pod, have none).
            let ids: Vec<&str> = pod.containers.keys().map(String::as_str).collect();
            let granted = cgroups.clone().only_containers(&ids);
            faults.extend(self.clean(&cgroups, &granted, &targets));
        }
        if unplaced {
            Fault::widen(&mut faults, pod.claims.iter().filter_map(Claim::gpu));
        }
        let unclean = Fault::gpus_of(&faults);
        let clean = targets.iter().map(|t| t.uuid.as_str());
        self.mark_released(sandbox, clean.filter(|u| !unclean.contains(u)));
        // The pod's cgroup paths stay: the ledger may keep the pod (a
        // container joined it meanwhile), and one keeping a GPU needs them
        // for its retry. The plugin forgets them once the release committed,
        // and at the sandbox's removal.
        if faults.is_empty() {
            return Ok(());
        }
        let gpus: Vec<DeviceId> = unclean
            .iter()
            .map(|u| DeviceId::Gpu(u.to_string()))
            .collect();
        // A reset, an outside user, NVML: the GPU itself is in doubt. Only a
        // GPU no such fault names has the pod's own processes alone left.
        let own =
            |e: &GpuError| matches!(e, GpuError::Survived { .. } | GpuError::StillForking { .. });
        let doubted: BTreeSet<&str> = faults
            .iter()
            .filter(|f| !own(&f.error))
            .flat_map(|f| f.gpus.iter().map(String::as_str))
            .collect();
        let pods_own: Vec<DeviceId> = unclean
            .iter()
            .filter(|u| !doubted.contains(*u))
            .map(|u| DeviceId::Gpu(u.to_string()))
            .collect();
        let errors: Vec<GpuError> = faults.into_iter().map(|f| f.error).collect();
        Err(Unclean::of(gpus, nri::ErrorChain::join(&errors)).pods_own(pods_own))
    }

    fn kept(&self, pod: &PodRecord) {
        self.unmark_released(&pod.pod.sandbox_id);
    }
}
