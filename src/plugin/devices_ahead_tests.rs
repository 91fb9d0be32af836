//! The claim at a sandbox's start (`ahead.rs`): made exactly as the first
//! container would make it, or not at all.
use super::*;

fn claim_ahead(node: &Node, pod: &PodSandbox) -> Result<Ahead, DeviceError> {
    let config = Arc::new(Config::default());
    node.devices
        .claim_ahead(pod, &config, RuntimeFeatures::default(), &node.health)
}

/// The claim is the sandbox's from its start; the first container gets what
/// it gets without the claim made ahead, and becomes the network owner.
#[test]
fn a_sandbox_start_claims_and_the_first_container_gets_the_same() {
    let node = node();
    assert_eq!(claim_ahead(&node, &node.pod).unwrap(), Ahead::Claimed);
    let state = node.devices.ledger().snapshot().unwrap();
    let rec = &state.pods["sandbox"];
    assert_eq!(rec.claims.len(), 2, "the GPU and the VF: {rec:?}");
    assert!(rec.containers.is_empty());
    assert_eq!(rec.network_owner, None);
    // Again (a runtime that repeats the event): nothing changes.
    assert_eq!(claim_ahead(&node, &node.pod).unwrap(), Ahead::Claimed);
    assert_eq!(node.devices.ledger().snapshot().unwrap(), state);

    let config = Arc::new(Config::default());
    let first = node
        .create("c1", &[], &config, RuntimeFeatures::default())
        .unwrap();
    assert_eq!(shown(&node, &first), node_without_ahead(&node));
    assert!(first.hooks.is_some(), "the first container moves the VF in");
    let state = node.devices.ledger().snapshot().unwrap();
    assert_eq!(state.pods["sandbox"].network_owner.as_deref(), Some("c1"));
    assert_eq!(state.pods["sandbox"].claims, rec.claims);
    assert!(state.container("c1").is_some());
}

/// The adjustment as text, the node's directory (the hook's state dir) named `<dir>`.
fn shown(node: &Node, adjust: &ContainerAdjustment) -> String {
    format!("{adjust:?}").replace(&node.dir.path().display().to_string(), "<dir>")
}

/// The first container's adjustment on a node of its own, claimed by it.
fn node_without_ahead(like: &Node) -> String {
    let other = node();
    assert_eq!(other.pod, like.pod, "the same fixture, the same pod");
    let config = Arc::new(Config::default());
    let adjust = other
        .create("c1", &[], &config, RuntimeFeatures::default())
        .unwrap();
    shown(&other, &adjust)
}

/// Whatever would refuse the first container claims nothing at the start:
/// a device another pod holds, an unhealthy GPU, an invalid annotation.
#[test]
fn a_sandbox_start_claims_nothing_its_first_container_would_be_refused() {
    let node = node();
    let other = PodSandbox {
        id: "other".into(),
        uid: "uid-2".into(),
        ..node.pod.clone()
    };
    claim_ahead(&node, &other).unwrap();
    let held = claim_ahead(&node, &node.pod).unwrap_err();
    assert!(matches!(held, DeviceError::Claim { .. }), "{held}");

    let node = super::node();
    mark_unhealthy(&node);
    let unhealthy = claim_ahead(&node, &node.pod).unwrap_err();
    assert!(
        matches!(unhealthy, DeviceError::Health { .. }),
        "{unhealthy}"
    );
    assert!(node.devices.ledger().snapshot().unwrap().pods.is_empty());

    let mut bad = node.pod.clone();
    bad.annotations.insert(
        crate::allocation::DEVICE_ALLOCATED.into(),
        r#"{"gpu":[{"minor":"zero"}]}"#.into(),
    );
    let invalid = claim_ahead(&node, &bad).unwrap_err();
    assert!(matches!(invalid, DeviceError::Allocation(_)), "{invalid}");
    assert!(node.devices.ledger().snapshot().unwrap().pods.is_empty());

    let mut plain = node.pod.clone();
    plain.annotations.clear();
    assert_eq!(claim_ahead(&node, &plain).unwrap(), Ahead::Nothing);
    assert!(node.devices.ledger().snapshot().unwrap().pods.is_empty());
}

/// A pod the grant check cannot let through yet claims nothing at its start,
/// and no decision is logged or counted for it: its first container decides.
#[test]
fn a_sandbox_start_leaves_an_undecided_grant_to_the_first_container() {
    let node = node();
    let unavailable = crate::grant::Mode::Unavailable("no api server".into());
    let checker =
        crate::grant::GrantChecker::with_mode(unavailable, &node.dir.path().join("state"));
    node.devices.set_grant_checker(Arc::new(checker));
    assert_eq!(claim_ahead(&node, &node.pod).unwrap(), Ahead::Undecided);
    assert!(node.devices.ledger().snapshot().unwrap().pods.is_empty());
    let counters = node.devices.grant_checker().unwrap().counters();
    assert_eq!(counters, crate::grant::audit::GrantCounters::default());
}
