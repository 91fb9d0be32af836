//! devgate's plugin behind the real stub, driven by the fake runtime.

use std::{sync::Arc, time::Duration};

use nri::{
    api::{Container, PodSandbox},
    testing::{FakeConfig, FakeError, FakeRuntime, PluginConn},
    ttrpc::{self, Code},
    Stub,
};

use super::{probe::PROBE_ANNOTATION, *};
use crate::config::{DeviceMode, LogFormat};

const LIMIT: Duration = Duration::from_secs(10);

/// Options with a private state directory, kept alive by the returned guard.
fn options(config_from_runtime: bool) -> (PluginOptions, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let options = PluginOptions {
        host_root: state.path().join("empty-host"),
        state_dir: state.path().join("state"),
        config_from_runtime,
    };
    (options, state)
}

/// A plugin on the host root `host`, its state and GPU health under `state`,
/// without NVML; `config` comes before the `[gpu]` section.
fn plugin_on(host: &std::path::Path, state: &std::path::Path, config: &str) -> DevgatePlugin {
    let config = Config::parse(
        &format!(
            "{config}[gpu]\nnvml = false\nhealth_dir = \"{}\"\n",
            state.join("health").display()
        ),
        "test",
    )
    .unwrap();
    let options = PluginOptions {
        host_root: host.to_path_buf(),
        state_dir: state.join("state"),
        config_from_runtime: false,
    };
    DevgatePlugin::new(config, options).unwrap()
}

/// A teardown that fails until told otherwise (`0` set).
struct Flaky(std::sync::atomic::AtomicBool);

impl Teardown for Flaky {
    fn teardown(&self, _pod: &crate::ledger::PodRecord) -> Result<(), crate::ledger::Unclean> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err("vf restore failed".into())
        }
    }
}

/// A plugin on the HGX fixture's host root, `config` before its `[gpu]`
/// section ([`plugin_on`]); the fixture says what the host has.
fn hgx_plugin(config: &str) -> (DevgatePlugin, crate::fixture::Fixture, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let host = state.path().join("host");
    let fixture = crate::fixture::HostRootBuilder::hgx().build(&host).unwrap();
    let plugin = plugin_on(&host, state.path(), config);
    (plugin, fixture, state)
}

fn plugin(config: Config, config_from_runtime: bool) -> (DevgatePlugin, tempfile::TempDir) {
    let (options, guard) = options(config_from_runtime);
    (DevgatePlugin::new(config, options).unwrap(), guard)
}

fn pod(probe: Option<&str>) -> PodSandbox {
    let mut pod = PodSandbox {
        name: "web".to_string(),
        namespace: "team".to_string(),
        ..Default::default()
    };
    if let Some(v) = probe {
        pod.annotations
            .insert(PROBE_ANNOTATION.to_string(), v.to_string());
    }
    pod
}

fn ctr() -> Container {
    Container {
        name: "app".to_string(),
        ..Default::default()
    }
}

/// The plugin served by the stub, its connection with the fake runtime, and
/// the socket's directory.
type Connected = (
    Arc<DevgatePlugin>,
    Result<PluginConn, FakeError>,
    tempfile::TempDir,
);

/// Runs the plugin against a fake runtime on a short socket path.
async fn connect(plugin: DevgatePlugin, config: FakeConfig) -> Connected {
    connect_gated(plugin, config).await.0
}

/// [`connect`], and the stub's request gate.
async fn connect_gated(
    plugin: DevgatePlugin,
    config: FakeConfig,
) -> (Connected, nri::stub::RequestGate) {
    let dir = tempfile::Builder::new()
        .prefix("dg")
        .tempdir_in("/tmp")
        .unwrap();
    let path = dir.path().join("s");
    let runtime = FakeRuntime::bind(&path, config).unwrap();
    let stub = Stub::new(plugin)
        .with_name("devgate")
        .with_idx("10")
        .with_socket_path(&path);
    let plugin = Arc::clone(stub.plugin());
    let requests = stub.request_gate();
    // Redials for ever: the thread ends with the test process.
    std::thread::spawn(move || stub.run());
    let conn = tokio::time::timeout(LIMIT, runtime.accept()).await.unwrap();
    ((plugin, conn, dir), requests)
}

#[tokio::test]
async fn probe_annotation_becomes_container_env() {
    let (plugin, _state) = plugin(Config::default(), false);
    let (_p, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let conn = conn.unwrap();
    assert_eq!(conn.events, EVENTS);
    let reply = conn
        .create_container(&pod(Some("hi")), &ctr())
        .await
        .unwrap();
    let env = &reply.adjust.env;
    assert_eq!(env.len(), 1);
    assert_eq!(
        (env[0].key.as_str(), env[0].value.as_str()),
        ("DEVGATE_PROBE", "hi")
    );
}

#[tokio::test]
async fn other_pods_get_an_empty_adjustment() {
    let (plugin, _state) = plugin(Config::default(), false);
    let (_p, conn, _dir) = connect(plugin, FakeConfig::nri_v0_12()).await;
    let reply = conn
        .unwrap()
        .create_container(&pod(None), &ctr())
        .await
        .unwrap();
    assert_eq!(*reply.adjust, nri::api::ContainerAdjustment::default());
    assert!(reply.update.is_empty() && reply.evict.is_empty());
}

#[tokio::test]
async fn oversized_probe_fails_the_container_with_a_readable_reason() {
    let (plugin, _state) = plugin(Config::default(), false);
    let (_p, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let long = "x".repeat(1000);
    let err = conn
        .unwrap()
        .create_container(&pod(Some(&long)), &ctr())
        .await
        .unwrap_err();
    let status = rpc_status(err);
    assert_eq!(status.code(), Code::INVALID_ARGUMENT);
    assert_eq!(
        status.message(),
        "devgate refused container \"app\" of pod team/web: \
         pod annotation devgate.io/probe is 1000 bytes long, limit 256"
    );
}

/// The ttrpc status a refused request came back with.
fn rpc_status(err: ttrpc::Error) -> ttrpc::proto::Status {
    match err {
        ttrpc::Error::RpcStatus(status) => status,
        other => panic!("not a status: {other:?}"),
    }
}

/// The allocation annotation giving a pod `percent` of GPU `minor`
/// (`uuid`), core and memory alike.
fn gpu_allocation(minor: u32, uuid: &str, percent: u32) -> String {
    format!(
        r#"{{"gpu":[{{"minor":{minor},"id":"{uuid}","resources":{{"koordinator.sh/gpu-core":"{percent}","koordinator.sh/gpu-memory-ratio":"{percent}"}}}}]}}"#
    )
}

fn allocated_pod(value: &str) -> PodSandbox {
    let mut pod = pod(None);
    pod.id = "sandbox-1".to_string();
    pod.annotations.insert(
        crate::allocation::DEVICE_ALLOCATED.to_string(),
        value.to_string(),
    );
    pod
}

#[tokio::test]
async fn unapplicable_allocation_fails_closed_by_default() {
    let (plugin, _state) = plugin(Config::default(), false);
    let (p, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let (conn, pod) = (conn.unwrap(), allocated_pod(r#"{"gpu":[{"minor":0}]}"#));
    // The sandbox starts: the refusal is its container's, which kubelet shows.
    conn.event(nri::api::Event::RUN_POD_SANDBOX, &pod, None)
        .await
        .unwrap();
    let err = conn.create_container(&pod, &ctr()).await.unwrap_err();
    let status = rpc_status(err);
    assert_eq!(status.code(), Code::FAILED_PRECONDITION);
    assert!(
        status
            .message()
            .contains("scheduling.koordinator.sh/device-allocated: gpu: no nvidia major"),
        "{}",
        status.message()
    );
    assert!(p.devices().ledger().snapshot().unwrap().pods.is_empty());
}

/// `failure_policy = "ignore"`: Koordinator's fail-open behaviour. The container
/// starts without devices and nothing is claimed.
#[tokio::test]
async fn failure_policy_ignore_starts_the_container_without_devices() {
    let config = Config::parse("failure_policy = \"ignore\"\n", "test").unwrap();
    let (plugin, _state) = plugin(config, false);
    let (p, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let reply = conn
        .unwrap()
        .create_container(&allocated_pod(r#"{"gpu":[{"minor":0}]}"#), &ctr())
        .await
        .unwrap();
    assert_eq!(*reply.adjust, nri::api::ContainerAdjustment::default());
    assert!(p.devices().ledger().snapshot().unwrap().pods.is_empty());
}

/// A grant refusal is never ignored: with `failure_policy = "ignore"` a pod in a
/// denied namespace still fails, whichever container comes first, and claims
/// nothing.
#[tokio::test]
async fn failure_policy_ignore_never_ignores_a_grant_refusal() {
    let config = Config::parse(
        "failure_policy = \"ignore\"\ngrant_check = \"off\"\ndenied_namespaces = [\"team\"]\n",
        "test",
    )
    .unwrap();
    let (plugin, _state) = plugin(config, false);
    let (p, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let conn = conn.unwrap();
    let mut pod = allocated_pod(r#"{"gpu":[{"minor":0}]}"#);
    pod.annotations
        .insert("devgate.io/containers".to_string(), "main".to_string());
    for name in ["sidecar", "main"] {
        let ctr = Container {
            name: name.to_string(),
            ..ctr()
        };
        let status = rpc_status(conn.create_container(&pod, &ctr).await.unwrap_err());
        assert!(
            status
                .message()
                .contains("namespace team is in denied_namespaces"),
            "{name}: {}",
            status.message()
        );
    }
    assert!(p.devices().ledger().snapshot().unwrap().pods.is_empty());
}

/// The record `devgate status` shows, as Configure wrote it.
async fn configured_record(config: Config, runtime: FakeConfig) -> features::RuntimeRecord {
    let (plugin, state) = plugin(config, false);
    let state_dir = state.path().join("state");
    let (_p, conn, _dir) = connect(plugin, runtime).await;
    let conn = conn.unwrap();
    let record = features::RuntimeRecord::load(&state_dir)
        .unwrap()
        .expect("runtime.json written at configure");
    assert_eq!(record.events, conn.events.to_string());
    record
}

#[tokio::test]
async fn configure_records_the_runtime_and_the_features_in_use() {
    let config = Config::parse("device_mode = \"cdi\"\n", "test").unwrap();
    let containerd_2_1 = FakeConfig {
        runtime_version: "2.1.9+unknown".to_string(),
        ..FakeConfig::containerd_1_7()
    };
    let r = configured_record(config.clone(), containerd_2_1).await;
    assert_eq!(
        (r.runtime.as_str(), r.version.as_str()),
        ("containerd", "2.1.9+unknown")
    );
    // Not stated by NRI v0.8: inferred from the release.
    assert_eq!(r.nri_version.as_deref(), Some("v0.8.0"));
    // The fake runtime states its 2 s, as NRI v0.7 and later do.
    assert_eq!(r.request_timeout_ms, Some(2000));
    assert!(r.cdi_devices && !r.explicit_cgroup_rules);
    assert_eq!(
        (r.device_mode, r.devices_as),
        (DeviceMode::Cdi, DeviceMode::Cdi)
    );

    let r = configured_record(config, FakeConfig::containerd_1_7()).await;
    assert_eq!(r.nri_version.as_deref(), Some("v0.6.1"));
    assert!(!r.cdi_devices && !r.explicit_cgroup_rules);
    assert_eq!(r.devices_as, DeviceMode::Nodes);

    let r = configured_record(Config::default(), FakeConfig::nri_v0_12()).await;
    assert_eq!(r.nri_version.as_deref(), Some("v0.12.0"));
    assert!(r.explicit_cgroup_rules);
    assert_eq!(
        (r.device_mode, r.devices_as),
        (DeviceMode::Nodes, DeviceMode::Nodes)
    );
}

/// containerd 1.7.30+ with `enable_cdi`: only the config can say so.
#[tokio::test]
async fn runtime_cdi_on_lets_containerd_1_7_30_take_cdi_names() {
    let text = "device_mode = \"cdi\"\nruntime_cdi = \"on\"\n";
    let containerd_1_7_30 = FakeConfig {
        runtime_version: "1.7.30".to_string(),
        ..FakeConfig::containerd_1_7()
    };
    let config = Config::parse(text, "test").unwrap();
    let r = configured_record(config.clone(), containerd_1_7_30).await;
    assert_eq!(r.runtime_cdi, crate::config::RuntimeCdi::On);
    assert!(r.cdi_devices);
    assert_eq!(r.devices_as, DeviceMode::Cdi);
    // 1.7.24 drops CDI devices whatever the config says.
    let r = configured_record(config, FakeConfig::containerd_1_7()).await;
    assert!(!r.cdi_devices);
    assert_eq!(r.devices_as, DeviceMode::Nodes);
}

#[path = "lifecycle_tests.rs"]
mod lifecycle_tests;

#[path = "lifecycle_retry_tests.rs"]
mod lifecycle_retry_tests;

#[path = "refused_tests.rs"]
mod refused_tests;

#[path = "hami_tests.rs"]
mod hami_tests;

#[path = "release_wait_tests.rs"]
mod release_wait_tests;

#[path = "exit_tests.rs"]
mod exit_tests;

#[path = "config_tests.rs"]
mod config_tests;

#[path = "ahead_inits_tests.rs"]
mod ahead_inits_tests;

#[path = "known_pods_tests.rs"]
mod known_pods;

#[path = "reply_tests.rs"]
mod reply;

#[path = "logging_tests.rs"]
mod logging;

/// A plugin containerd 1.7.25 or older launched is never synchronized (its
/// NRI v0.6.1 syncs socket connections only): said at Configure, with the
/// way out; not on 1.7.26 or later, and not for a plugin on the socket.
#[test]
fn a_launched_plugin_that_will_not_be_synchronized_says_so() {
    use nri::stub::Plugin as _;
    const SAID: &str = "never synchronizes a plugin it launches";
    let runtime = |version: &str| nri::RuntimeInfo {
        name: "containerd".into(),
        version: version.into(),
        nri_version: nri::NriVersion::infer_from_runtime("containerd", version),
        ..Default::default()
    };
    for (launched, version, said) in [
        (true, "1.7.24", true),
        (true, "1.7.26", false),
        (true, "2.1.9", false),
        (false, "1.7.24", false),
    ] {
        let (plugin, _state) = plugin(Config::default(), launched);
        let log = crate::logging::capture::Captured::default();
        log.run(|| plugin.configure(&runtime(version))).unwrap();
        assert_eq!(
            !log.lines(SAID).is_empty(),
            said,
            "launched {launched}, containerd {version}: {:?}",
            log.lines("")
        );
    }
}
