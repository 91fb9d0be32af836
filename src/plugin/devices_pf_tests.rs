//! A PF asked for whole while another pod holds one of its VFs: refused by
//! the entry, and nothing claimed.
use super::*;

/// Container `c9` of pod `ns/b`, whose allocation asks for the PF `pf` whole.
fn create_whole_pf(
    devices: &Devices,
    pf: PciAddr,
    health: &crate::gpu::HealthStore,
) -> Result<ContainerAdjustment, DeviceError> {
    let mut other = PodSandbox {
        id: "other".into(),
        uid: "uid-2".into(),
        namespace: "ns".into(),
        name: "b".into(),
        ..Default::default()
    };
    other.annotations.insert(
        crate::allocation::DEVICE_ALLOCATED.into(),
        format!(
            r#"{{"rdma":[{{"minor":0,"id":"{pf}","resources":{{"koordinator.sh/rdma":"100"}}}}]}}"#
        ),
    );
    devices.apply(
        &other,
        &container("c9", &[]),
        &Arc::new(Config::default()),
        RuntimeFeatures::default(),
        health,
    )
}

#[test]
fn a_pf_asked_whole_while_its_vf_is_held_is_refused_by_its_entry() {
    let node = node();
    let config = Arc::new(Config::default());
    node.create("c1", &[], &config, RuntimeFeatures::default())
        .unwrap();
    let inv = node.fixture.expected();
    let nic = &inv.rdma[0];
    let err = create_whole_pf(&node.devices, nic.bus_id, &node.health).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "scheduling.koordinator.sh/device-allocated: rdma[0]: pf {} conflicts with vf {}, held by pod /: a pf used whole excludes its vfs from other pods",
            nic.bus_id, nic.vfs[0].bus_id
        )
    );
    let state = node.devices.ledger().snapshot().unwrap();
    assert!(!state.pods.contains_key("other"), "{state:?}");
}

/// A pod admitted by an earlier release holds a VF through a claim naming no
/// PF: the plugin names it at start, and the PF asked for whole is refused.
#[test]
fn a_vf_claimed_before_claims_named_their_pf_is_named_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = crate::fixture::HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .unwrap();
    let nic = fixture.expected().rdma[0].clone();
    let state = dir.path().join("state");
    let old = crate::ledger::Claim {
        device: DeviceId::Vf(nic.vfs[0].bus_id),
        share: crate::ledger::Share::Exclusive,
        pf: None,
    };
    let holder = crate::ledger::PodRef {
        sandbox_id: "old".into(),
        namespace: "ns".into(),
        name: "a".into(),
        uid: "uid-a".into(),
    };
    Ledger::open(&state)
        .unwrap()
        .claim(&holder, &[old])
        .unwrap();

    let devices = Devices::open(
        fixture.root(),
        &state,
        "/plugin/bin/devgate-hook".into(),
        None,
    )
    .unwrap();
    let claims = &devices.ledger().snapshot().unwrap().pods["old"].claims;
    assert_eq!(claims[0].pf, Some(nic.bus_id));
    let health = crate::gpu::HealthStore::new(&dir.path().join("health"));
    let err = create_whole_pf(&devices, nic.bus_id, &health).unwrap_err();
    assert!(err.to_string().contains("held by pod ns/a"), "{err}");
}

/// With the kernel's RDMA netns mode exclusive, a PF used whole goes only to
/// a pod on the host network: the runtime's sandbox names a network
/// namespace of its own for any other, and that pod is refused with nothing
/// claimed.
#[test]
fn a_whole_pf_on_an_exclusive_kernel_goes_only_to_a_host_network_pod() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = crate::fixture::HostRootBuilder::hgx()
        .rdma_netns_mode(Some(crate::config::RdmaNetnsMode::Exclusive))
        .build(&dir.path().join("host"))
        .unwrap();
    let devices = Devices::open(
        fixture.root(),
        &dir.path().join("state"),
        "/plugin/bin/devgate-hook".into(),
        None,
    )
    .unwrap();
    let health = crate::gpu::HealthStore::new(&dir.path().join("health"));
    let pf = fixture.expected().rdma[0].bus_id;
    let create = |id: &str, namespaces: &[&str]| {
        let mut pod = PodSandbox {
            id: id.into(),
            uid: format!("uid-{id}"),
            namespace: "ns".into(),
            name: id.into(),
            ..Default::default()
        };
        pod.annotations.insert(
            crate::allocation::DEVICE_ALLOCATED.into(),
            format!(r#"{{"rdma":[{{"minor":0,"id":"{pf}"}}]}}"#),
        );
        let linux = pod.linux.mut_or_insert_default();
        for t in namespaces {
            linux.namespaces.push(nri::api::LinuxNamespace {
                type_: t.to_string(),
                path: format!("/var/run/netns/{id}"),
                ..Default::default()
            });
        }
        devices.apply(
            &pod,
            &container(&format!("{id}-c"), &[]),
            &Arc::new(Config::default()),
            RuntimeFeatures::default(),
            &health,
        )
    };
    let err = create("own", &["mount", "network"]).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "scheduling.koordinator.sh/device-allocated: rdma[0]: pf {pf} is used without vfs, so its rdma device stays in the host network namespace"
        )),
        "{err}"
    );
    assert!(!devices
        .ledger()
        .snapshot()
        .unwrap()
        .pods
        .contains_key("own"));

    let adjustment = create("host", &["mount", "ipc"]).unwrap();
    let paths: Vec<&str> = adjustment
        .linux
        .devices
        .iter()
        .map(|d| d.path.as_str())
        .collect();
    assert!(paths.contains(&"/dev/infiniband/rdma_cm"), "{paths:?}");
    let state = devices.ledger().snapshot().unwrap();
    assert_eq!(state.pods["host"].claims[0].device, DeviceId::Pf(pf));
}
