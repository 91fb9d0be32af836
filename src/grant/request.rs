//! What a pod's containers request, in Koordinator's device units, from the
//! container resources of the pod spec (koordinator.md §1.3).
//!
//! Conversions, as koord-scheduler's deviceshare plugin makes them:
//! - `nvidia.com/gpu: N` is `gpu-core` = `gpu-memory-ratio` = N × 100;
//! - `koordinator.sh/gpu: X` is `gpu-core` = `gpu-memory-ratio` = X;
//! - `koordinator.sh/gpu-core`, `gpu-memory-ratio` (100 per GPU), `gpu-memory` (bytes);
//! - `koordinator.sh/gpu.shared: N`: the GPU request is spread over N GPUs;
//! - `koordinator.sh/rdma`: 100 per whole device, 1 for a VF or a shared PF.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::allocation::{parse_quantity, QuantityError};

pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
pub const KOORD_GPU: &str = "koordinator.sh/gpu";
pub const KOORD_GPU_SHARED: &str = "koordinator.sh/gpu.shared";
pub const GPU_CORE: &str = crate::allocation::RES_GPU_CORE;
pub const GPU_MEMORY_RATIO: &str = crate::allocation::RES_GPU_MEMORY_RATIO;
pub const GPU_MEMORY: &str = crate::allocation::RES_GPU_MEMORY;
pub const RDMA: &str = crate::allocation::RES_RDMA;

/// Every resource name the grant check reads; all others are ignored.
pub const DEVICE_RESOURCES: [&str; 7] = [
    NVIDIA_GPU,
    KOORD_GPU,
    KOORD_GPU_SHARED,
    GPU_CORE,
    GPU_MEMORY_RATIO,
    GPU_MEMORY,
    RDMA,
];

/// Largest request value accepted per resource: far above any node (10^6 GPUs of
/// 100 each), small enough that sums of a bounded number of containers never overflow.
pub const MAX_REQUEST: u64 = 1 << 48;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("container {container:?} resource {resource}: {reason}")]
    Quantity {
        container: String,
        resource: String,
        reason: QuantityError,
    },
    #[error(
        "container {container:?} resource {resource}: {value} is over the limit of {MAX_REQUEST}"
    )]
    TooLarge {
        container: String,
        resource: String,
        value: u64,
    },
}

/// How Koordinator turns `koordinator.sh/rdma` into devices, from the pod's
/// `scheduling.koordinator.sh/device-allocate-hint` (`rdma.allocateStrategy`,
/// `rdma.exclusivePolicy`; `DefaultDeviceHandler`, devicehandler_default.go).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RdmaStrategy {
    /// Above 100 a multiple of whole devices, else one device with that share.
    #[default]
    Default,
    /// Every device (matching the hint's selector), each with the request.
    ApplyForAll,
    /// `value` devices, each with a share of 1, or 100 with `DeviceLevel`.
    RequestsAsCount { device_level: bool },
}

impl RdmaStrategy {
    pub const HINT: &'static str = "scheduling.koordinator.sh/device-allocate-hint";

    /// The rdma strategy of a hint's JSON; the default when there is none or
    /// it cannot be read (the count rule is then the strict one).
    pub fn from_hint(text: Option<&str>) -> RdmaStrategy {
        #[derive(serde::Deserialize)]
        struct Hint {
            rdma: Option<Rdma>,
        }
        #[derive(serde::Deserialize)]
        struct Rdma {
            #[serde(default, rename = "allocateStrategy")]
            strategy: String,
            #[serde(default, rename = "exclusivePolicy")]
            exclusive: String,
        }
        let Some(rdma) = text
            .and_then(|t| serde_json::from_str::<Hint>(t).ok())
            .and_then(|h| h.rdma)
        else {
            return RdmaStrategy::Default;
        };
        match rdma.strategy.as_str() {
            "ApplyForAll" => RdmaStrategy::ApplyForAll,
            "RequestsAsCount" => RdmaStrategy::RequestsAsCount {
                device_level: rdma.exclusive == "DeviceLevel",
            },
            _ => RdmaStrategy::Default,
        }
    }
}

/// Device units requested, by one container or a whole pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct DeviceRequest {
    /// GPU compute, 100 per GPU.
    pub gpu_core: u64,
    /// GPU memory as a share, 100 per GPU.
    pub gpu_memory_ratio: u64,
    /// GPU memory in bytes.
    pub gpu_memory_bytes: u64,
    /// `gpu.shared`: how many GPUs the request is spread over; 0 = unset.
    pub gpu_shared: u64,
    /// `koordinator.sh/rdma`.
    pub rdma: u64,
    /// How `rdma` maps to devices (the pod's allocate hint).
    pub rdma_strategy: RdmaStrategy,
}

impl DeviceRequest {
    pub fn is_empty(&self) -> bool {
        *self == DeviceRequest::default()
    }

    pub fn wants_gpu(&self) -> bool {
        self.gpu_core > 0 || self.gpu_memory_ratio > 0 || self.gpu_memory_bytes > 0
    }

    fn add(&mut self, o: &DeviceRequest) {
        self.gpu_core = self.gpu_core.saturating_add(o.gpu_core);
        self.gpu_memory_ratio = self.gpu_memory_ratio.saturating_add(o.gpu_memory_ratio);
        self.gpu_memory_bytes = self.gpu_memory_bytes.saturating_add(o.gpu_memory_bytes);
        self.gpu_shared = self.gpu_shared.saturating_add(o.gpu_shared);
        self.rdma = self.rdma.saturating_add(o.rdma);
    }

    fn max(&mut self, o: &DeviceRequest) {
        self.gpu_core = self.gpu_core.max(o.gpu_core);
        self.gpu_memory_ratio = self.gpu_memory_ratio.max(o.gpu_memory_ratio);
        self.gpu_memory_bytes = self.gpu_memory_bytes.max(o.gpu_memory_bytes);
        self.gpu_shared = self.gpu_shared.max(o.gpu_shared);
        self.rdma = self.rdma.max(o.rdma);
    }
}

/// One container's resources as the pod spec carries them (quantity strings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerResources {
    pub name: String,
    pub requests: BTreeMap<String, String>,
    pub limits: BTreeMap<String, String>,
    /// An init container with `restartPolicy: Always` (a sidecar).
    pub sidecar: bool,
}

/// A container's device request. Extended resources cannot be overcommitted, so
/// Kubernetes sets a missing request to the limit; the request is read, else the limit.
pub fn container_request(c: &ContainerResources) -> Result<DeviceRequest, RequestError> {
    let mut r = DeviceRequest::default();
    for name in DEVICE_RESOURCES {
        let Some(text) = c.requests.get(name).or_else(|| c.limits.get(name)) else {
            continue;
        };
        let value = parse_quantity(text).map_err(|reason| RequestError::Quantity {
            container: c.name.clone(),
            resource: name.to_string(),
            reason,
        })?;
        if value > MAX_REQUEST {
            return Err(RequestError::TooLarge {
                container: c.name.clone(),
                resource: name.to_string(),
                value,
            });
        }
        match name {
            NVIDIA_GPU => {
                r.gpu_core += value * 100;
                r.gpu_memory_ratio += value * 100;
            }
            KOORD_GPU => {
                r.gpu_core += value;
                r.gpu_memory_ratio += value;
            }
            KOORD_GPU_SHARED => r.gpu_shared = value,
            GPU_CORE => r.gpu_core += value,
            GPU_MEMORY_RATIO => r.gpu_memory_ratio += value,
            GPU_MEMORY => r.gpu_memory_bytes = value,
            _ => r.rdma = value,
        }
    }
    Ok(r)
}

/// The pod's effective request, as the scheduler computes it for fit
/// (component-helpers `resource.PodRequests`, which Koordinator calls): init
/// containers run one at a time before the app containers, except sidecars
/// (`restartPolicy: Always`), which keep running from their start on. So the
/// app containers' sum plus every sidecar, or, if larger, any init container
/// plus the sidecars started before it.
pub fn pod_request(
    containers: &[ContainerResources],
    init_containers: &[ContainerResources],
) -> Result<DeviceRequest, RequestError> {
    let mut sum = DeviceRequest::default();
    for c in containers {
        sum.add(&container_request(c)?);
    }
    let mut sidecars = DeviceRequest::default();
    let mut init_peak = DeviceRequest::default();
    for c in init_containers {
        let own = container_request(c)?;
        let mut running = sidecars;
        if c.sidecar {
            sum.add(&own);
            sidecars.add(&own);
            running = sidecars;
        } else {
            running.add(&own);
        }
        init_peak.max(&running);
    }
    sum.max(&init_peak);
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctr(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ContainerResources {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        ContainerResources {
            name: name.to_string(),
            requests: map(requests),
            limits: map(limits),
            sidecar: false,
        }
    }

    fn sidecar(c: ContainerResources) -> ContainerResources {
        ContainerResources { sidecar: true, ..c }
    }

    /// Sidecars (restartable init containers) run beside the app containers:
    /// their requests add up with the app's, and an init container after a
    /// sidecar runs beside it.
    #[test]
    fn sidecars_add_to_the_app_containers() {
        let app = [ctr("app", &[(NVIDIA_GPU, "1")], &[])];
        let init = [sidecar(ctr("proxy", &[(NVIDIA_GPU, "1")], &[]))];
        assert_eq!(pod_request(&app, &init).unwrap().gpu_core, 200);
        let init = [
            sidecar(ctr("proxy", &[(NVIDIA_GPU, "1")], &[])),
            ctr("setup", &[(NVIDIA_GPU, "2")], &[]),
        ];
        // setup runs beside proxy: 3 GPUs at once, more than proxy + app.
        assert_eq!(pod_request(&app, &init).unwrap().gpu_core, 300);
        let init = [
            ctr("setup", &[(NVIDIA_GPU, "2")], &[]),
            sidecar(ctr("proxy", &[(NVIDIA_GPU, "1")], &[])),
        ];
        // setup ends before proxy starts: the app and proxy, 2.
        assert_eq!(pod_request(&app, &init).unwrap().gpu_core, 200);
    }

    #[test]
    fn conversions_follow_koordinator() {
        let g = |core, ratio, bytes, shared, rdma| DeviceRequest {
            gpu_core: core,
            gpu_memory_ratio: ratio,
            gpu_memory_bytes: bytes,
            gpu_shared: shared,
            rdma,
            rdma_strategy: RdmaStrategy::Default,
        };
        type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, DeviceRequest);
        let cases: Vec<Case> = vec![
            (
                "nothing",
                vec![("cpu", "2"), ("memory", "1Gi")],
                g(0, 0, 0, 0, 0),
            ),
            (
                "two whole gpus",
                vec![(NVIDIA_GPU, "2")],
                g(200, 200, 0, 0, 0),
            ),
            (
                "koordinator gpu share",
                vec![(KOORD_GPU, "50")],
                g(50, 50, 0, 0, 0),
            ),
            (
                "core and ratio",
                vec![(GPU_CORE, "30"), (GPU_MEMORY_RATIO, "40")],
                g(30, 40, 0, 0, 0),
            ),
            (
                "core and bytes",
                vec![(GPU_CORE, "50"), (GPU_MEMORY, "16Gi")],
                g(50, 0, 16 << 30, 0, 0),
            ),
            (
                "shared over two",
                vec![(KOORD_GPU, "100"), (KOORD_GPU_SHARED, "2")],
                g(100, 100, 0, 2, 0),
            ),
            ("a vf", vec![(RDMA, "1")], g(0, 0, 0, 0, 1)),
        ];
        for (what, requests, want) in cases {
            let got = container_request(&ctr("c", &requests, &[])).unwrap();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn limit_stands_for_a_missing_request() {
        let r = container_request(&ctr("c", &[], &[(NVIDIA_GPU, "1")])).unwrap();
        assert_eq!(r.gpu_core, 100);
        // A request present wins over the limit.
        let r = container_request(&ctr("c", &[(RDMA, "1")], &[(RDMA, "100")])).unwrap();
        assert_eq!(r.rdma, 1);
    }

    #[test]
    fn pod_sums_app_containers_and_takes_the_largest_init_container() {
        let app = [
            ctr("a", &[(NVIDIA_GPU, "1")], &[]),
            ctr("b", &[(NVIDIA_GPU, "2"), (RDMA, "1")], &[]),
        ];
        let init = [ctr("i", &[(NVIDIA_GPU, "4")], &[])];
        let r = pod_request(&app, &[]).unwrap();
        assert_eq!((r.gpu_core, r.rdma), (300, 1));
        let r = pod_request(&app, &init).unwrap();
        assert_eq!((r.gpu_core, r.rdma), (400, 1));
    }

    #[test]
    fn bad_quantities_name_container_and_resource() {
        for (value, want) in [
            ("-1", "negative"),
            ("0.5", "not a whole number"),
            ("lots", "malformed"),
            ("1Ei", "over the limit"),
        ] {
            let e = container_request(&ctr("main", &[(NVIDIA_GPU, value)], &[])).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("\"main\"") && text.contains(NVIDIA_GPU),
                "{text}"
            );
            assert!(text.contains(want), "{value}: {text}");
        }
    }
}
