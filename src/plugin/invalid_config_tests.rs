//! A plugin whose config file is invalid: it refuses what asks devgate for
//! devices, and keeps the GPUs of pods that end for a start with a valid
//! config, whose `[gpu]` the defaults must not stand in for.
use super::*;

/// The error of a config file with a key devgate does not know.
fn invalid() -> crate::config::ConfigError {
    Config::parse("no_such_key = 1\n", "test").unwrap_err()
}

#[test]
fn an_invalid_config_refuses_devices_and_keeps_the_gpus_of_pods_that_end() {
    use nri::stub::Plugin as _;
    let (plugin, fixture, _state) = hgx_plugin("");
    let (gpu, vf) = (
        &fixture.expected().gpus[0],
        &fixture.expected().rdma[0].vfs[1],
    );
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

    // The holder ends: its GPU stays held, quarantined, not torn down with
    // the defaults' `[gpu]`.
    plugin.stop_pod_sandbox(&held).unwrap();
    assert!(plugin.wait_for_releases(LIMIT));
    let snap = plugin.devices().ledger().snapshot().unwrap();
    let pod = snap.pods.get(&held.id).expect("the pod keeps its gpu");
    assert!(
        pod.claims
            .iter()
            .any(|c| c.device == crate::ledger::DeviceId::Gpu(gpu.uuid.clone())),
        "{pod:?}"
    );

    // With the GPU teardown let go again, the retry releases it.
    plugin.gpu.hold(false);
    plugin.retry_round();
    assert!(!plugin.devices().ledger().holds(&held.id).unwrap());
}
