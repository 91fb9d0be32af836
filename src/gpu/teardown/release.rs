//! A pod's release as the ledger runs it: its GPUs cleaned, and those that
//! could not be named, so that the ledger keeps only them.

use crate::ledger::{DeviceId, PodRecord, Teardown, Unclean};

use super::super::GpuError;
use super::{Fault, GpuTeardown, Target};

impl Teardown for GpuTeardown {
    fn teardown(&self, pod: &PodRecord) -> Result<(), Unclean> {
        let sandbox = pod.pod.sandbox_id.as_str();
        let (targets, mut faults) = self.targets(pod);
        if !targets.is_empty() {
            faults.extend(self.clean(&self.pod_cgroups_of(pod), &targets));
        }
        // A GPU that could not be looked at (not in the inventory, its claims
        // unreadable) had its holders neither found nor ended: one of the
        // pod's, still running, could open any GPU of the pod later.
        if !faults.is_empty() && unplaced(pod, &targets) {
            let all = pod.claims.iter().filter_map(|c| match &c.device {
                DeviceId::Gpu(uuid) => Some(uuid.as_str()),
                _ => None,
            });
            Fault::widen(&mut faults, all);
        }
        let unclean = Fault::gpus_of(&faults);
        let clean = targets.iter().map(|t| t.uuid.as_str());
        self.mark_released(sandbox, clean.filter(|u| !unclean.contains(u)));
        if faults.is_empty() {
            // Every pod's paths are kept (an RDMA-only pod's too): forgotten
            // here; a pod keeping a GPU needs them for its retry.
            self.forget_pod(sandbox);
            return Ok(());
        }
        let gpus: Vec<DeviceId> = unclean
            .iter()
            .map(|u| DeviceId::Gpu(u.to_string()))
            .collect();
        let errors: Vec<GpuError> = faults.into_iter().map(|f| f.error).collect();
        Err(Unclean::of(gpus, nri::ErrorChain::join(&errors)))
    }
}

/// Whether a GPU the pod claimed is not among the targets looked at.
fn unplaced(pod: &PodRecord, targets: &[Target]) -> bool {
    pod.claims.iter().any(|c| match &c.device {
        DeviceId::Gpu(uuid) => !targets.iter().any(|t| &t.uuid == uuid),
        _ => false,
    })
}
