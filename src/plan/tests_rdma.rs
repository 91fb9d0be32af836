//! RDMA devices in the plan: VFs and a whole PF, the pod's VF settings where
//! the node allows them, and the `[rdma]` config's knobs.

use super::testinv::{hgx, one_vf_allocation, pf_bus, uuid, vf_bus};
use super::tests::{paths, plan, pod, pod_with};
use super::*;
use crate::config::{MacPolicy, RdmaNetnsMode};
use crate::ledger::{DeviceId, Share};

#[test]
fn rdma_vfs_and_pf() {
    let ann = format!(
        r#"{{"rdma":[{{"minor":1,"id":"{}","resources":{{"koordinator.sh/rdma":"1"}},"extension":{{"vfs":[{{"minor":-1,"busID":"{}"}},{{"busID":"{}"}}]}}}},{{"minor":4,"resources":{{"koordinator.sh/rdma":"25"}}}}]}}"#,
        pf_bus(1),
        vf_bus(1, 3),
        vf_bus(1, 0)
    );
    let p = plan(&ann).unwrap();
    assert_eq!(
        paths(&p),
        [
            "/dev/infiniband/rdma_cm",
            "/dev/infiniband/uverbs12",
            "/dev/infiniband/umad12",
            "/dev/infiniband/uverbs9",
            "/dev/infiniband/umad9",
            "/dev/infiniband/uverbs30",
            "/dev/infiniband/umad30",
        ]
    );
    assert_eq!((p.devices[1].major, p.devices[1].minor), (231, 192 + 12));
    let ifnames: Vec<_> = p
        .network
        .iter()
        .map(|n| n.container_ifname.as_str())
        .collect();
    assert_eq!(ifnames, ["net1", "net2"]);
    let n = &p.network[0];
    assert_eq!(
        (n.pf, n.vf_index, n.vf_bus_id),
        (pf_bus(1), 3, vf_bus(1, 3))
    );
    assert_eq!(
        (n.netdev.as_deref(), n.rdma_device.as_deref()),
        (Some("ens1f0v3"), Some("mlx5_12"))
    );
    assert_eq!(n.pf_netdev.as_deref(), Some("ens1f0"));
    assert!(!n.move_rdma);
    assert!(n.rdma_chars.is_empty(), "shared mode moves nothing");
    assert_eq!(
        p.claims,
        [
            Claim {
                device: DeviceId::Vf(vf_bus(1, 3)),
                share: Share::Exclusive,
                pf: Some(pf_bus(1)),
            },
            Claim {
                device: DeviceId::Vf(vf_bus(1, 0)),
                share: Share::Exclusive,
                pf: Some(pf_bus(1)),
            },
            Claim {
                device: DeviceId::Pf(pf_bus(4)),
                share: Share::Shared {
                    core: 25,
                    memory_ratio: 25
                },
                pf: None,
            },
        ]
    );
    let json = serde_json::to_value(&p).unwrap();
    let net = &json["network"][0];
    for key in [
        "pf",
        "vf_index",
        "vf_bus_id",
        "netdev",
        "rdma_device",
        "container_ifname",
    ] {
        assert!(!net[key].is_null(), "{key}");
    }
    assert_eq!(net["vf_bus_id"], vf_bus(1, 3).to_string());
}

/// `devgate.io/vf-settings` goes over the node's settings only where
/// `[vf] pod_settings` allows each one; anything else refuses the pod.
#[test]
fn pod_vf_settings_only_where_the_node_allows() {
    let ann = one_vf_allocation(1);
    let pod_settings = [(crate::allocation::VF_SETTINGS, r#"{"vlan":30,"mtu":9000}"#)];
    let mut config = Config::default();
    config.vf.defaults.vlan = Some(7);
    config.vf.defaults.spoofchk = Some(true);
    let err = build(&hgx(), &pod_with(&ann, &pod_settings, &[]), "main", &config).unwrap_err();
    assert_eq!(
        err.to_string(),
        "devgate.io/vf-settings: vlan: not among the settings this node lets pods set ([vf] pod_settings)"
    );
    // Every container of the pod gets the same verdict.
    let sidecar = build(
        &hgx(),
        &pod_with(&ann, &pod_settings, &[]),
        "sidecar",
        &config,
    );
    assert_eq!(sidecar.unwrap_err(), err);

    config.vf.pod_settings = vec![crate::config::VfSettingName::Mtu];
    let err = build(&hgx(), &pod_with(&ann, &pod_settings, &[]), "main", &config).unwrap_err();
    assert!(err.to_string().contains(": vlan: not among"), "{err}");

    config
        .vf
        .pod_settings
        .push(crate::config::VfSettingName::Vlan);
    let p = build(&hgx(), &pod_with(&ann, &pod_settings, &[]), "main", &config).unwrap();
    let s = &p.network[0].settings;
    assert_eq!(
        (s.vlan, s.mtu, s.spoofchk),
        (Some(30), Some(9000), Some(true))
    );
    assert!(p.warnings.iter().all(|w| !w.contains("vf-settings")));

    // Without a VF there is nothing to apply them to: a warning, not a refusal.
    let gpu_only = format!(r#"{{"gpu":[{{"minor":0,"id":"{}"}}]}}"#, uuid(0));
    let p = build(
        &hgx(),
        &pod_with(&gpu_only, &pod_settings, &[]),
        "main",
        &config,
    )
    .unwrap();
    assert!(
        p.warnings
            .iter()
            .any(|w| w == "devgate.io/vf-settings: the pod has no vf to apply them to"),
        "{:?}",
        p.warnings
    );
}

#[test]
fn rdma_config_knobs() {
    let ann = one_vf_allocation(1);
    let mut config = Config::default();
    config.rdma.allow_issm = true;
    config.rdma.netns_mode = RdmaNetnsMode::Exclusive;
    config.rdma.ifname_prefix = "rdma".into();
    config.vf.defaults.mac = Some(MacPolicy::Random);
    config.vf.pf.insert(
        pf_bus(0),
        crate::config::VfSettings {
            vlan: Some(7),
            ..Default::default()
        },
    );
    config.device_file_mode = 0o660;
    let p = build(&hgx(), &pod(&ann), "main", &config).unwrap();
    assert!(paths(&p).contains(&"/dev/infiniband/issm6"));
    let n = &p.network[0];
    assert!(n.move_rdma);
    // The char devices the nodes name, for the hook to check after the move:
    // every node of the VF's RDMA device.
    let nodes: Vec<(String, u32, u32)> = p
        .devices
        .iter()
        .filter_map(|d| {
            let name = d.path.strip_prefix("/dev/infiniband/")?;
            (name != "rdma_cm").then(|| (name.to_string(), d.major, d.minor))
        })
        .collect();
    let mut chars: Vec<(String, u32, u32)> = n
        .rdma_chars
        .iter()
        .map(|c| (c.name.clone(), c.major, c.minor))
        .collect();
    chars.sort();
    let mut nodes = nodes;
    nodes.sort();
    assert!(!chars.is_empty());
    assert_eq!(chars, nodes);
    assert!(chars.iter().any(|(name, ..)| name.starts_with("issm")));
    // Without subnet-manager access the container has no issm node, and the
    // hook is not asked to find one.
    config.rdma.allow_issm = false;
    let no_issm = build(&hgx(), &pod(&ann), "main", &config).unwrap();
    let names: Vec<&str> = no_issm.network[0]
        .rdma_chars
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert!(
        !names.is_empty() && names.iter().all(|n| !n.starts_with("issm")),
        "{names:?}"
    );
    config.rdma.allow_issm = true;
    assert_eq!(n.container_ifname, "rdma1");
    assert_eq!(
        (n.settings.mac, n.settings.vlan),
        (Some(MacPolicy::Random), Some(7))
    );
    assert!(p.devices.iter().all(|d| d.file_mode == 0o660));

    let whole = plan(r#"{"rdma":[{"minor":0}]}"#).unwrap();
    assert_eq!(
        whole.claims[0],
        Claim {
            device: DeviceId::Pf(pf_bus(0)),
            share: Share::Exclusive,
            pf: None,
        }
    );
    assert!(whole.network.is_empty());
}

/// The kernel's mode decides as much as the config: on an exclusive kernel a
/// VF's RDMA device moves even where the config says shared, since one left
/// in the host's namespace cannot be opened from the pod's.
#[test]
fn rdma_move_follows_an_exclusive_kernel() {
    let ann = one_vf_allocation(1);
    let moves = |config: RdmaNetnsMode, kernel: Option<RdmaNetnsMode>| {
        let mut inv = hgx();
        inv.rdma_netns_mode = kernel;
        let mut cfg = Config::default();
        cfg.rdma.netns_mode = config;
        let p = build(&inv, &pod(&ann), "main", &cfg).unwrap();
        let n = &p.network[0];
        assert_eq!(n.move_rdma, !n.rdma_chars.is_empty(), "{n:?}");
        n.move_rdma
    };
    use RdmaNetnsMode::{Exclusive, Shared};
    for (config, kernel, want) in [
        (Shared, None, false),
        (Shared, Some(Shared), false),
        (Shared, Some(Exclusive), true),
        (Exclusive, Some(Exclusive), true),
        // Configured exclusive on a shared kernel: the hook refuses the
        // container rather than start it without the isolation asked for.
        (Exclusive, Some(Shared), true),
        (Exclusive, None, true),
    ] {
        assert_eq!(moves(config, kernel), want, "{config:?} on {kernel:?}");
    }
}

/// A setting the PF applies to its VF (`spoofchk`, a VLAN, ...) where the PF
/// has no netdev on the host refuses the container at creation, naming the
/// entry and the annotation that set it; the MAC and MTU, which the VF's own
/// netdev takes, do not.
#[test]
fn pf_side_vf_settings_need_a_pf_netdev() {
    let ann = one_vf_allocation(1);
    let mut inv = hgx();
    for nic in &mut inv.rdma {
        nic.netdevs.clear();
    }
    let mut config = Config::default();
    config.vf.defaults.mtu = Some(9000);
    config.vf.defaults.mac = Some(MacPolicy::Random);
    // A priority of 0 and a protocol go only with a VLAN: none here.
    config.vf.defaults.qos = Some(0);
    config.vf.defaults.vlan_proto = Some(crate::netdev::VlanProto::Dot1Q);
    let p = build(&inv, &pod(&ann), "main", &config).unwrap();
    assert_eq!(p.network[0].pf_netdev, None);

    config.vf.defaults.spoofchk = Some(true);
    let err = build(&inv, &pod(&ann), "main", &config).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "scheduling.koordinator.sh/device-allocated: rdma[0].vfs[0]: spoofchk is set through the vf's pf, and pf {} has no netdev on this host",
            pf_bus(0)
        )
    );

    // The pod's own setting is blamed on the pod's annotation.
    config.vf.defaults.spoofchk = None;
    config.vf.pod_settings = vec![crate::config::VfSettingName::Vlan];
    let pod_settings = [(crate::allocation::VF_SETTINGS, r#"{"vlan":30}"#)];
    let err = build(&inv, &pod_with(&ann, &pod_settings, &[]), "main", &config).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("devgate.io/vf-settings: rdma[0].vfs[0]: vlan is set through"),
        "{err}"
    );
}

/// A whole PF's RDMA device stays in the host's network namespace. With the
/// kernel in exclusive mode a pod in a namespace of its own could not open
/// it: refused, naming the entry; a pod on the host network gets it; where
/// the pod's namespace is not told, or only the config says exclusive, a
/// warning.
#[test]
fn a_whole_pf_in_exclusive_mode_needs_the_host_network() {
    let ann = r#"{"rdma":[{"minor":1}]}"#;
    let build_as = |network: PodNetwork, config: RdmaNetnsMode, kernel: Option<RdmaNetnsMode>| {
        let mut inv = hgx();
        inv.rdma_netns_mode = kernel;
        let mut cfg = Config::default();
        cfg.rdma.netns_mode = config;
        let ctx = ContainerContext {
            network,
            ..ContainerContext::NONE
        };
        build_for(&inv, &pod(ann), "main", &cfg, &ctx)
    };
    use PodNetwork::{Host, Own, Unknown};
    use RdmaNetnsMode::{Exclusive, Shared};
    let err = build_as(Own, Shared, Some(Exclusive)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "scheduling.koordinator.sh/device-allocated: rdma[0]: pf {} is used without vfs, so its rdma device stays in the host network namespace, which this node's exclusive rdma netns mode keeps from the pod's own: allocate its vfs or run the pod on the host network",
            pf_bus(1)
        )
    );
    assert!(build_as(Own, Exclusive, Some(Exclusive)).is_err());
    // (network, config, kernel, warned)
    for (network, config, kernel, warned) in [
        (Host, Shared, Some(Exclusive), false),
        (Host, Exclusive, Some(Exclusive), false),
        (Unknown, Shared, Some(Exclusive), true),
        (Own, Exclusive, Some(Shared), true),
        (Own, Exclusive, None, true),
        (Own, Shared, Some(Shared), false),
        (Own, Shared, None, false),
    ] {
        let p = build_as(network, config, kernel)
            .unwrap_or_else(|e| panic!("{network:?} {config:?} {kernel:?}: {e}"));
        assert_eq!(p.claims[0].device, DeviceId::Pf(pf_bus(1)));
        let warned_here = p
            .warnings
            .iter()
            .any(|w| w.contains("stays in the host netns"));
        assert_eq!(
            warned_here, warned,
            "{network:?} {config:?} {kernel:?}: {:?}",
            p.warnings
        );
    }
}
