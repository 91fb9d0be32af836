//! Replies a pod's containers take from its prepared plan, encoded once.
use super::*;

/// A plugin on the HGX fixture, with the grant check off.
fn hgx_plugin() -> (DevgatePlugin, crate::fixture::Fixture, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let host = state.path().join("host");
    let fixture = crate::fixture::HostRootBuilder::hgx().build(&host).unwrap();
    let plugin = plugin_on(&host, state.path(), "grant_check = \"off\"\n");
    (plugin, fixture, state)
}

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
    let (plugin, fixture, _state) = hgx_plugin();
    let (p, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let conn = conn.unwrap();
    let gpu = &fixture.expected().gpus[2];
    let mut pod = allocated_pod(&format!(
        r#"{{"gpu":[{{"minor":{},"id":"{}","resources":{{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}}}]}}"#,
        gpu.minor, gpu.uuid
    ));
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
