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
