//! `Devices`: the VF MAC policy and the hook the adjustment names.
use super::*;

#[test]
fn random_mac_is_stable_local_unicast() {
    let vf: PciAddr = "0000:19:00.1".parse().unwrap();
    let a = pod_mac("uid-1", &vf);
    assert_eq!(a, pod_mac("uid-1", &vf));
    assert_ne!(a, pod_mac("uid-2", &vf));
    assert_eq!(a[0] & 0x03, 0x02);
}

/// The hook's arguments for a VF pod's container, under `config`.
fn hook_args(config: &Config) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let fixture = crate::fixture::HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .unwrap();
    let devices = Devices::open(
        fixture.root(),
        &dir.path().join("state"),
        &dir.path().join("health"),
        "/plugin/bin/devgate-hook".into(),
    )
    .unwrap();
    let nic = &fixture.expected().rdma[0];
    let mut pod = PodSandbox {
        id: "sandbox".into(),
        uid: "uid".into(),
        ..Default::default()
    };
    pod.annotations.insert(
        crate::allocation::DEVICE_ALLOCATED.into(),
        format!(
            r#"{{"rdma":[{{"minor":0,"id":"{}","resources":{{"koordinator.sh/rdma":"1"}},"extension":{{"vfs":[{{"minor":-1,"busID":"{}"}}]}}}}]}}"#,
            nic.bus_id, nic.vfs[0].bus_id
        ),
    );
    let ctr = Container {
        id: "c1".into(),
        name: "main".into(),
        ..Default::default()
    };
    let adj = devices
        .apply(&pod, &ctr, config, RuntimeFeatures::default())
        .unwrap();
    let hook = &adj
        .hooks
        .as_ref()
        .expect("a VF pod gets the hook")
        .create_runtime[0];
    let mut args = vec![hook.path.clone()];
    args.extend(hook.args[2..].iter().cloned());
    args.iter()
        .map(|a| a.replace(&dir.path().display().to_string(), "<dir>"))
        .collect()
}

#[test]
fn hook_gets_the_plugins_paths_unless_config_gives_the_hosts() {
    assert_eq!(
        hook_args(&Config::default()),
        ["/plugin/bin/devgate-hook", "--state-dir", "<dir>/state"]
    );
    // devgate in a container: runc runs the hook on the host, which sees the
    // state directory where the DaemonSet mounts it from.
    let config = Config {
        hook_path: "/opt/devgate/bin/devgate-hook".into(),
        hook_state_dir: "/run/devgate".into(),
        ..Config::default()
    };
    assert_eq!(
        hook_args(&config),
        [
            "/opt/devgate/bin/devgate-hook",
            "--state-dir",
            "/run/devgate"
        ]
    );
}
