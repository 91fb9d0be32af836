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

/// The pod of [`limits_follow_the_gpus_pci_order_not_the_annotations`]: two
/// GPUs with different limits; with `equal`, both 30 % and 8Gi.
fn hami_pod(equal: bool) -> crate::allocation::PodDevices {
    let second = if equal {
        r#""koordinator.sh/gpu-core":"30","koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"10""#
    } else {
        r#""koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50""#
    };
    let ann = format!(
        r#"{{"gpu":[{{"minor":4,"resources":{{"koordinator.sh/gpu-core":"30","koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"10"}}}},
        {{"minor":3,"resources":{{{second}}}}}]}}"#
    );
    pod_with(&ann, &[], &[(GPU_ISOLATION_PROVIDER, "HAMi-core")])
}

fn with_env(
    pod: &crate::allocation::PodDevices,
    env: &[&str],
    config: &Config,
) -> Result<Plan, PlanError> {
    let env: Vec<String> = env.iter().map(|e| e.to_string()).collect();
    let ctx = ContainerContext {
        env: &env,
        gids: &NoGids,
        network: crate::plan::PodNetwork::Unknown,
    };
    build_for(&hgx(), pod, "main", config, &ctx)
}

/// A container that numbers its GPUs itself would have each limit fall on
/// another GPU than granted: refused where the limits differ, naming the
/// variable; the order the plan sets, one that changes nothing, or one that
/// shows the first GPUs by bus id, passes.
#[test]
fn a_container_reordering_gpus_with_different_limits_is_refused() {
    let config = Config::default();
    let differ = hami_pod(false);
    for (env, refused) in [
        ("CUDA_VISIBLE_DEVICES=1,0", Some("CUDA_VISIBLE_DEVICES=1,0")),
        ("CUDA_VISIBLE_DEVICES=1", Some("CUDA_VISIBLE_DEVICES=1")),
        (
            "CUDA_DEVICE_ORDER=FASTEST_FIRST",
            Some("CUDA_DEVICE_ORDER=FASTEST_FIRST"),
        ),
        ("CUDA_VISIBLE_DEVICES=0,0", Some("CUDA_VISIBLE_DEVICES=0,0")),
        (
            "CUDA_VISIBLE_DEVICES=0, 1",
            Some("CUDA_VISIBLE_DEVICES=0, 1"),
        ),
        (
            "CUDA_DEVICE_ORDER=PCI_BUS_ID ",
            Some("CUDA_DEVICE_ORDER=PCI_BUS_ID "),
        ),
        (
            "CUDA_VISIBLE_DEVICES=0,1,2",
            Some("CUDA_VISIBLE_DEVICES=0,1,2"),
        ),
        ("CUDA_VISIBLE_DEVICES=0,1", None),
        // The first GPU by bus id alone, or none: each limit stays on its GPU.
        ("CUDA_VISIBLE_DEVICES=0", None),
        ("CUDA_VISIBLE_DEVICES=", None),
        ("CUDA_DEVICE_ORDER=PCI_BUS_ID", None),
        ("PATH=/bin", None),
    ] {
        match (with_env(&differ, &[env], &config), refused) {
            (Err(e), Some(shown)) => {
                let text = e.to_string();
                assert!(
                    text.starts_with(&format!("{ANN}: gpu: HAMi-core keys"))
                        && text.contains(&format!("container's {shown} changes")),
                    "{text}"
                );
            }
            (Ok(p), None) => {
                // Set by the plan unless the container sets it itself.
                let own = env.starts_with("CUDA_DEVICE_ORDER=");
                let want = (!own).then_some("PCI_BUS_ID");
                assert_eq!(
                    p.env.get("CUDA_DEVICE_ORDER").map(String::as_str),
                    want,
                    "{env}"
                );
            }
            (got, _) => panic!("{env}: {got:?}"),
        }
    }
    // Equal limits: any order gives each GPU its own.
    let p = with_env(&hami_pod(true), &["CUDA_VISIBLE_DEVICES=1,0"], &config).unwrap();
    assert_eq!(
        p.env["CUDA_DEVICE_MEMORY_LIMIT_1"],
        (8u64 << 30).to_string()
    );
    // A value from the pod is shown on one line, bounded.
    let e = with_env(&differ, &["CUDA_VISIBLE_DEVICES=1\n0"], &config).unwrap_err();
    assert!(
        e.to_string().contains("CUDA_VISIBLE_DEVICES=1 0 changes"),
        "{e}"
    );
}

/// A variable given twice is read as the process gets it, its last entry:
/// an earlier harmless one hides no reordering, and an earlier reordering
/// one overridden is no refusal.
#[test]
fn a_variable_given_twice_is_read_as_its_last_entry() {
    let config = Config::default();
    let differ = hami_pod(false);
    for (env, refused) in [
        (
            ["CUDA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=1,0"],
            true,
        ),
        (
            [
                "CUDA_DEVICE_ORDER=PCI_BUS_ID",
                "CUDA_DEVICE_ORDER=FASTEST_FIRST",
            ],
            true,
        ),
        (
            ["CUDA_VISIBLE_DEVICES=1,0", "CUDA_VISIBLE_DEVICES=0,1"],
            false,
        ),
    ] {
        match with_env(&differ, &env, &config) {
            Err(e) => assert!(
                refused
                    && e.to_string()
                        .contains(&format!("container's {} changes", env[1])),
                "{env:?}: {e}"
            ),
            Ok(_) => assert!(!refused, "{env:?}"),
        }
    }
}

/// The plan cache tells containers apart by the variables that number
/// their GPUs, as the plan reads them.
#[test]
fn the_plan_cache_key_holds_the_containers_gpu_order() {
    let mut config = Config::default();
    for enabled in [true, false] {
        config.comm_env.enabled = enabled;
        let key = |env: &[&str]| {
            let env: Vec<String> = env.iter().map(|e| e.to_string()).collect();
            crate::plan::env_inputs(&config.comm_env, true, &env)
        };
        assert_ne!(key(&[]), key(&["CUDA_VISIBLE_DEVICES=1,0"]), "{enabled}");
        assert_ne!(
            key(&[]),
            key(&["CUDA_DEVICE_ORDER=FASTEST_FIRST"]),
            "{enabled}"
        );
        assert_eq!(key(&[]), key(&["PATH=/bin"]), "{enabled}");
    }
}

/// A GPU whose entry carries no limit (exclusive, no memory asked) beside a
/// shared one still needs the order: the shared GPU's limits are keyed by
/// its number.
#[test]
fn a_gpu_without_limits_beside_a_shared_one_keeps_the_order() {
    let inv = hgx();
    let ann = r#"{"gpu":[{"minor":3},
        {"minor":4,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"10"}}]}"#;
    let pod = pod_with(ann, &[], &[(GPU_ISOLATION_PROVIDER, "HAMi-core")]);
    let mut config = Config::default();
    config.comm_env.enabled = false;
    let env = vec!["CUDA_VISIBLE_DEVICES=1".to_string()];
    let ctx = ContainerContext {
        env: &env,
        gids: &NoGids,
        network: crate::plan::PodNetwork::Unknown,
    };
    let err = build_for(&inv, &pod, "main", &config, &ctx).unwrap_err();
    assert!(
        err.to_string().contains("CUDA_VISIBLE_DEVICES=1 changes"),
        "{err}"
    );
    let p = build_for(&inv, &pod, "main", &config, &ContainerContext::NONE).unwrap();
    assert!(!p.env.contains_key("CUDA_DEVICE_MEMORY_LIMIT_0"));
    assert_eq!(
        p.env["CUDA_DEVICE_MEMORY_LIMIT_1"],
        (8u64 << 30).to_string()
    );
    assert_eq!(p.env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
}

/// With `comm_env` off the plan still sets the order HAMi-core's limits need.
#[test]
fn the_order_is_set_for_hami_core_with_comm_env_off() {
    let mut config = Config::default();
    config.comm_env.enabled = false;
    let p = with_env(&hami_pod(false), &[], &config).unwrap();
    assert_eq!(p.env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert!(!p.env.contains_key("NCCL_IB_HCA"));
    // The container's own order is left to it where it changes nothing.
    let p = with_env(
        &hami_pod(true),
        &["CUDA_DEVICE_ORDER=FASTEST_FIRST"],
        &config,
    )
    .unwrap();
    assert!(!p.env.contains_key("CUDA_DEVICE_ORDER"));
}
