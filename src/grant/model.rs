//! The few fields of core v1 Pods, PodLists, watch events and Status objects the
//! grant check reads. Everything else in the API server's JSON is skipped.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::request::{self, ContainerResources, DeviceRequest, RequestError};

/// kubelet's annotation on a mirror pod: the static pod's config hash, which
/// kubelet also uses as the static pod's UID (pkg/kubelet/config/common.go,
/// `applyDefaults`), so it is what the runtime sees as the pod UID.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
/// kubelet's annotation on every pod it runs, passed to the runtime with the
/// sandbox: `api` for pods from the API server, `file` or `http` for static pods.
/// kubelet overwrites it (pkg/kubelet/config/config.go), so a pod author cannot
/// make an API pod look static, and a forged value could only cause a refusal.
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";

#[derive(Debug, Deserialize)]
pub struct PodList {
    #[serde(default)]
    pub metadata: ListMeta,
    #[serde(default, deserialize_with = "summaries")]
    pub items: Listed,
}

/// A list page's pods, each summed up as it is read, so that a page holds
/// one whole `Pod` at a time: a page may be 64 MiB of pods a tenant wrote.
#[derive(Debug, Default)]
pub struct Listed {
    /// Summaries of the pods that have not finished ([`Pod::finished`]).
    pub pods: Vec<PodSummary>,
    /// How many pods the page held.
    pub count: usize,
}

fn summaries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Listed, D::Error> {
    struct Items;
    impl<'de> serde::de::Visitor<'de> for Items {
        type Value = Listed;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of pods")
        }
        fn visit_unit<E>(self) -> Result<Listed, E> {
            Ok(Listed::default())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Listed, A::Error> {
            let mut out = Listed::default();
            while let Some(pod) = seq.next_element::<Pod>()? {
                out.count += 1;
                if !pod.finished() {
                    out.pods.push(pod.summary());
                }
            }
            Ok(out)
        }
    }
    d.deserialize_any(Items)
}

#[derive(Debug, Default, Deserialize)]
pub struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    pub resource_version: String,
    #[serde(default, rename = "continue")]
    pub continue_token: String,
}

#[derive(Debug, Deserialize)]
pub struct Pod {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

#[derive(Debug, Default, Deserialize)]
pub struct PodStatus {
    #[serde(default)]
    pub phase: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default, rename = "resourceVersion")]
    pub resource_version: String,
    /// Only the annotations the check reads ([`READ_ANNOTATIONS`]): a pod may
    /// carry 256 KiB of others, and a list page holds many pods.
    #[serde(default, deserialize_with = "read_annotations")]
    pub annotations: BTreeMap<String, String>,
}

/// The annotations the check reads of a pod.
pub const READ_ANNOTATIONS: [&str; 2] = [CONFIG_MIRROR, request::RdmaStrategy::HINT];

/// An annotation map with the values of [`READ_ANNOTATIONS`] only: the
/// others are skipped without being kept.
fn read_annotations<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    kept_entries(d, &READ_ANNOTATIONS)
}

/// A container's requests or limits with the device resources only: a pod
/// may name tens of thousands of extended resources.
fn device_resources<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    kept_entries(d, &request::DEVICE_RESOURCES)
}

/// A map of strings with the entries of `keys` only, the others skipped
/// without being kept; `null` is empty.
fn kept_entries<'de, D: serde::Deserializer<'de>>(
    d: D,
    keys: &'static [&'static str],
) -> Result<BTreeMap<String, String>, D::Error> {
    struct Wanted(&'static [&'static str]);
    impl<'de> serde::de::Visitor<'de> for Wanted {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if self.0.contains(&key.as_ref()) {
                    out.insert(key.into_owned(), map.next_value::<String>()?);
                } else {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            Ok(out)
        }
    }
    d.deserialize_any(Wanted(keys))
}

#[derive(Debug, Default, Deserialize)]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default, rename = "initContainers")]
    pub init_containers: Vec<Container>,
}

#[derive(Debug, Deserialize)]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resources: Resources,
    /// `Always` on an init container makes it a sidecar (restartable init
    /// container, Kubernetes 1.28+), which runs beside the app containers.
    #[serde(default, rename = "restartPolicy")]
    pub restart_policy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Resources {
    #[serde(default, deserialize_with = "device_resources")]
    pub requests: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "device_resources")]
    pub limits: BTreeMap<String, String>,
}

/// One line of a watch stream. The object is decoded once the type is known: a
/// Pod for ADDED/MODIFIED/DELETED, a Status for ERROR, metadata only for BOOKMARK.
#[derive(Debug, Deserialize)]
pub struct WatchEvent<'a> {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(borrow)]
    pub object: &'a RawValue,
}

/// A metav1.Status, as in a watch ERROR event or an error response.
#[derive(Debug, Default, Deserialize)]
pub struct Status {
    #[serde(default)]
    pub code: u16,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// A BOOKMARK event's object: only its resourceVersion matters.
#[derive(Debug, Deserialize)]
pub struct Bookmark {
    pub metadata: ObjectMeta,
}

/// What the cache keeps of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSummary {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The static pod's UID when this is a mirror pod.
    pub mirror_of: Option<String>,
    /// The pod's effective device request, or why its spec cannot be read.
    pub request: Result<DeviceRequest, RequestError>,
    /// Per container, in spec order (init containers first): name and request.
    pub containers: Vec<(String, DeviceRequest)>,
}

fn resources(c: &Container) -> ContainerResources {
    // Only device resources are kept: cpu, memory and the rest do not matter here.
    let keep = |m: &BTreeMap<String, String>| {
        m.iter()
            .filter(|(k, _)| request::DEVICE_RESOURCES.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    ContainerResources {
        name: c.name.clone(),
        requests: keep(&c.resources.requests),
        limits: keep(&c.resources.limits),
        sidecar: c.restart_policy.as_deref() == Some("Always"),
    }
}

impl Pod {
    /// Whether every container of the pod has ended for good (`Succeeded`,
    /// `Failed`): kubelet starts none of them again, so the pod needs no
    /// place in the cache. A node keeps such pods until the pod garbage
    /// collector's threshold (12500 by default, cluster-wide) is reached, far
    /// more than the pods that run on it.
    pub fn finished(&self) -> bool {
        matches!(self.status.phase.as_str(), "Succeeded" | "Failed")
    }

    pub fn summary(&self) -> PodSummary {
        let init: Vec<ContainerResources> =
            self.spec.init_containers.iter().map(resources).collect();
        let app: Vec<ContainerResources> = self.spec.containers.iter().map(resources).collect();
        let containers = init
            .iter()
            .chain(app.iter())
            .map(|c| {
                let r = request::container_request(c).unwrap_or_default();
                (c.name.clone(), r)
            })
            .collect();
        PodSummary {
            namespace: self.metadata.namespace.clone(),
            name: self.metadata.name.clone(),
            uid: self.metadata.uid.clone(),
            mirror_of: self.metadata.annotations.get(CONFIG_MIRROR).cloned(),
            request: request::pod_request(&app, &init).map(|mut r| {
                let hint = self.metadata.annotations.get(request::RdmaStrategy::HINT);
                r.rdma_strategy = request::RdmaStrategy::from_hint(hint.map(String::as_str));
                r
            }),
            containers,
        }
    }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
