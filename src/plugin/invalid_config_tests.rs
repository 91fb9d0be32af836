//! A plugin whose config file is invalid: it refuses what asks devgate for
//! devices, and releases no pod, whose teardown would follow a `[gpu]` the
//! defaults must not stand in for; a start with a valid config releases
//! them, as after a time without the plugin.
use super::*;

/// The error of a config file with a key devgate does not know.
fn invalid() -> crate::config::ConfigError {
    Config::parse("no_such_key = 1\n", "test").unwrap_err()
}

#[tokio::test]
async fn an_invalid_config_refuses_devices_and_leaves_releases_to_a_valid_one() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let host = state.path().join("host");
    let fixture = crate::fixture::HostRootBuilder::hgx().build(&host).unwrap();
    let (gpu, vf) = (
        &fixture.expected().gpus[0],
        &fixture.expected().rdma[0].vfs[1],
    );
    let plugin = plugin_on(&host, state.path(), "");
    let held = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    plugin
        .adjustment(&held, &ctr())
        .expect("claimed under the valid config");

    plugin.refuse_for_config(invalid());
    let asks = PodSandbox {
        id: "sandbox-2".into(),
        uid: "u-2".into(),
        ..allocated_pod(&format!(
            r#"{{"rdma":[{{"minor":0,"id":"{}"}}]}}"#,
            vf.bus_id
        ))
    };
    let err = plugin.adjustment(&asks, &ctr()).unwrap_err();
    let text = nri::ErrorChain(&err).to_string();
    assert!(text.contains("no_such_key"), "{text}");
    assert!(!plugin.devices().ledger().holds("sandbox-2").unwrap());

    // The holder ends: nothing torn down with the defaults' `[gpu]`, nothing
    // quarantined, the claim kept; the retry round leaves it too.
    plugin.stop_pod_sandbox(&held).unwrap();
    plugin.remove_pod_sandbox(&held).unwrap();
    assert!(plugin.wait_for_releases(LIMIT));
    plugin.retry_round();
    let snap = plugin.devices().ledger().snapshot().unwrap();
    assert!(snap.pods.contains_key(&held.id), "{snap:?}");
    assert!(
        snap.devices.values().all(|d| d.quarantine.is_none()),
        "{snap:?}"
    );
    drop(plugin);

    // The next start, with a valid config: the runtime no longer lists the
    // pod, and its Synchronize releases it.
    let plugin = plugin_on(&host, state.path(), "");
    let (plugin, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    conn.unwrap();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(!plugin.devices().ledger().holds(&held.id).unwrap());
}
