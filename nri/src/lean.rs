//! Lean decoding of the pod and container a request carries.
//!
//! A CreateContainer request holds the container's whole OCI-level state:
//! mounts, hooks, args, rlimits, namespaces, device lists and the full Linux
//! resources of both container and pod. Building every one of those as
//! generated messages, and freeing them, is most of the cost of receiving a
//! request, on a path that runs with cold caches at every container start.
//! A plugin that reads only identities, labels, annotations, env and cgroup
//! paths asks for [`Decode::Lean`]; the stub then fills just these fields of
//! the usual [`PodSandbox`] and [`Container`] and skips the rest unread.
//!
//! Kept under [`Decode::Lean`]:
//! - `PodSandbox`: `id`, `name`, `uid`, `namespace`, `labels`, `annotations`,
//!   `linux.cgroup_parent`, `linux.cgroups_path`, the `type` of each of
//!   `linux.namespaces` (whether the pod has a network namespace of its own),
//!   `pid`;
//! - `Container`: `id`, `pod_sandbox_id`, `name`, `state`, `env`, `pid`,
//!   `linux.cgroups_path`.
//!
//! Every other field is left at its default. Kept fields decode as the
//! protobuf encoding guide says and Go's protobuf does: a scalar given twice
//! keeps its last value, lists and maps accumulate (a map key given twice
//! keeps its last value), an embedded message given twice merges, strings
//! must be UTF-8. Skipped fields are not validated.
//!
//! [`Keep`] narrows the pod's `labels` and `annotations` to the keys a
//! plugin looks up, and the container's `env` to the events it reads it at.
//! Kubelet and the runtime put a dozen or more entries in each map
//! (`io.kubernetes.*`, `kubernetes.io/config.*`, the pod's own), and every
//! kept entry costs two allocations and a hashed insert; the env holds a
//! container's every variable, seven more for each service of its namespace
//! (kubelet's service links), each an allocation. An entry or variable not
//! kept is stepped over with no allocation, and is not validated.

use std::collections::HashMap;

use protobuf::EnumOrUnknown;

use crate::api::{Container, Event, LinuxContainer, LinuxNamespace, LinuxPodSandbox, PodSandbox};
use crate::event::EventMask;
use crate::protowire::{each_field, WireError, LEN, VARINT};

/// How the stub decodes the pod and container of each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Decode {
    /// Every field, as the generated messages decode them.
    #[default]
    Full,
    /// Only the fields listed in the module docs, narrowed by [`Keep`].
    Lean(Keep),
}

/// Which entries of the pod's `labels` and `annotations`, and at which
/// events the container's `env`, a lean decode keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    pub labels: Keys,
    pub annotations: Keys,
    pub env: EnvAt,
}

impl Keep {
    /// Every entry of both maps, and the env at every event.
    pub const ALL: Keep = Keep {
        labels: Keys::All,
        annotations: Keys::All,
        env: EnvAt::Every,
    };
}

/// When the container's `env` is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvAt {
    Every,
    /// At these events, for pods that carry an annotation under one of
    /// `pods_annotated` (which the annotations' [`Keys`] must keep;
    /// [`Keys::All`]: every pod). A `StateChangeEvent` naming an event this
    /// proto does not know keeps the env.
    Only {
        events: EventMask,
        pods_annotated: Keys,
    },
}

impl EnvAt {
    /// Whether the env is kept at `event` (`None`: not known) for `pod`, as
    /// decoded.
    pub fn keeps(self, event: Option<Event>, pod: &PodSandbox) -> bool {
        match self {
            EnvAt::Every => true,
            EnvAt::Only {
                events,
                pods_annotated,
            } => {
                event.is_none_or(|e| events.contains(e))
                    && match pods_annotated {
                        Keys::All => true,
                        Keys::Only(keys) => keys.iter().any(|k| pod.annotations.contains_key(*k)),
                    }
            }
        }
    }
}

/// The keys kept of one map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    All,
    /// Only these keys, compared byte for byte.
    Only(&'static [&'static str]),
}

impl Keys {
    /// Whether an entry under `key` is kept.
    pub fn keeps(&self, key: &[u8]) -> bool {
        match self {
            Keys::All => true,
            Keys::Only(keys) => keys.iter().any(|k| k.as_bytes() == key),
        }
    }
}

/// Where a request message keeps its parts (field numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub event: Option<u64>,
    pub pod: u64,
    pub container: Option<u64>,
}

/// `CreateContainerRequest`, `RemoveContainerRequest`, `StartContainerRequest`
/// and the other container events: `pod = 1; container = 2`.
pub const POD_AND_CONTAINER: Layout = Layout {
    event: None,
    pod: 1,
    container: Some(2),
};

/// `RunPodSandboxRequest`, `StopPodSandboxRequest`, `RemovePodSandboxRequest`,
/// `PostUpdatePodSandboxRequest`: `pod = 1`.
pub const POD: Layout = Layout {
    event: None,
    pod: 1,
    container: None,
};

/// `StateChangeEvent`: `event = 1; pod = 2; container = 3`.
pub const STATE_CHANGE: Layout = Layout {
    event: Some(1),
    pod: 2,
    container: Some(3),
};

/// What a request carries, lean.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parts {
    /// Set for `StateChangeEvent` only.
    pub event: EnumOrUnknown<Event>,
    pub pod: PodSandbox,
    pub container: Container,
}

/// Decodes the parts `layout` names out of the message of a request for
/// `event` (`None` for a `StateChangeEvent`, which names its own), narrowed
/// by `keep`.
pub fn decode(
    bytes: &[u8],
    layout: Layout,
    keep: Keep,
    event: Option<Event>,
) -> Result<Parts, WireError> {
    let mut parts = Parts::default();
    // The event and the pod first, wherever the message has them: whether
    // the container's env is kept depends on both.
    each_field(bytes, |r, field, wire_type| {
        match wire_type {
            VARINT if Some(field) == layout.event => {
                parts.event = EnumOrUnknown::from_i32(r.varint()? as i32);
            }
            LEN if field == layout.pod => merge_pod(r.bytes()?, keep, &mut parts.pod)?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let Some(container) = layout.container else {
        return Ok(parts);
    };
    let event = event.or(parts.event.enum_value().ok());
    let env = keep.env.keeps(event, &parts.pod);
    each_field(bytes, |r, field, wire_type| {
        if wire_type != LEN || field != container {
            return Ok(false);
        }
        merge_container(r.bytes()?, env, &mut parts.container)?;
        Ok(true)
    })?;
    Ok(parts)
}

fn merge_pod(bytes: &[u8], keep: Keep, pod: &mut PodSandbox) -> Result<(), WireError> {
    each_field(bytes, |r, field, wire_type| {
        match (field, wire_type) {
            (1, LEN) => pod.id = r.str(field)?.to_owned(),
            (2, LEN) => pod.name = r.str(field)?.to_owned(),
            (3, LEN) => pod.uid = r.str(field)?.to_owned(),
            (4, LEN) => pod.namespace = r.str(field)?.to_owned(),
            (5, LEN) => map_entry(r.bytes()?, keep.labels, &mut pod.labels)?,
            (6, LEN) => map_entry(r.bytes()?, keep.annotations, &mut pod.annotations)?,
            (8, LEN) => merge_pod_linux(r.bytes()?, pod.linux.mut_or_insert_default())?,
            (9, VARINT) => pod.pid = r.varint()? as u32,
            _ => return Ok(false),
        }
        Ok(true)
    })
}

fn merge_pod_linux(bytes: &[u8], linux: &mut LinuxPodSandbox) -> Result<(), WireError> {
    each_field(bytes, |r, field, wire_type| {
        match (field, wire_type) {
            (3, LEN) => linux.cgroup_parent = r.str(field)?.to_owned(),
            (4, LEN) => linux.cgroups_path = r.str(field)?.to_owned(),
            (5, LEN) => namespace_type(r.bytes()?, &mut linux.namespaces)?,
            _ => return Ok(false),
        }
        Ok(true)
    })
}

/// A `LinuxNamespace` (`type = 1; path = 2`): its type is kept, its path
/// stepped over unvalidated. A pod the runtime gave no `network` namespace
/// shares the host's network (`hostNetwork`); an empty list is a runtime that
/// reported none, which the types kept tell apart.
fn namespace_type(bytes: &[u8], list: &mut Vec<LinuxNamespace>) -> Result<(), WireError> {
    let mut kind = "";
    each_field(bytes, |r, field, wire_type| {
        match (field, wire_type) {
            (1, LEN) => kind = r.str(field)?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    list.push(LinuxNamespace {
        type_: kind.to_owned(),
        ..Default::default()
    });
    Ok(())
}

fn merge_container(bytes: &[u8], env: bool, ctr: &mut Container) -> Result<(), WireError> {
    each_field(bytes, |r, field, wire_type| {
        match (field, wire_type) {
            (1, LEN) => ctr.id = r.str(field)?.to_owned(),
            (2, LEN) => ctr.pod_sandbox_id = r.str(field)?.to_owned(),
            (3, LEN) => ctr.name = r.str(field)?.to_owned(),
            // Enums and int32 travel as the varint of their 64-bit sign
            // extension; uint32 as a varint truncated to 32 bits.
            (4, VARINT) => ctr.state = EnumOrUnknown::from_i32(r.varint()? as i32),
            (8, LEN) if env => ctr.env.push(r.str(field)?.to_owned()),
            (11, LEN) => merge_container_linux(r.bytes()?, ctr.linux.mut_or_insert_default())?,
            (12, VARINT) => ctr.pid = r.varint()? as u32,
            _ => return Ok(false),
        }
        Ok(true)
    })
}

fn merge_container_linux(bytes: &[u8], linux: &mut LinuxContainer) -> Result<(), WireError> {
    each_field(bytes, |r, field, wire_type| {
        match (field, wire_type) {
            (5, LEN) => linux.cgroups_path = r.str(field)?.to_owned(),
            _ => return Ok(false),
        }
        Ok(true)
    })
}

/// A `map<string, string>` entry: a message of `key = 1; value = 2`, either
/// of which may be absent (then empty). Inserted if `keys` keeps its key.
fn map_entry(bytes: &[u8], keys: Keys, map: &mut HashMap<String, String>) -> Result<(), WireError> {
    let (mut key, mut value): (&[u8], &[u8]) = (&[], &[]);
    each_field(bytes, |r, field, wire_type| {
        match (field, wire_type) {
            (1, LEN) => key = r.bytes()?,
            (2, LEN) => value = r.bytes()?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if !keys.keeps(key) {
        return Ok(());
    }
    let text = |bytes, field| std::str::from_utf8(bytes).map_err(|_| WireError::NotUtf8 { field });
    map.insert(text(key, 1)?.to_owned(), text(value, 2)?.to_owned());
    Ok(())
}

#[cfg(test)]
#[path = "lean_tests.rs"]
mod tests;
