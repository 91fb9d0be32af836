//! What devgate reads of a request's pod and container beyond their
//! identities and cgroup paths, and the only way it reads pod keys.
//!
//! The plugin decodes requests lean with [`LEAN`]: of the pod's maps it
//! keeps the keys named there and steps over every other entry, which
//! spares the allocations and hashed inserts of the dozen or more entries
//! kubelet and the runtime put on every pod, at every event; and it keeps
//! the container's env only at CreateContainer of a pod with an allocation,
//! where the plan reads the container's own values of the variables it sets
//! (`plan::env_inputs`).
//! A key read but not listed would always be absent, so reads go through
//! [`annotations`] and [`labels`], which check the key against the list in
//! debug builds (every test).

use std::collections::HashMap;

use nri::api::{Event, PodSandbox};
use nri::{EnvAt, EventMask, Keep, Keys};

use crate::allocation::{
    Metadata, CONTAINERS, DEVICE_ALLOCATED, GPU_ISOLATION_PROVIDER, VF_SETTINGS,
};
use crate::grant::model::CONFIG_SOURCE;
use crate::plugin::probe::PROBE_ANNOTATION;

/// What the lean decode keeps of a pod's labels and annotations, and when
/// it keeps the container's env.
pub const LEAN: Keep = Keep {
    labels: Keys::Only(&[GPU_ISOLATION_PROVIDER]),
    annotations: Keys::Only(&[
        DEVICE_ALLOCATED,
        CONTAINERS,
        VF_SETTINGS,
        PROBE_ANNOTATION,
        CONFIG_SOURCE,
    ]),
    env: EnvAt::Only {
        events: EventMask::of(Event::CREATE_CONTAINER),
        pods_annotated: Keys::Only(&[DEVICE_ALLOCATED]),
    },
};

/// One of a pod's maps, read by a key [`LEAN`] keeps.
#[derive(Debug, Clone, Copy)]
pub struct Kept<'a> {
    map: &'a HashMap<String, String>,
    keys: Keys,
}

/// The pod's annotations as the decode kept them.
pub fn annotations(pod: &PodSandbox) -> Kept<'_> {
    Kept {
        map: &pod.annotations,
        keys: LEAN.annotations,
    }
}

/// The pod's labels as the decode kept them.
pub fn labels(pod: &PodSandbox) -> Kept<'_> {
    Kept {
        map: &pod.labels,
        keys: LEAN.labels,
    }
}

/// Whether the pod has a network namespace of its own, from the types of
/// its namespaces the decode keeps: the runtime gives a `hostNetwork` pod
/// none. A pod reported without namespaces (every sandbox has a mount
/// namespace at least; containerd sends none where it could not read the
/// sandbox's spec) is unknown.
pub fn pod_network(pod: &PodSandbox) -> crate::plan::PodNetwork {
    use crate::plan::PodNetwork;
    let Some(linux) = pod.linux.as_ref().filter(|l| !l.namespaces.is_empty()) else {
        return PodNetwork::Unknown;
    };
    if linux.namespaces.iter().any(|n| n.type_ == "network") {
        PodNetwork::Own
    } else {
        PodNetwork::Host
    }
}

impl<'a> Kept<'a> {
    /// The value under `key`, which must be one [`LEAN`] keeps.
    pub fn get(self, key: &str) -> Option<&'a str> {
        debug_assert!(
            self.keys.keeps(key.as_bytes()),
            "{key} is read from a pod but not in LEAN, so the decode skips it"
        );
        self.map.get(key).map(String::as_str)
    }
}

impl Metadata for Kept<'_> {
    fn get_value(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodSandbox {
        let map = |k: &str| HashMap::from([(k.to_string(), "v".to_string())]);
        PodSandbox {
            labels: map(GPU_ISOLATION_PROVIDER),
            annotations: map(DEVICE_ALLOCATED),
            ..Default::default()
        }
    }

    #[test]
    fn kept_keys_read_their_values() {
        let pod = pod();
        assert_eq!(annotations(&pod).get(DEVICE_ALLOCATED), Some("v"));
        assert_eq!(annotations(&pod).get(CONTAINERS), None);
        assert_eq!(labels(&pod).get(GPU_ISOLATION_PROVIDER), Some("v"));
    }

    /// The env is kept for pods annotated so, as the decode sees them: a
    /// key it skips would keep no pod's env, and the plan would then set its
    /// variables over the container's own.
    #[test]
    fn the_env_follows_annotations_the_decode_keeps() {
        let EnvAt::Only {
            pods_annotated: Keys::Only(keys),
            ..
        } = LEAN.env
        else {
            panic!("devgate names the pods whose env it reads");
        };
        assert!(!keys.is_empty());
        for key in keys {
            assert!(LEAN.annotations.keeps(key.as_bytes()), "{key}");
        }
    }

    #[test]
    fn a_pod_without_a_network_namespace_is_on_the_host_network_if_any_are_reported() {
        use crate::plan::PodNetwork;
        let with = |types: &[&str]| {
            let mut pod = PodSandbox::default();
            let linux = pod.linux.mut_or_insert_default();
            for t in types {
                linux.namespaces.push(nri::api::LinuxNamespace {
                    type_: t.to_string(),
                    ..Default::default()
                });
            }
            pod_network(&pod)
        };
        assert_eq!(pod_network(&PodSandbox::default()), PodNetwork::Unknown);
        assert_eq!(with(&[]), PodNetwork::Unknown);
        assert_eq!(with(&["ipc", "mount"]), PodNetwork::Host);
        assert_eq!(with(&["ipc", "network"]), PodNetwork::Own);
    }

    // The check is a debug assertion: a release build reads on.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not in LEAN")]
    fn reading_a_key_the_decode_skips_is_caught() {
        // A label key is not an annotation key: each map has its own list.
        annotations(&pod()).get(GPU_ISOLATION_PROVIDER);
    }
}
