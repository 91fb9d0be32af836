//! Replies a pod's containers take from its prepared plan, encoded once.
use super::*;

/// The grant check off.
const GRANT_OFF: &str = "grant_check = \"off\"\n";

fn container(id: &str) -> Container {
    Container {
        id: id.to_string(),
        name: id.to_string(),
        ..Default::default()
    }
}

/// Every container of a pod gets, through the runtime, the adjustment a reply
/// built for it alone would carry: the pod's GPU node and its UUID. A probe,
/// which adds a variable of the container's own, gets its reply built.
#[tokio::test]
async fn a_pods_containers_get_its_prepared_adjustment_as_encoded() {
    let (plugin, fixture, _state) = hgx_plugin(GRANT_OFF);
    let (p, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let conn = conn.unwrap();
    let gpu = &fixture.expected().gpus[2];
    let mut pod = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    let first = conn.create_container(&pod, &container("a")).await.unwrap();
    let second = conn.create_container(&pod, &container("b")).await.unwrap();
    assert_eq!(first.adjust, second.adjust);
    let built = p.adjustment(&pod, &container("c")).unwrap();
    assert_eq!(*first.adjust, built);
    let node = format!("/dev/nvidia{}", gpu.minor);
    let devices = &first.adjust.linux.devices;
    assert!(devices.iter().any(|d| d.path == node), "{devices:?}");
    let env = |adjust: &nri::api::ContainerAdjustment, key: &str| {
        adjust
            .env
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| kv.value.clone())
    };
    assert_eq!(
        env(&first.adjust, "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some(gpu.uuid.as_str())
    );
    let snap = p.devices().ledger().snapshot().unwrap();
    assert_eq!(snap.pods["sandbox-1"].containers.len(), 3, "{snap:?}");

    pod.annotations
        .insert(PROBE_ANNOTATION.to_string(), "v".to_string());
    let probed = conn.create_container(&pod, &container("d")).await.unwrap();
    assert_eq!(env(&probed.adjust, "DEVGATE_PROBE").as_deref(), Some("v"));
    assert_eq!(
        env(&probed.adjust, "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some(gpu.uuid.as_str())
    );
    assert_eq!(probed.adjust.linux, first.adjust.linux);
}

fn gpu_pod(fixture: &crate::fixture::Fixture, id: &str) -> PodSandbox {
    let gpu = &fixture.expected().gpus[2];
    PodSandbox {
        id: id.to_string(),
        uid: format!("uid-{id}"),
        ..allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100))
    }
}

/// Through the runtime, over StateChange (containerd 1.7) and over the
/// per-event RPC (NRI v0.12): a sandbox's start claims its pod's devices; a
/// second pod's start never fails, claims nothing, and leaves the refusal to
/// its container; the first pod's removal releases its claim.
#[tokio::test]
async fn a_sandbox_start_claims_and_never_fails_the_sandbox() {
    for runtime in [FakeConfig::containerd_1_7(), FakeConfig::nri_v0_12()] {
        let (plugin, fixture, _state) = hgx_plugin(GRANT_OFF);
        let (p, conn, _dir) = connect(plugin, runtime).await;
        let conn = conn.unwrap();
        let (pod, other) = (gpu_pod(&fixture, "a"), gpu_pod(&fixture, "b"));
        let start = |pod| conn.event(nri::api::Event::RUN_POD_SANDBOX, pod, None);
        start(&pod).await.unwrap();
        let snap = p.devices().ledger().snapshot().unwrap();
        let uuid = &fixture.expected().gpus[2].uuid;
        let claimed: Vec<_> = snap.pods["a"].claims.iter().map(|c| &c.device).collect();
        assert_eq!(claimed, [&crate::ledger::DeviceId::Gpu(uuid.clone())]);
        assert!(snap.pods["a"].containers.is_empty());

        start(&other).await.unwrap();
        assert!(!p
            .devices()
            .ledger()
            .snapshot()
            .unwrap()
            .pods
            .contains_key("b"));
        let err = conn.create_container(&other, &container("x")).await;
        let status = rpc_status(err.unwrap_err());
        // Kubelet shows this text: the reason once, not again as its cause.
        assert_eq!(
            status.message().matches("is held by pod").count(),
            1,
            "{}",
            status.message()
        );

        let first = conn.create_container(&pod, &container("c")).await.unwrap();
        let node = format!("/dev/nvidia{}", fixture.expected().gpus[2].minor);
        assert!(first.adjust.linux.devices.iter().any(|d| d.path == node));
        conn.event(nri::api::Event::REMOVE_POD_SANDBOX, &pod, None)
            .await
            .unwrap();
        assert!(p.wait_for_releases(LIMIT));
        assert!(p.devices().ledger().snapshot().unwrap().pods.is_empty());
    }
}

/// A creation fits the grant check's wait for a pod the watch has not
/// delivered to its own request's deadline, as a sandbox's start does: where
/// the runtime waits 400 ms for the answer, the refusal comes after 300 ms
/// (`nri::stub::answer_budget`), not after `grant_wait_ms`.
#[test]
fn a_creation_caps_the_grant_wait_at_its_request_deadline() {
    use crate::grant::fake_api::{pod as api_pod, FakeApi};
    use nri::stub::Plugin as _;
    let (plugin, fixture, state) = hgx_plugin("grant_wait_ms = 1500\n");
    let api = FakeApi::start().unwrap();
    api.put_pod(api_pod("team", "other", "u-other", "node-a", &[]));
    let mode = crate::grant::Mode::Requests(api.endpoint("node-a"));
    let checker = crate::grant::GrantChecker::with_mode(mode, &state.path().join("grant"));
    let listed = checker
        .cache()
        .wait_for("u-other", std::time::Duration::from_secs(20));
    assert!(matches!(listed, crate::grant::cache::Lookup::Found(_)));
    plugin.devices().set_grant_checker(Arc::new(checker));
    let gpu = &fixture.expected().gpus[0];
    let mut pod = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    pod.uid = "u-ghost".to_string();
    let began = std::time::Instant::now();
    let timeout = std::time::Duration::from_millis(400);
    let refused = nri::stub::with_request_timeout(timeout, || {
        plugin.create_container_reply(&pod, &container("c")).err()
    });
    let e = nri::ErrorChain(&refused.expect("refused")).to_string();
    assert!(e.contains("after 300 ms"), "{e}");
    assert!(began.elapsed() < std::time::Duration::from_millis(1500));
}
