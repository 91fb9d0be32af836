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

/// The API server is out of reach (the plugin restarted during a partition,
/// its pod cache empty): a container of a pod whose claim the ledger holds
/// (kubelet restarting it) is let through on the ledger's word, and a pod
/// holding nothing is refused without the wait.
#[test]
fn a_pod_holding_its_claim_is_admitted_while_the_api_server_is_out_of_reach() {
    let node = node();
    let config = Arc::new(Config {
        grant_wait_ms: 1500,
        ..Config::default()
    });
    node.create("c1", &[], &config, RuntimeFeatures::default())
        .expect("admitted before the partition");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable = crate::grant::Mode::Requests(crate::grant::settings::Endpoint {
        base: format!("http://127.0.0.1:{port}"),
        token: None,
        ca: None,
        client: None,
        node_name: "node-a".into(),
        watch_timeout_secs: 30,
    });
    let checker =
        crate::grant::GrantChecker::with_mode(unreachable, &node.dir.path().join("state"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while checker.cache().last_error().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        checker.cache().last_error().is_some(),
        "the watch of an unreachable api server failed"
    );
    checker.cache().failing_for(crate::grant::cache::DOWN_AFTER);
    node.devices.set_grant_checker(Arc::new(checker));
    node.create("c1", &[], &config, RuntimeFeatures::default())
        .expect("the restarted container, on the ledger's word");
    let mut other = node.pod.clone();
    other.id = "sandbox-2".into();
    other.uid = "uid-2".into();
    let err = node
        .devices
        .apply(
            &other,
            &container("c1", &[]),
            &config,
            RuntimeFeatures::default(),
            &node.health,
        )
        .unwrap_err();
    let text = nri::ErrorChain(&err).to_string();
    assert!(
        text.contains("(not waited for: the watch is down)"),
        "{text}"
    );
    let counters = node.devices.grant_checker().unwrap().counters();
    assert_eq!(
        (counters.granted, counters.unverified, counters.refused),
        (0, 1, 1),
        "{counters:?}"
    );
}
