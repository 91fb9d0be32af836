//! HAMi-core's per-device limits and the CUDA ordinals they are read by.
use super::testinv::{hgx, uuid};
use super::tests::pod_with;
use super::*;
use crate::allocation::GPU_ISOLATION_PROVIDER;

/// Under `CUDA_DEVICE_ORDER=PCI_BUS_ID` CUDA numbers the pod's GPUs by bus
/// id, whatever their order in `NVIDIA_VISIBLE_DEVICES`: an allocation that
/// lists the later GPU first still gets each limit on its own GPU.
#[test]
fn limits_follow_the_gpus_pci_order_not_the_annotations() {
    let inv = hgx();
    let (g3, g4) = (&inv.gpus[3], &inv.gpus[4]);
    assert!(g3.bus_id < g4.bus_id);
    let ann = r#"{"gpu":[{"minor":4,"resources":{"koordinator.sh/gpu-core":"30","koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"10"}},
        {"minor":3,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}"#;
    let pod = pod_with(ann, &[], &[(GPU_ISOLATION_PROVIDER, "HAMi-core")]);
    let p = build(&inv, &pod, "main", &Config::default()).unwrap();
    assert_eq!(p.env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert_eq!(
        p.env["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", uuid(4), uuid(3)),
        "the annotation's order"
    );
    // Ordinal 0 is minor 3, the lower bus id.
    assert_eq!(
        p.env["CUDA_DEVICE_MEMORY_LIMIT_0"],
        (40u64 << 30).to_string()
    );
    assert_eq!(p.env["CUDA_DEVICE_SM_LIMIT_0"], "50");
    assert_eq!(
        p.env["CUDA_DEVICE_MEMORY_LIMIT_1"],
        (8u64 << 30).to_string()
    );
    assert_eq!(p.env["CUDA_DEVICE_SM_LIMIT_1"], "30");
}
