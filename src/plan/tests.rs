use std::collections::BTreeMap;

use super::testinv::{hgx, uuid};
use super::*;
use crate::allocation::{
    parse_pod, ContainerSelector, PodDevices, CONTAINERS, GPU_ISOLATION_PROVIDER,
};
use crate::ledger::{DeviceId, Share};

pub(super) fn pod(annotation: &str) -> PodDevices {
    pod_with(annotation, &[], &[])
}

pub(super) fn pod_with(
    annotation: &str,
    annotations: &[(&str, &str)],
    labels: &[(&str, &str)],
) -> PodDevices {
    let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mut ann = map(annotations);
    ann.insert(DEVICE_ALLOCATED.into(), annotation.into());
    parse_pod(&ann, &map(labels)).unwrap()
}

pub(super) fn plan(annotation: &str) -> Result<Plan, PlanError> {
    build(&hgx(), &pod(annotation), "main", &Config::default())
}

pub(super) fn paths(p: &Plan) -> Vec<&str> {
    p.devices.iter().map(|d| d.path.as_str()).collect()
}

#[test]
fn empty_allocation_is_empty_plan() {
    let p = build(&hgx(), &PodDevices::default(), "main", &Config::default()).unwrap();
    assert!(p.is_empty() && p.claims.is_empty() && p.selected);
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["devices"], serde_json::json!([]));
    assert_eq!(json["env"], serde_json::json!({}));
    assert_eq!(json["mounts"], serde_json::json!([]));
    assert_eq!(json["network"], serde_json::json!([]));
}

#[test]
fn gpus_by_minor_in_annotation_order() {
    let ann = format!(
        r#"{{"gpu":[{{"minor":5,"id":"{}"}},{{"minor":2}}]}}"#,
        uuid(5)
    );
    let p = plan(&ann).unwrap();
    assert_eq!(
        paths(&p),
        [
            "/dev/nvidia5",
            "/dev/nvidia2",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ]
    );
    let nums: Vec<(u32, u32)> = p.devices.iter().map(|d| (d.major, d.minor)).collect();
    assert_eq!(nums, [(195, 5), (195, 2), (195, 255), (509, 0), (509, 1)]);
    assert!(p
        .devices
        .iter()
        .all(|d| d.file_mode == 0o666 && d.kind == DeviceKind::Char));
    assert_eq!(
        p.env["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", uuid(5), uuid(2))
    );
    assert_eq!(p.env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert_eq!(p.env.len(), 2);
    assert_eq!(
        p.claims,
        [
            Claim {
                device: DeviceId::Gpu(uuid(5)),
                share: Share::Exclusive,
                pf: None,
            },
            Claim {
                device: DeviceId::Gpu(uuid(2)),
                share: Share::Exclusive,
                pf: None,
            },
        ]
    );
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["devices"][0]["type"], "c");
    assert_eq!(json["devices"][0]["file_mode"], 0o666);
}

/// Memory-only entries count no core, so two pods of half the memory each
/// share one GPU as the scheduler placed them; an entry with no resources at
/// all is the whole GPU.
#[test]
fn a_memory_only_share_claims_no_core() {
    let p = plan(r#"{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-memory-ratio":"50","koordinator.sh/gpu-memory":"40Gi"}}]}"#).unwrap();
    assert_eq!(
        p.claims[0].share,
        Share::Shared {
            core: 0,
            memory_ratio: 50
        }
    );
    let p = plan(r#"{"gpu":[{"minor":3}]}"#).unwrap();
    assert_eq!(p.claims[0].share, Share::Exclusive);
}

/// A memory request below 1 % of the GPU, as Koordinator writes it (its
/// ratio rounded down to 0): admitted, its memory counted as 1 %.
#[test]
fn a_memory_request_below_one_percent_counts_one() {
    let p = plan(r#"{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-memory":"512Mi","koordinator.sh/gpu-memory-ratio":"0"}}]}"#).unwrap();
    assert_eq!(
        p.claims[0].share,
        Share::Shared {
            core: 0,
            memory_ratio: 1
        }
    );
}

#[test]
fn shared_gpu_with_and_without_hami() {
    // Half of the fixture's 80 GiB GPU, and a tenth of one.
    let ann = r#"{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}},
        {"minor":4,"resources":{"koordinator.sh/gpu-core":"30","koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"10"}}]}"#;
    let p = plan(ann).unwrap();
    assert_eq!(
        p.claims[0].share,
        Share::Shared {
            core: 50,
            memory_ratio: 50
        }
    );
    assert!(p.mounts.is_empty() && !p.env.contains_key("LD_PRELOAD"));
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);

    let hami = pod_with(ann, &[], &[(GPU_ISOLATION_PROVIDER, "HAMi-core")]);
    let p = build(&hgx(), &hami, "main", &Config::default()).unwrap();
    let env: Vec<(&str, &str)> = p
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mem0 = (40u64 << 30).to_string();
    let mem1 = (8u64 << 30).to_string();
    let want_uuids = format!("{},{}", uuid(3), uuid(4));
    assert_eq!(
        env,
        [
            ("CUDA_DEVICE_MEMORY_LIMIT_0", mem0.as_str()),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", mem1.as_str()),
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
            ("CUDA_DEVICE_SM_LIMIT_0", "50"),
            ("CUDA_DEVICE_SM_LIMIT_1", "30"),
            ("LD_PRELOAD", "/usr/local/vgpu/libvgpu.so"),
            ("NVIDIA_VISIBLE_DEVICES", want_uuids.as_str()),
        ]
    );
    let mounts: Vec<(&str, &str, &[String])> = p
        .mounts
        .iter()
        .map(|m| {
            (
                m.source.as_str(),
                m.destination.as_str(),
                m.options.as_slice(),
            )
        })
        .collect();
    assert_eq!(mounts[0].0, "/usr/local/vgpu/libvgpu.so");
    assert_eq!(mounts[0].1, "/usr/local/vgpu/libvgpu.so");
    assert!(mounts[0].2.contains(&"ro".to_string()));
    assert_eq!(mounts[1].0, "/run/devgate/vgpulock");
    assert_eq!(mounts[1].1, "/tmp/vgpulock");
    assert!(mounts[1].2.contains(&"rw".to_string()));
    assert!(p.warnings.is_empty());

    // The label alone does nothing for whole GPUs, as in koordlet.
    let whole = pod_with(
        r#"{"gpu":[{"minor":0}]}"#,
        &[],
        &[(GPU_ISOLATION_PROVIDER, "HAMi-core")],
    );
    let p = build(&hgx(), &whole, "main", &Config::default()).unwrap();
    assert!(p.mounts.is_empty() && p.env.len() == 2);

    // Without gpu-memory the limit is the ratio of the GPU's memory, as Koordinator fills it.
    let ratio_only = pod_with(
        r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory-ratio":"25"}}]}"#,
        &[],
        &[(GPU_ISOLATION_PROVIDER, "HAMi-core")],
    );
    let p = build(&hgx(), &ratio_only, "main", &Config::default()).unwrap();
    assert_eq!(
        p.env["CUDA_DEVICE_MEMORY_LIMIT_0"],
        (20u64 << 30).to_string()
    );
    assert!(!p.env.contains_key("CUDA_DEVICE_SM_LIMIT_0"));

    // A shared GPU without any memory limit cannot be isolated.
    let mut inv = hgx();
    inv.gpus[0].memory_bytes = None;
    for res in [
        r#"{"koordinator.sh/gpu-memory-ratio":"50"}"#,
        r#"{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"0"}"#,
    ] {
        let ann = format!(r#"{{"gpu":[{{"minor":0,"resources":{res}}}]}}"#);
        let p = pod_with(&ann, &[], &[(GPU_ISOLATION_PROVIDER, "HAMi-core")]);
        let e = build(&inv, &p, "main", &Config::default()).unwrap_err();
        assert!(matches!(e, PlanError::NoGpuMemory { .. }), "{e}");
    }
}

#[test]
fn container_selection() {
    let ann = r#"{"gpu":[{"minor":0}]}"#;
    let only = pod_with(ann, &[(CONTAINERS, "trainer,init-net")], &[]);
    assert_eq!(
        only.containers,
        ContainerSelector::Only(vec!["trainer".into(), "init-net".into()])
    );
    for (name, selected) in [("trainer", true), ("init-net", true), ("sidecar", false)] {
        let p = build(&hgx(), &only, name, &Config::default()).unwrap();
        assert_eq!(p.selected, selected, "{name}");
        assert_eq!(p.is_empty(), !selected, "{name}");
        assert_eq!(p.claims.len(), 1, "claims are the pod's: {name}");
    }
    // An unselected container still fails on a bad allocation.
    let bad = pod_with(r#"{"gpu":[{"minor":42}]}"#, &[(CONTAINERS, "trainer")], &[]);
    assert!(build(&hgx(), &bad, "sidecar", &Config::default()).is_err());
}
