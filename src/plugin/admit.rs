//! What a container being created is given: the probe's variable and the
//! plan's adjustment, or a refusal naming the annotation, the entry and why.

use std::sync::PoisonError;

use nri::api::{Container, ContainerAdjustment, KeyValue, PodSandbox};

use super::{devices, probe, reads, DevgatePlugin, PluginError};
use crate::allocation::DEVICE_ALLOCATED;
use crate::config::FailurePolicy;

/// How long a creation refused for a device another pod holds waits for the
/// releases running then, before it is tried once more: well inside the
/// runtime's time for a plugin's answer (containerd's
/// `plugin_request_timeout`, 2 s by default), whose NRI calls this holds up.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the pod carries an allocation, valid or not.
fn has_allocation(pod: &PodSandbox) -> bool {
    reads::annotations(pod).get(DEVICE_ALLOCATED).is_some()
}

/// What a refusal for a device another pod holds may wait for.
enum Awaits<'a> {
    /// The release of this sandbox, the holder.
    Sandbox(&'a str),
    /// Every release running: one of them may end it (a shared device over
    /// 100 % with its holders, or torn down by a release).
    Any,
}

/// What ending `e` may wait for; `None` for a refusal no release ends.
fn awaits(e: &devices::DeviceError) -> Option<Awaits<'_>> {
    use crate::ledger::LedgerError as L;
    match e {
        devices::DeviceError::Claim { source, .. } => match source {
            L::Held { sandbox, .. } | L::HeldWithPf { sandbox, .. } => {
                Some(Awaits::Sandbox(sandbox))
            }
            L::Overcommitted { .. } | L::Releasing { .. } => Some(Awaits::Any),
            _ => None,
        },
        _ => None,
    }
}

impl DevgatePlugin {
    /// Everything devgate changes in a container being created.
    ///
    /// Containers that ask devgate for nothing get an empty adjustment even
    /// when the config is broken; the others are refused rather than
    /// started without what they asked for.
    pub fn adjustment(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<ContainerAdjustment, PluginError> {
        let (admitted, probe) = self.admitted(pod, ctr)?;
        Ok(combined(admitted, probe))
    }

    /// What the container is given, and the probe's variable if it asked.
    pub(super) fn admitted(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<(devices::Admitted, Option<KeyValue>), PluginError> {
        let probe = probe::probe_env(pod).map_err(|source| PluginError::Probe {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            container: ctr.name.clone(),
            source,
        })?;
        if probe.is_none() && !has_allocation(pod) {
            return Ok((devices::Admitted::Nothing, None));
        }
        let config = self.config().map_err(|source| PluginError::Config {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            container: ctr.name.clone(),
            source,
        })?;
        let admit = || {
            let features = *self.features.read().unwrap_or_else(PoisonError::into_inner);
            let gpu = self.gpu.get();
            self.devices
                .admit(pod, ctr, &config, features, gpu.health())
        };
        let admitted = match admit() {
            // A pod's devices are released on a worker after its sandbox
            // stops; a pod given them next (a StatefulSet's pod replaced on
            // this node) would be refused until kubelet's retry, seconds
            // later, when the release it met ends in milliseconds.
            Err(e) if self.wait_for_release(pod, ctr, &e) => admit(),
            other => other,
        };
        let admitted = match admitted {
            Ok(admitted) => admitted,
            // A grant refusal (more than requested, a namespace rule, a static
            // pod) is never ignored: starting such a container would leave its
            // annotation to whatever else reads it, such as a hooks.d hook.
            Err(source)
                if config.failure_policy == FailurePolicy::Ignore
                    && !matches!(source, devices::DeviceError::Grant(_)) =>
            {
                // Koordinator's fail-open behaviour, for operators who chose it.
                tracing::warn!(
                    namespace = %pod.namespace, pod = %pod.name, container = %ctr.name,
                    error = %nri::ErrorChain(&source), "allocation not applied (failure_policy = ignore)"
                );
                devices::Admitted::Nothing
            }
            Err(source) => {
                tracing::warn!(
                    namespace = %pod.namespace, pod = %pod.name, container = %ctr.name,
                    error = %nri::ErrorChain(&source), "container refused"
                );
                return Err(PluginError::Devices {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: ctr.name.clone(),
                    source: Box::new(source),
                });
            }
        };
        if admitted.has_linux() {
            self.note_device_pod(pod, ctr, &config.gpu);
        }
        Ok((admitted, probe))
    }

    /// Waits up to [`RELEASE_WAIT`] for the release that may end refusal `e`,
    /// when one is queued or runs; true when it ended and the creation is
    /// worth trying again. Only the holder's own release is waited for where
    /// the holder is known, so that a creation refused for a device a live
    /// pod holds never waits while other pods are being released.
    fn wait_for_release(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
        e: &devices::DeviceError,
    ) -> bool {
        let ended = match awaits(e) {
            Some(Awaits::Sandbox(id)) if self.releases.releasing(id) => {
                tracing::info!(
                    namespace = %pod.namespace, pod = %pod.name, container = %ctr.name,
                    holder = id, error = %nri::ErrorChain(e), "waiting for the holder's release"
                );
                self.releases.wait_released(id, RELEASE_WAIT)
            }
            Some(Awaits::Any) if self.releases.busy() => {
                tracing::info!(
                    namespace = %pod.namespace, pod = %pod.name, container = %ctr.name,
                    error = %nri::ErrorChain(e), "waiting for the releases that run"
                );
                self.releases.wait_idle(RELEASE_WAIT)
            }
            _ => return false,
        };
        if !ended {
            tracing::info!(namespace = %pod.namespace, pod = %pod.name, container = %ctr.name, "the release did not end in time");
        }
        ended
    }

    /// The pod's claim at its sandbox's start, ahead of its containers; what
    /// cannot be done now is done, or refused, at its first container.
    pub(super) fn claim_ahead(&self, pod: &PodSandbox) {
        if !has_allocation(pod) {
            return;
        }
        // An invalid config refuses the pod's containers, each with its error.
        let Ok(config) = self.config() else {
            return;
        };
        let features = *self.features.read().unwrap_or_else(PoisonError::into_inner);
        let gpu = self.gpu.get();
        match self
            .devices
            .claim_ahead(pod, &config, features, gpu.health())
        {
            Ok(ahead) => tracing::debug!(
                namespace = %pod.namespace, pod = %pod.name, ?ahead, "sandbox started"
            ),
            // Logged once, when the first container meets it (if it still does).
            Err(e) => tracing::debug!(
                namespace = %pod.namespace, pod = %pod.name, error = %nri::ErrorChain(&e),
                "claim left to the first container"
            ),
        }
    }
}

/// A container's adjustment: what it was given, and the probe's variable.
pub(super) fn combined(
    admitted: devices::Admitted,
    probe: Option<KeyValue>,
) -> ContainerAdjustment {
    let mut adjust = admitted.into_adjustment();
    adjust.env.extend(probe);
    adjust
}
