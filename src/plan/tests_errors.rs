//! The plan's refusals: every unsatisfiable allocation and node, one error each.
use super::testinv::{hgx, one_vf_allocation, pf_bus, uuid, vf_bus};
use super::tests::{plan, pod};
use super::*;
use crate::inventory::{Health, Vf};

#[test]
fn unsatisfiable_allocations() {
    type Check = fn(&PlanError) -> bool;
    let (pf0, pf1, pf4) = (pf_bus(0), pf_bus(1), pf_bus(4));
    let (vf00, vf10) = (vf_bus(0, 0), vf_bus(1, 0));
    #[rustfmt::skip]
    let table: Vec<(&str, String, &str, Check)> = vec![
        ("unknown gpu minor", r#"{"gpu":[{"minor":0},{"minor":9}]}"#.into(), "gpu[1]", |e| matches!(e, PlanError::UnknownGpu { minor: 9, .. })),
        ("uuid of another gpu", format!(r#"{{"gpu":[{{"minor":1,"id":"{}"}}]}}"#, uuid(2)), "gpu[0]", |e| matches!(e, PlanError::GpuIdOfOther { owner: 2, .. })),
        ("uuid of no gpu", r#"{"gpu":[{"minor":1,"id":"GPU-deadbeef"}]}"#.into(), "gpu[0]", |e| matches!(e, PlanError::GpuIdMismatch { .. })),
        ("a share of nothing", r#"{"gpu":[{"minor":0},{"minor":1,"resources":{"koordinator.sh/gpu-core":"0","koordinator.sh/gpu-memory-ratio":"0"}}]}"#.into(), "gpu[1]", |e| matches!(e, PlanError::EmptyGpuShare { minor: 1, .. })),
        ("memory share of nothing", r#"{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-memory-ratio":"0"}}]}"#.into(), "gpu[0]", |e| matches!(e, PlanError::EmptyGpuShare { minor: 2, .. })),
        ("unknown rdma minor", r#"{"rdma":[{"minor":17}]}"#.into(), "rdma[0]", |e| matches!(e, PlanError::UnknownRdma { minor: 17, .. })),
        ("unknown pf id", r#"{"rdma":[{"minor":0,"id":"0000:ee:00.0"}]}"#.into(), "rdma[0]", |e| matches!(e, PlanError::UnknownPf { .. })),
        ("pf id is a vf", format!(r#"{{"rdma":[{{"minor":0,"id":"{vf00}"}}]}}"#), "rdma[0]", |e| matches!(e, PlanError::IdIsVf { .. })),
        ("pf id and minor disagree", format!(r#"{{"rdma":[{{"minor":0,"id":"{pf1}"}}]}}"#), "rdma[0]", |e| matches!(e, PlanError::PfMinorMismatch { owner: 1, .. })),
        ("vf not under its pf", format!(r#"{{"rdma":[{{"minor":0,"id":"{pf0}","extension":{{"vfs":[{{"busID":"{vf10}"}}]}}}}]}}"#), "rdma[0].vfs[0]", |e| matches!(e, PlanError::VfOfOtherPf { .. })),
        ("bus id is a pf", format!(r#"{{"rdma":[{{"minor":0,"extension":{{"vfs":[{{"busID":"{pf1}"}}]}}}}]}}"#), "rdma[0].vfs[0]", |e| matches!(e, PlanError::BusIsPf { .. })),
        ("bus id of nothing", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"busID":"0000:ee:01.2"}]}}]}"#.into(), "rdma[0].vfs[0]", |e| matches!(e, PlanError::UnknownVf { .. })),
        ("pf without vfs asked for one", format!(r#"{{"rdma":[{{"minor":4,"id":"{pf4}","extension":{{"vfs":[{{"busID":"{vf00}"}}]}}}}]}}"#), "rdma[0].vfs[0]", |e| matches!(e, PlanError::VfOfOtherPf { .. })),
    ];
    for (name, ann, entry, check) in table {
        let e = match plan(&ann) {
            Ok(p) => panic!("{name}: planned {p:?}"),
            Err(e) => e,
        };
        assert!(check(&e), "{name}: {e:?}");
        let text = e.to_string();
        assert!(
            text.starts_with(DEVICE_ALLOCATED) && text.contains(&format!(": {entry}: ")),
            "{name}: {text}"
        );
        assert!(!text.contains('\n'), "{name}");
    }
}

#[test]
fn same_pf_twice() {
    // The parser refuses repeated minors and ids; the plan still checks resolved PFs.
    let mut p = pod(r#"{"rdma":[{"minor":1},{"minor":2}]}"#);
    p.allocation.rdma[1].minor = 1;
    let e = build(&hgx(), &p, "main", &Config::default()).unwrap_err();
    assert!(
        matches!(&e, PlanError::DuplicatePf { first, .. } if first == "rdma[0]"),
        "{e}"
    );
}

#[test]
fn node_without_what_is_asked() {
    let mut inv = hgx();
    inv.nvidia_majors.nvidia_uvm = None;
    let gpu = pod(r#"{"gpu":[{"minor":0}]}"#);
    let e = build(&inv, &gpu, "main", &Config::default()).unwrap_err();
    assert!(
        matches!(
            e,
            PlanError::NoMajor {
                device: "nvidia-uvm",
                ..
            }
        ),
        "{e}"
    );
    // Missing majors do not matter when no GPU is allocated.
    assert!(build(&inv, &PodDevices::default(), "main", &Config::default()).is_ok());

    let mut inv = hgx();
    inv.rdma_cm = None;
    let e = build(
        &inv,
        &pod(r#"{"rdma":[{"minor":0}]}"#),
        "main",
        &Config::default(),
    )
    .unwrap_err();
    assert!(matches!(e, PlanError::NoRdmaCm { .. }), "{e}");

    let mut inv = hgx();
    inv.rdma[0].vfs[0].rdma = None;
    let ann = one_vf_allocation(0);
    let e = build(&inv, &pod(&ann), "main", &Config::default()).unwrap_err();
    assert!(matches!(e, PlanError::NoRdmaDevice { .. }), "{e}");

    // A netdev per port: one would stay on the host when the hook moves the other.
    let mut inv = hgx();
    inv.rdma[0].vfs[0].more_netdevs = vec!["ens0f0v0d1".into()];
    let e = build(&inv, &pod(&ann), "main", &Config::default()).unwrap_err();
    assert!(matches!(e, PlanError::VfNetdevs { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "{DEVICE_ALLOCATED}: rdma[0].vfs[0]: rdma vf {} has more than one netdev (ens0f0v0, ens0f0v0d1); devgate moves exactly one per vf into a pod",
            vf_bus(0, 0)
        )
    );

    // Its netdev already moved into the pod (or elsewhere): still `net1`,
    // with no host netdev; whether that will do is the plugin's to judge.
    let mut inv = hgx();
    inv.rdma[0].vfs[0].netdev = None;
    let p = build(&inv, &pod(&ann), "main", &Config::default()).unwrap();
    assert_eq!(p.network.len(), 1);
    assert_eq!(p.network[0].netdev, None);
    assert_eq!(p.network[0].container_ifname, "net1");
    assert_eq!(p.env["NCCL_SOCKET_IFNAME"], "net1");

    let mut inv = hgx();
    inv.rdma[0]
        .rdma
        .char_devs
        .retain(|c| c.name.starts_with("umad"));
    let e = build(
        &inv,
        &pod(r#"{"rdma":[{"minor":0}]}"#),
        "main",
        &Config::default(),
    )
    .unwrap_err();
    assert!(matches!(e, PlanError::NoUverbs { .. }), "{e}");

    // Names from sysfs end up in paths: a hostile one is refused.
    let mut inv = hgx();
    inv.rdma[0].rdma.char_devs[2].name = "../../sda".into();
    let e = build(
        &inv,
        &pod(r#"{"rdma":[{"minor":0}]}"#),
        "main",
        &Config::default(),
    )
    .unwrap_err();
    assert!(matches!(e, PlanError::UnsafeName { .. }), "{e}");

    let mut inv = hgx();
    inv.gpus[0].health = Health::Unhealthy {
        reason: "Xid79".into(),
    };
    let p = build(&inv, &gpu, "main", &Config::default()).unwrap();
    assert!(p.warnings[0].contains("Xid79"), "{:?}", p.warnings);
}

#[test]
fn bad_config_is_refused() {
    type Edit = fn(&mut Config);
    let cases: [(&str, Edit); 6] = [
        ("hami.library_path", |c| {
            c.hami.library_path = "libvgpu.so".into()
        }),
        ("hami.lock_dir", |c| c.hami.lock_dir = "/tmp/../etc".into()),
        ("hami.host_lock_dir", |c| {
            c.hami.host_lock_dir = "run/x".into()
        }),
        ("rdma.ifname_prefix", |c| {
            c.rdma.ifname_prefix = "a/b".into()
        }),
        ("device_file_mode", |c| c.device_file_mode = 0o4777),
        ("vf.defaults.vlan", |c| c.vf.defaults.vlan = Some(5000)),
    ];
    for (key, edit) in cases {
        let mut config = Config::default();
        edit(&mut config);
        let e = build(&hgx(), &PodDevices::default(), "main", &config).unwrap_err();
        assert!(
            matches!(&e, PlanError::Config { key: k, .. } if k == key),
            "{key}: {e}"
        );
    }
}

/// Under HAMi-core, a `gpu-memory` over the claimed ratio of the GPU would be
/// the container's limit: refused. Up to one point over (a ratio rounded
/// down) passes.
#[test]
fn hami_memory_beyond_the_claimed_ratio_is_refused() {
    use crate::allocation::GPU_ISOLATION_PROVIDER;
    let inv = hgx();
    let total = inv.gpus[0].memory_bytes.unwrap();
    let hami = |bytes: u64| {
        let ann = format!(
            r#"{{"gpu":[{{"minor":0,"resources":{{"koordinator.sh/gpu-core":"10","koordinator.sh/gpu-memory-ratio":"10","koordinator.sh/gpu-memory":"{bytes}"}}}}]}}"#
        );
        let p = super::tests::pod_with(&ann, &[], &[(GPU_ISOLATION_PROVIDER, "HAMi-core")]);
        build(&inv, &p, "main", &Config::default())
    };
    let e = hami(total).unwrap_err();
    assert!(
        matches!(e, PlanError::GpuMemoryOverRatio { ratio: 10, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("{DEVICE_ALLOCATED}: gpu[0]: ")),
        "{e}"
    );
    let p = hami(total / 100 * 11).unwrap();
    assert_eq!(
        p.env["CUDA_DEVICE_MEMORY_LIMIT_0"],
        (total / 100 * 11).to_string()
    );
}

/// The claimed ratio may not exceed the `gpu-memory` granted (one point of
/// slack): a ratio of 100 beside a few GiB would claim the GPU whole, with
/// or without HAMi-core.
#[test]
fn a_ratio_beyond_the_granted_memory_is_refused() {
    let inv = hgx();
    let total = inv.gpus[0].memory_bytes.unwrap();
    let plan = |ratio: u32, bytes: u64| {
        let ann = format!(
            r#"{{"gpu":[{{"minor":0,"resources":{{"koordinator.sh/gpu-memory-ratio":"{ratio}","koordinator.sh/gpu-memory":"{bytes}"}}}}]}}"#
        );
        let p = super::tests::pod_with(&ann, &[], &[]);
        build(&inv, &p, "main", &Config::default())
    };
    let e = plan(100, 1 << 30).unwrap_err();
    assert!(
        matches!(e, PlanError::GpuRatioOverMemory { ratio: 100, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("{DEVICE_ALLOCATED}: gpu[0]: ")),
        "{e}"
    );
    // Koordinator's own: the ratio derived from the bytes, rounded either way.
    plan(100, total).unwrap();
    plan(50, total / 2).unwrap();
    plan(11, total / 10).unwrap();
}

/// HAMi-core's library is preloaded before the container's own list, not in
/// its place; a list that names it already is left as it is.
#[test]
fn hami_preload_keeps_the_containers_own() {
    use crate::allocation::GPU_ISOLATION_PROVIDER;
    let ann = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"}}]}"#;
    let pod = super::tests::pod_with(ann, &[], &[(GPU_ISOLATION_PROVIDER, "HAMi-core")]);
    let hami = "/usr/local/vgpu/libvgpu.so";
    let preload_with = |env: &[&str]| {
        let env: Vec<String> = env.iter().map(|e| e.to_string()).collect();
        let ctx = ContainerContext {
            env: &env,
            gids: &NoGids,
            network: crate::plan::PodNetwork::Unknown,
        };
        let p = build_for(&hgx(), &pod, "main", &Config::default(), &ctx).unwrap();
        p.env["LD_PRELOAD"].clone()
    };
    assert_eq!(preload_with(&[]), hami);
    assert_eq!(preload_with(&["LD_PRELOAD="]), hami);
    assert_eq!(
        preload_with(&["PATH=/bin", "LD_PRELOAD=/usr/lib/libtcmalloc.so"]),
        format!("{hami}:/usr/lib/libtcmalloc.so")
    );
    let both = format!("LD_PRELOAD=/lib/a.so {hami}");
    assert_eq!(preload_with(&[both.as_str()]), format!("/lib/a.so {hami}"));
    // The plan cache tells such containers apart.
    let inputs = |env: &[&str]| {
        let env: Vec<String> = env.iter().map(|e| e.to_string()).collect();
        env_inputs(&Config::default().comm_env, true, &env)
    };
    assert_ne!(inputs(&[]), inputs(&["LD_PRELOAD=/lib/a.so"]));
    // The plan reads the container's list as its cache key does (the last
    // entry, a bare name as empty): equal keys, equal values.
    let bare_last = ["LD_PRELOAD=/lib/a.so", "LD_PRELOAD"];
    assert_eq!(inputs(&bare_last), inputs(&["LD_PRELOAD"]));
    assert_eq!(preload_with(&bare_last), preload_with(&["LD_PRELOAD"]));
    assert_eq!(preload_with(&bare_last), hami);
    let given_twice = ["LD_PRELOAD=/lib/b.so", "LD_PRELOAD=/lib/a.so"];
    assert_eq!(inputs(&given_twice), inputs(&["LD_PRELOAD=/lib/a.so"]));
    assert_eq!(preload_with(&given_twice), format!("{hami}:/lib/a.so"));
}

/// A pod's VF settings within their ranges that, over the node's, leave a
/// rate or a priority the PF would refuse: refused at creation, naming the
/// annotation and the VF, instead of at the hook.
#[test]
fn pod_vf_settings_that_conflict_with_the_nodes() {
    let ann = one_vf_allocation(1);
    let mut config = Config::default();
    config.vf.defaults.min_tx_rate = Some(1000);
    config.vf.pod_settings = vec![
        crate::config::VfSettingName::MaxTxRate,
        crate::config::VfSettingName::Qos,
    ];
    let pod = |settings: &str| {
        super::tests::pod_with(&ann, &[(crate::allocation::VF_SETTINGS, settings)], &[])
    };
    let err = build(&hgx(), &pod(r#"{"max_tx_rate":500}"#), "main", &config).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("devgate.io/vf-settings: rdma[0].vfs[0]: min_tx_rate must not exceed max_tx_rate over the node's settings for pf {}", pf_bus(0))
    );
    let err = build(&hgx(), &pod(r#"{"qos":3}"#), "main", &config).unwrap_err();
    assert!(
        err.to_string().contains(": qos needs a non-zero vlan over"),
        "{err}"
    );
    // The node's own settings at fault, the pod bringing none: the node's.
    config.vf.defaults.qos = Some(3);
    let bare = super::tests::pod(&ann);
    let err = build(&hgx(), &bare, "main", &config).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("scheduling.koordinator.sh/device-allocated: rdma[0].vfs[0]: the node's [vf] settings for pf {}: qos needs a non-zero vlan", pf_bus(0))
    );
    config.vf.defaults.qos = None;
    let p = build(&hgx(), &pod(r#"{"max_tx_rate":2000}"#), "main", &config).unwrap();
    assert_eq!(p.network[0].settings.max_tx_rate, Some(2000));
}

/// The hook carries a container's VFs in one bounded annotation: more are
/// refused at the plan, naming the entry over the bound, rather than at the
/// annotation's encoding, which names only devgate's own annotation.
#[test]
fn more_vfs_than_one_container_carries_are_refused_naming_the_entry() {
    let mut inv = hgx();
    let template = inv.rdma[0].vfs[0].clone();
    inv.rdma[0].vfs = (0..=crate::hook::MAX_NETWORKS as u32)
        .map(|i| Vf {
            index: i,
            bus_id: format!("0000:20:{:02x}.{}", i / 8, i % 8).parse().unwrap(),
            netdev: Some(format!("vfnet{i}")),
            ..template.clone()
        })
        .collect();
    let vfs: Vec<String> = inv.rdma[0]
        .vfs
        .iter()
        .map(|v| format!(r#"{{"busID":"{}"}}"#, v.bus_id))
        .collect();
    let ann = format!(
        r#"{{"rdma":[{{"minor":0,"extension":{{"vfs":[{}]}}}}]}}"#,
        vfs.join(",")
    );
    let e = build(&inv, &pod(&ann), "main", &Config::default()).unwrap_err();
    assert!(matches!(e, PlanError::TooManyVfs { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "scheduling.koordinator.sh/device-allocated: rdma[0].vfs[32]: more than 32 vfs for one container"
    );
    // As many as it carries are planned.
    inv.rdma[0].vfs.pop();
    let ann = ann.replace(&format!(r#",{}"#, vfs[32]), "");
    let p = build(&inv, &pod(&ann), "main", &Config::default()).unwrap();
    assert_eq!(p.network.len(), crate::hook::MAX_NETWORKS);
}

/// Where the GPU's memory is unknown, a shared GPU's `gpu-memory` cannot be
/// compared with its ratio: planned as given, with a warning that says so.
#[test]
fn hami_memory_unchecked_without_the_gpus_memory_is_warned() {
    use crate::allocation::GPU_ISOLATION_PROVIDER;
    let mut inv = hgx();
    inv.gpus[0].memory_bytes = None;
    let ann = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"10","koordinator.sh/gpu-memory-ratio":"10","koordinator.sh/gpu-memory":"40Gi"}}]}"#;
    let pod = super::tests::pod_with(ann, &[], &[(GPU_ISOLATION_PROVIDER, "HAMi-core")]);
    let p = build(&inv, &pod, "main", &Config::default()).unwrap();
    assert_eq!(
        p.env["CUDA_DEVICE_MEMORY_LIMIT_0"],
        (40u64 << 30).to_string()
    );
    assert_eq!(
        p.warnings,
        [format!("gpu[0]: the gpu's memory is unknown on this node (nvml off or not loaded): hami-core's limit of {} bytes is taken as the annotation gives it, unchecked against gpu-memory-ratio", 40u64 << 30)]
    );
    // Known, it is checked: over the ratio it is refused, within it planned
    // without a warning.
    let p = build(&hgx(), &pod, "main", &Config::default());
    assert!(
        matches!(p, Err(PlanError::GpuMemoryOverRatio { .. })),
        "{p:?}"
    );
    let fits = ann.replace("40Gi", "8Gi");
    let pod = super::tests::pod_with(&fits, &[], &[(GPU_ISOLATION_PROVIDER, "HAMi-core")]);
    let p = build(&hgx(), &pod, "main", &Config::default()).unwrap();
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}
