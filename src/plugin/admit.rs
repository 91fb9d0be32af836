//! What a container being created is given: the probe's variable and the
//! plan's adjustment, or a refusal naming the annotation, the entry and why.

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use nri::api::{Container, ContainerAdjustment, KeyValue, PodSandbox};

use super::{devices, probe, reads, DevgatePlugin, PluginError};
use crate::allocation::DEVICE_ALLOCATED;
use crate::config::FailurePolicy;
use crate::ledger::{Claim, LedgerError};

/// How long a creation refused for a device another pod holds waits for that
/// pod's release, before its claim is made once more. The wait ends earlier
/// where the runtime's request timeout says so ([`super::budget::Waits::answer_by`]
/// after the creation's handling began, which may have waited for the grant
/// check): the runtime holds its other NRI calls while it waits.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// Whether the pod carries an allocation, valid or not.
fn has_allocation(pod: &PodSandbox) -> bool {
    reads::annotations(pod).get(DEVICE_ALLOCATED).is_some()
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
    /// A refusal, whatever its reason (the pod's probe value, the config,
    /// the allocation), claims nothing: the claim the sandbox's start made
    /// goes, unless a container of the pod holds it.
    pub(super) fn admitted(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<(devices::Admitted, Option<KeyValue>), PluginError> {
        let admitted = self.admit(pod, ctr);
        if admitted.is_err() && has_allocation(pod) {
            self.release_refused(&pod.id);
        }
        admitted
    }

    /// [`Self::admitted`] before a refusal's claim is given back.
    fn admit(
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
        let features = *self.features.read().unwrap_or_else(PoisonError::into_inner);
        let gpu = self.gpu.get();
        // A pod's devices are released on a worker after its sandbox stops;
        // a pod given them next (a StatefulSet's pod replaced on this node)
        // would be refused until kubelet's retry, seconds later, when the
        // release it met ends in milliseconds.
        let began = Instant::now();
        let retry =
            |e: LedgerError, claims: &[Claim]| self.wait_for_release(pod, ctr, e, claims, began);
        let admitted = self
            .devices
            .admit(pod, ctr, &config, features, gpu.health(), &retry);
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
                // Started without its devices, it leaves the claim its
                // sandbox's start made to no one, as a refusal does.
                self.release_refused(&pod.id);
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

    /// Waits for the releases that may end refusal `e` of `claims`, up to
    /// [`RELEASE_WAIT`] and never past the budget's `answer_by` from `began`; `Ok` when
    /// the claim is worth making once more: after a wait, or where a release
    /// ended between the refusal and this look. A claim waits only where the
    /// ledger, without the pods being released, would take it: a device a
    /// live pod holds, or any other conflict of the claim, is refused at
    /// once, with that lasting reason. A device whose own teardown runs
    /// (`Releasing`) waits for the releases running.
    pub(super) fn wait_for_release(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
        e: LedgerError,
        claims: &[Claim],
        began: Instant,
    ) -> Result<(), LedgerError> {
        let answer_by = began + self.budget.waits().answer_by;
        let end =
            Instant::now() + RELEASE_WAIT.min(answer_by.saturating_duration_since(Instant::now()));
        let left = || end.saturating_duration_since(Instant::now());
        if !matches!(
            e,
            LedgerError::Held { .. }
                | LedgerError::HeldWithPf { .. }
                | LedgerError::Overcommitted { .. }
                | LedgerError::Releasing { .. }
        ) {
            return Err(e);
        }
        let releasing = |sandbox: &str| self.releases.releasing(sandbox);
        let waiting = match self.devices.ledger().waits_for(
            &devices::pod_ref(pod),
            claims,
            &releasing,
        ) {
            Ok(Ok(waiting)) => waiting,
            // Refused even without the pods being released: the lasting reason.
            Ok(Err(lasting)) => return Err(lasting),
            Err(read) => {
                tracing::warn!(error = %nri::ErrorChain(&read), "ledger not read for the release wait");
                return Err(e);
            }
        };
        // A device's own teardown (`Releasing`) names no holder: the
        // releases running are waited for.
        if waiting.is_empty()
            && !(matches!(e, LedgerError::Releasing { .. }) && self.releases.busy())
        {
            // Fits now: a release ended since the refusal.
            return Ok(());
        }
        tracing::info!(
            namespace = %pod.namespace, pod = %pod.name, container = %ctr.name,
            holders = ?waiting, error = %nri::ErrorChain(&e), "waiting for the release of the device's holders"
        );
        let ended = if waiting.is_empty() {
            self.releases.wait_idle(left())
        } else {
            // Every wait, even after one ran out: each release that ends may
            // be the one that makes the claim fit.
            let ended: Vec<bool> = waiting
                .iter()
                .map(|h| self.releases.wait_released(h, left()))
                .collect();
            ended.iter().all(|e| *e)
        };
        if !ended {
            tracing::info!(namespace = %pod.namespace, pod = %pod.name, container = %ctr.name, "a release did not end in time");
        }
        // The ledger decides: a release that ended may have been enough.
        Ok(())
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
            Ok(ahead) => {
                if ahead == devices::Ahead::Claimed {
                    self.ahead_inits.note(&pod.id, pod.pid);
                }
                tracing::debug!(
                    namespace = %pod.namespace, pod = %pod.name, ?ahead, "sandbox started"
                )
            }
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
