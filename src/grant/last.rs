//! The last decision that let a pod through, kept for its further containers.
//!
//! A pod's containers share one allocation, so the decision for a further
//! container of the pod just decided is the same one: whether the namespace
//! rules, the mode and the pod's requests (immutable for device resources, and
//! keyed by the pod's UID) allow its allocation. Taking it from here spares
//! every further container the description of the devices, the cache lookup
//! and the comparison with the requests; the audit still counts and logs it as
//! a decision of its own. Only decisions that cannot change for the same inputs
//! are kept: `granted` and `unchecked`, never a refusal or `unverified` (a pod
//! the cache lacked may be found in it later, and must then be checked).
//!
//! A pod's sandbox start decides ahead of its first container
//! ([`GrantChecker::check_ahead`]), so that the pod's claim can be made then:
//! that decision is kept as the others, but neither logged nor counted, since
//! no container was given anything; the first container's check takes it and
//! logs and counts it as its own.

use std::sync::Arc;

use crate::allocation::Allocation;
use crate::config::Config;

use super::audit::{Decision, Outcome};
use super::{check, GrantChecker, PodIdentity};

/// One kept decision and everything it was made from.
#[derive(Debug)]
pub(super) struct LastDecision {
    /// Held, so that another config cannot take this one's address.
    config: Arc<Config>,
    /// Whether the mode in force was one found after start (see `late`).
    found_mode: bool,
    namespace: String,
    name: String,
    uid: String,
    config_source: Option<String>,
    allocation: Allocation,
    /// The audit record's fields, as the decision wrote them.
    pod_name: String,
    devices: String,
    outcome: Outcome,
    reason: String,
}

/// What a decision was made from.
pub(super) struct Inputs<'a> {
    pub config: &'a Arc<Config>,
    pub found_mode: bool,
    pub pod: PodIdentity<'a>,
    pub alloc: &'a Allocation,
}

impl LastDecision {
    /// The decision to keep, if its outcome is one that lasts.
    pub(super) fn keep(
        inputs: &Inputs<'_>,
        pod_name: String,
        devices: String,
        outcome: Outcome,
        reason: String,
    ) -> Option<LastDecision> {
        if !matches!(outcome, Outcome::Granted | Outcome::Unchecked) {
            return None;
        }
        let pod = inputs.pod;
        Some(LastDecision {
            config: Arc::clone(inputs.config),
            found_mode: inputs.found_mode,
            namespace: pod.namespace.to_string(),
            name: pod.name.to_string(),
            uid: pod.uid.to_string(),
            config_source: pod.config_source.map(str::to_string),
            allocation: inputs.alloc.clone(),
            pod_name,
            devices,
            outcome,
            reason,
        })
    }

    /// Whether this decision was made from exactly these inputs.
    pub(super) fn is_for(&self, inputs: &Inputs<'_>) -> bool {
        let pod = inputs.pod;
        Arc::ptr_eq(&self.config, inputs.config)
            && self.found_mode == inputs.found_mode
            && self.uid == pod.uid
            && self.namespace == pod.namespace
            && self.name == pod.name
            && self.config_source.as_deref() == pod.config_source
            && self.allocation == *inputs.alloc
    }

    /// The audit record of the decision for `container`.
    pub(super) fn decision<'a>(&'a self, container: &'a str) -> Decision<'a> {
        Decision {
            pod: &self.pod_name,
            uid: &self.uid,
            container,
            devices: &self.devices,
            outcome: self.outcome,
            reason: &self.reason,
        }
    }
}

impl GrantChecker {
    /// The mode in force, and what a decision under it is made from.
    pub(super) fn inputs<'a>(
        &'a self,
        config: &'a Arc<Config>,
        pod: PodIdentity<'a>,
        alloc: &'a Allocation,
    ) -> (&'a super::Mode, Inputs<'a>) {
        let mode = self.mode();
        let inputs = Inputs {
            config,
            found_mode: !std::ptr::eq(mode, &self.mode),
            pod,
            alloc,
        };
        (mode, inputs)
    }

    /// Whether `pod` may be given `alloc`, decided ahead of its containers and
    /// kept for them: neither logged nor counted, and never waiting for a pod
    /// the cache lacks (the caller, a sandbox start, must not be held up). True
    /// only for a decision that is kept; anything else is left to the first
    /// container's [`GrantChecker::check`], which decides again and logs it.
    pub fn check_ahead(
        &self,
        config: &Arc<Config>,
        pod: PodIdentity<'_>,
        alloc: &Allocation,
    ) -> bool {
        let (mode, inputs) = self.inputs(config, pod, alloc);
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.as_ref().is_some_and(|l| l.is_for(&inputs)) {
            return true;
        }
        let pod_name = format!("{}/{}", pod.namespace, pod.name);
        let Ok((outcome, reason)) = self.decide(
            config,
            mode,
            pod,
            &pod_name,
            alloc,
            std::time::Duration::ZERO,
            // A sandbox starting holds no claim yet.
            &|| false,
        ) else {
            return false;
        };
        match LastDecision::keep(&inputs, pod_name, check::describe(alloc), outcome, reason) {
            Some(kept) => {
                *last = Some(kept);
                true
            }
            None => false,
        }
    }
}
