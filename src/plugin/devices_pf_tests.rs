//! A PF asked for whole while another pod holds one of its VFs: refused by
//! the entry, and nothing claimed.
use super::*;

#[test]
fn a_pf_asked_whole_while_its_vf_is_held_is_refused_by_its_entry() {
    let node = node();
    let config = Arc::new(Config::default());
    node.create("c1", &[], &config, RuntimeFeatures::default())
        .unwrap();
    let inv = node.fixture.expected();
    let nic = &inv.rdma[0];
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
            r#"{{"rdma":[{{"minor":0,"id":"{}","resources":{{"koordinator.sh/rdma":"100"}}}}]}}"#,
            nic.bus_id
        ),
    );
    let err = node
        .devices
        .apply(
            &other,
            &container("c9", &[]),
            &config,
            RuntimeFeatures::default(),
            &node.health,
        )
        .unwrap_err();
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
