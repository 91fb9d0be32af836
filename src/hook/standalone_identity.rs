//! Who a hooks-only container is: its pod and name, from the annotations
//! the runtime that wrote its spec sets.

use std::collections::BTreeMap;

use super::super::State;
use super::HooksOnlyError;
use crate::ledger::PodRef;

/// Longest identity value taken from an annotation (ids are 64, names 253).
pub(super) const MAX_IDENTITY: usize = 256;

/// Who the container is, from the runtime's annotations; a container outside
/// a pod (podman's, run without `--pod`) is its own pod; a podman pod
/// writes CRI-O's sandbox key.
pub(super) struct Identity {
    pub(super) pod: PodRef,
    pub(super) container: String,
}

fn pick(a: &BTreeMap<String, String>, key: &'static str) -> Result<Option<String>, HooksOnlyError> {
    let Some(v) = a.get(key) else {
        return Ok(None);
    };
    let ok = v.len() <= MAX_IDENTITY && v.bytes().all(|b| b.is_ascii_graphic());
    if !ok {
        return Err(HooksOnlyError::Identity { key });
    }
    Ok(Some(v.clone()))
}

/// The annotation keys one runtime writes for a container's pod:
/// sandbox id, namespace, name, uid, container name.
struct Keys([&'static str; 5]);

/// containerd's CRI plugin (`pkg/cri/annotations`).
const CONTAINERD_KEYS: Keys = Keys([
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.cri.sandbox-uid",
    "io.kubernetes.cri.container-name",
]);

/// CRI-O (`pkg/annotations`, and the kubelet's names it writes).
const CRIO_KEYS: Keys = Keys([
    "io.kubernetes.cri-o.SandboxID",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.uid",
    "io.kubernetes.container.name",
]);

/// Who the container is. The keys are those of the runtime that wrote the
/// spec, told by CRI-O's own sandbox key, and never a mix: CRI-O copies the
/// pod's annotations into the spec, so a pod could otherwise name itself
/// another pod's sandbox through containerd's keys, which CRI-O never sets,
/// and share that pod's exclusive devices.
pub(super) fn identity(state: &State) -> Result<Identity, HooksOnlyError> {
    let a = &state.annotations;
    let Keys([sandbox, namespace, name, uid, container]) = if a.contains_key(CRIO_KEYS.0[0]) {
        CRIO_KEYS
    } else {
        CONTAINERD_KEYS
    };
    let sandbox_id = pick(a, sandbox)?.unwrap_or_else(|| state.id.clone());
    let namespace = pick(a, namespace)?.unwrap_or_default();
    let name = pick(a, name)?.unwrap_or_else(|| state.id.clone());
    let uid = pick(a, uid)?.unwrap_or_else(|| sandbox_id.clone());
    let container = pick(a, container)?.unwrap_or_default();
    Ok(Identity {
        pod: PodRef {
            sandbox_id,
            namespace,
            name,
            uid,
        },
        container,
    })
}
