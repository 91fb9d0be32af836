//! The pod's claim, made when its sandbox starts (RunPodSandbox).
//!
//! Claims are the pod sandbox's, and the runtime reports the sandbox with its
//! annotations before any of its containers, so the claim is made there rather
//! than by the first container: the container-start path is then the same for
//! a pod's first container as for its further ones (the prepared plan, the
//! container's record). Nothing is refused here: a sandbox start that fails
//! shows as a sandbox error, not as the container error kubelet reports for a
//! refused allocation, so whatever fails or is not decided yet (a pod the grant
//! watch has not delivered) is left to the first container, which runs every
//! step again and is refused with the annotation, the entry and the reason. The
//! runtime sends RemovePodSandbox for a sandbox whose start fails after its
//! NRI call, which releases the claim; one that an NRI plugin called after
//! devgate refuses gets none, and its claim goes when the pod's next sandbox
//! starts (`DevgatePlugin::release_superseded`).

use std::sync::Arc;

use nri::api::{Container, PodSandbox};

use crate::allocation::{ContainerSelector, PodDevices};
use crate::config::Config;
use crate::gpu::HealthStore;

use super::{grant_identity, pod_ref, Admitted, DeviceError, Devices, RuntimeFeatures};

/// What the sandbox's start did with the pod's devices.
#[derive(Debug, PartialEq, Eq)]
pub enum Ahead {
    /// The pod has no allocation.
    Nothing,
    /// The grant check has not let the pod through yet: left to its first container.
    Undecided,
    /// The pod's devices are claimed and its first container's plan prepared.
    Claimed,
}

impl Devices {
    /// Claims the pod's devices at its sandbox's start and prepares the plan
    /// its first container is expected to take. An error is one the first
    /// container will meet again, unless the cause is gone by then.
    pub fn claim_ahead(
        &self,
        pod: &PodSandbox,
        config: &Arc<Config>,
        features: RuntimeFeatures,
        health: &HealthStore,
    ) -> Result<Ahead, DeviceError> {
        let Some(devices) = self.pod_devices(pod)? else {
            return Ok(Ahead::Nothing);
        };
        if let Some(grant) = self.grant.get() {
            if !grant.check_ahead(config, grant_identity(pod), &devices.allocation) {
                return Ok(Ahead::Undecided);
            }
        }
        let first = first_container(&devices);
        let prepared = self.prepared(&devices, pod, &first, config, features, health)?;
        let pod_ref = pod_ref(pod);
        let claimed = self
            .ledger
            .claim(&pod_ref, &prepared.claims)
            .map_err(|source| DeviceError::Claim {
                entry: String::new(),
                source,
            })?;
        // Once per pod, where the claim is made.
        if claimed {
            for w in &prepared.warnings {
                tracing::warn!(pod = %pod_ref, warning = %w, "plan");
            }
        }
        // The reply the first container takes, encoded now: with network
        // actions it is the network owner's, as the pod has none yet.
        let reply = match prepared.resolved {
            Some(_) => Admitted::Owner(prepared),
            None => Admitted::Prepared(prepared),
        };
        reply.encoded();
        Ok(Ahead::Claimed)
    }
}

/// The container a pod's first one is expected to be: one the allocation
/// selects, setting none of the variables the plan reads. A first container
/// that differs (another name under a container list, its own
/// `NCCL_SOCKET_IFNAME`) gets a plan of its own, as any container would.
fn first_container(devices: &PodDevices) -> Container {
    let name = match &devices.containers {
        ContainerSelector::All => String::new(),
        ContainerSelector::Only(names) => names.first().cloned().unwrap_or_default(),
    };
    Container {
        name,
        ..Container::default()
    }
}
