//! What the plugin logs.

use nri::Plugin as _;

use super::*;
use crate::logging::capture::Captured;

/// A log line about a failed step carries its causes: "write runtime record"
/// alone would not say why.
#[test]
fn a_logged_failure_names_its_cause() {
    let (p, _state) = plugin(Config::default(), false);
    // A directory, not empty, where the record is renamed to.
    let record = features::RuntimeRecord::path(&p.options.state_dir);
    std::fs::create_dir_all(record.join("in-the-way")).unwrap();
    let runtime = RuntimeInfo {
        name: "containerd".to_string(),
        version: "1.7.24".to_string(),
        ..Default::default()
    };
    let log = Captured::default();
    log.run(|| p.configure(&runtime)).unwrap();
    let lines = log.lines("runtime record not saved");
    let line = lines.first().expect("logged");
    let cause = std::io::Error::from_raw_os_error(libc::EISDIR).to_string();
    assert!(
        line.contains(&format!("write runtime record {}", record.display())),
        "{line}"
    );
    assert!(line.contains(&cause), "{line}");
}

/// A container created while no plugin was connected started without its
/// devices: the next Synchronize names it, and not one the plugin admitted.
#[test]
fn synchronize_names_containers_that_run_without_their_allocation() {
    let (p, _state) = plugin(Config::default(), false);
    let pod = allocated_pod(r#"{"gpu":[{"minor":0}]}"#);
    let container = nri::api::Container {
        id: "ctr-away".into(),
        pod_sandbox_id: pod.id.clone(),
        name: "trainer".into(),
        state: nri::api::ContainerState::CONTAINER_RUNNING.into(),
        ..Default::default()
    };
    let log = Captured::default();
    log.run(|| p.synchronize(vec![pod.clone()], vec![container.clone()]))
        .unwrap();
    // Kept for `devgate status` until the runtime removes the container.
    let listed = unapplied_record::load(&p.options.state_dir).unwrap();
    let ids: Vec<&str> = listed.iter().map(|u| u.id.as_str()).collect();
    assert_eq!(ids, ["ctr-away"]);
    assert_eq!(
        (listed[0].pod.as_str(), listed[0].container.as_str()),
        ("web", "trainer")
    );
    p.remove_container(&pod, &container).unwrap();
    assert_eq!(
        unapplied_record::load(&p.options.state_dir).unwrap(),
        vec![]
    );
    let lines = log.lines("container runs without its allocation");
    assert_eq!(lines.len(), 1, "{lines:?}");
    // The pod (team/web), the container, its id and the annotation.
    for want in [
        "team",
        "web",
        "trainer",
        "ctr-away",
        crate::allocation::DEVICE_ALLOCATED,
    ] {
        assert!(lines[0].contains(want), "{want}: {}", lines[0]);
    }
}

/// The runtime took the plugin's reply as failed (the plugin killed between
/// its record and its reply, or the reply later than the runtime's timeout)
/// and created the container without it: recorded in the ledger, it lacks
/// its nodes in the runtime's listing, and the next Synchronize names it;
/// one that carries them is not named.
#[test]
fn synchronize_names_a_recorded_container_that_lacks_its_nodes() {
    let (p, fixture, _state) = hgx_plugin("grant_check = \"off\"\n");
    let gpu = &fixture.expected().gpus[0];
    let pod = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    let ctr = |id: &str, devices: Vec<nri::api::LinuxDevice>| nri::api::Container {
        id: id.into(),
        pod_sandbox_id: pod.id.clone(),
        name: id.into(),
        state: nri::api::ContainerState::CONTAINER_RUNNING.into(),
        linux: protobuf::MessageField::some(nri::api::LinuxContainer {
            devices,
            ..Default::default()
        }),
        ..Default::default()
    };
    let given = p.adjustment(&pod, &ctr("with", Vec::new())).unwrap();
    p.adjustment(&pod, &ctr("without", Vec::new())).unwrap();
    let nodes = given.linux.devices.clone();
    assert!(!nodes.is_empty());
    // A container the hook set up from hooks.d while the plugin was down:
    // its nodes are the hook's, never in the spec.
    let by_hook = crate::ledger::ContainerRecord {
        devices: vec![format!("/dev/nvidia{}", gpu.minor)],
        hooks_only: true,
        ..crate::ledger::tests::record("by-hook")
    };
    // The same from a ledger written before records said `hooks_only`:
    // only hooks-only mode records the container's init.
    let by_old_hook = crate::ledger::ContainerRecord {
        devices: vec![format!("/dev/nvidia{}", gpu.minor)],
        init: Some(crate::ledger::InitProcess {
            pid: std::process::id(),
            start_ticks: 1,
        }),
        ..crate::ledger::tests::record("by-old-hook")
    };
    let ledger = p.devices().ledger();
    ledger
        .record_container(&pod.id, "by-hook", by_hook)
        .unwrap();
    ledger
        .record_container(&pod.id, "by-old-hook", by_old_hook)
        .unwrap();
    let listed = vec![
        ctr("with", nodes),
        ctr("without", Vec::new()),
        ctr("by-hook", Vec::new()),
        ctr("by-old-hook", Vec::new()),
    ];
    p.synchronize(vec![pod.clone()], listed).unwrap();
    let found = unapplied_record::load(&p.options.state_dir).unwrap();
    let ids: Vec<&str> = found.iter().map(|u| u.id.as_str()).collect();
    assert_eq!(ids, ["without"]);
}
