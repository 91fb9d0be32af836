//! The plugin's config, from the runtime or a file, valid or not. Under an
//! invalid one the plugin refuses what asks devgate for devices, and
//! releases no pod, whose teardown would follow a `[gpu]` the defaults must
//! not stand in for; a start with a valid config releases them, as after a
//! time without the plugin.
use super::*;

fn log_format(plugin: &DevgatePlugin) -> LogFormat {
    plugin.config().expect("valid config").log_format
}

/// A plugin (`preinstalled`: started by the runtime, which sends its
/// config) connected to a containerd 1.7 that sends `config`; with the
/// plugin's state directory.
async fn sent_config(preinstalled: bool, config: &str) -> (Connected, tempfile::TempDir) {
    let (plugin, state) = plugin(Config::default(), preinstalled);
    let runtime = FakeConfig {
        config: config.to_string(),
        ..FakeConfig::containerd_1_7()
    };
    (connect(plugin, runtime).await, state)
}

#[tokio::test]
async fn runtime_config_is_used_when_preinstalled() {
    let ((plugin, conn, _dir), state) = sent_config(true, "log_format = \"json\"\n").await;
    conn.unwrap();
    assert_eq!(log_format(&plugin), LogFormat::Json);
    let record = features::RuntimeRecord::load(&state.path().join("state"))
        .unwrap()
        .unwrap();
    assert_eq!(record.config_error, None);
}

#[tokio::test]
async fn runtime_config_is_ignored_otherwise() {
    let ((plugin, conn, _dir), _state) = sent_config(false, "log_format = \"json\"\n").await;
    conn.unwrap();
    assert_eq!(log_format(&plugin), LogFormat::Text);
}

#[tokio::test]
async fn bad_runtime_config_refuses_only_containers_that_need_devgate() {
    let ((_p, conn, _dir), state) = sent_config(true, "no_such_key = 1\n").await;
    // Configure succeeds: containerd 1.7 would exit otherwise.
    let conn = conn.unwrap();
    let plain = conn.create_container(&pod(None), &ctr()).await.unwrap();
    assert!(plain.adjust.env.is_empty());
    let err = conn
        .create_container(&pod(Some("v")), &ctr())
        .await
        .unwrap_err();
    let status = rpc_status(err);
    assert_eq!(status.code(), Code::FAILED_PRECONDITION);
    assert!(
        status.message().contains("no_such_key"),
        "{}",
        status.message()
    );
    // The record says so, for `devgate status` and `devgate ready`.
    let record = features::RuntimeRecord::load(&state.path().join("state"))
        .unwrap()
        .unwrap();
    let why = record.config_error.expect("the invalid config recorded");
    assert!(why.contains("no_such_key"), "{why}");
}

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
