//! `Devices`: the VF MAC policy and the hook the adjustment names.
use super::*;
use crate::config;
use crate::hook::Resolved;
use crate::hook::RESOLVED_ANNOTATION;
use crate::inventory::PciAddr;
use crate::netdev;

#[test]
fn random_mac_is_stable_local_unicast() {
    let vf: PciAddr = "0000:19:00.1".parse().unwrap();
    let a = pod_mac("uid-1", &vf);
    assert_eq!(a, pod_mac("uid-1", &vf));
    assert_ne!(a, pod_mac("uid-2", &vf));
    assert_ne!(a, pod_mac("uid-1", &"0000:19:00.2".parse().unwrap()));
    assert_eq!(a[0] & 0x03, 0x02);
    // Pinned: a release that derived it otherwise would give a pod's VF,
    // moved in again after its owner stopped, another MAC.
    assert_eq!(a, PINNED_MAC);
}

/// `pod_mac("uid-1", 0000:19:00.1)`: the first six bytes of SHA-256 of
/// `"uid-1"`, a NUL byte and `"0000:19:00.1"`, the first with bit 1 set and
/// bit 0 cleared.
const PINNED_MAC: [u8; 6] = [0xc2, 0x32, 0x38, 0x4f, 0xc0, 0x6f];

/// A plugin's devices on the HGX fixture, under a temporary directory.
struct Node {
    dir: tempfile::TempDir,
    fixture: crate::fixture::Fixture,
    devices: Arc<Devices>,
    /// Holds GPU minor 0 and the first VF of the first NIC.
    pod: PodSandbox,
    health: crate::gpu::HealthStore,
}

impl Node {
    /// `Devices::apply` for container `id` of the node's pod, with `env`.
    fn create(
        &self,
        id: &str,
        env: &[&str],
        config: &Arc<Config>,
        features: RuntimeFeatures,
    ) -> Result<ContainerAdjustment, DeviceError> {
        self.devices.apply(
            &self.pod,
            &container(id, env),
            config,
            features,
            &self.health,
        )
    }
}

fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let fixture = crate::fixture::HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .unwrap();
    let devices = Arc::new(
        Devices::open(
            fixture.root(),
            &dir.path().join("state"),
            "/plugin/bin/devgate-hook".into(),
            None,
        )
        .unwrap(),
    );
    Node {
        pod: gpu_vf_pod(&fixture),
        health: crate::gpu::HealthStore::new(&dir.path().join("health")),
        dir,
        fixture,
        devices,
    }
}

/// A pod with GPU minor 0 and the first VF of the first NIC.
fn gpu_vf_pod(fixture: &crate::fixture::Fixture) -> PodSandbox {
    let inv = fixture.expected();
    let (gpu, nic) = (&inv.gpus[0], &inv.rdma[0]);
    let mut pod = PodSandbox {
        id: "sandbox".into(),
        uid: "uid".into(),
        ..Default::default()
    };
    pod.annotations.insert(
        crate::allocation::DEVICE_ALLOCATED.into(),
        format!(
            r#"{{"gpu":[{{"minor":{},"id":"{}","resources":{{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}}}],"rdma":[{{"minor":0,"id":"{}","resources":{{"koordinator.sh/rdma":"1"}},"extension":{{"vfs":[{{"minor":-1,"busID":"{}"}}]}}}}]}}"#,
            gpu.minor, gpu.uuid, nic.bus_id, nic.vfs[0].bus_id
        ),
    );
    pod
}

fn container(id: &str, env: &[&str]) -> Container {
    Container {
        id: id.into(),
        name: id.into(),
        env: env.iter().map(|e| e.to_string()).collect(),
        ..Default::default()
    }
}

/// The hook's arguments for a VF pod's container, under `config`.
fn hook_args(config: &Config) -> Vec<String> {
    let node = node();
    let adj = node
        .create(
            "c1",
            &[],
            &Arc::new(config.clone()),
            RuntimeFeatures::default(),
        )
        .unwrap();
    let hook = &adj
        .hooks
        .as_ref()
        .expect("a VF pod gets the hook")
        .create_runtime[0];
    let mut args = vec![hook.path.clone()];
    args.extend(hook.args[2..].iter().cloned());
    args.iter()
        .map(|a| a.replace(&node.dir.path().display().to_string(), "<dir>"))
        .collect()
}

fn env_of<'a>(adj: &'a ContainerAdjustment, key: &str) -> Option<&'a str> {
    adj.env
        .iter()
        .find(|e| e.key == key)
        .map(|e| e.value.as_str())
}

/// A pod's further containers take its prepared plan: each gets the same
/// devices, and only the network owner the hook and the resolved annotation,
/// which pass to the next container created once the owner is removed.
#[test]
fn further_containers_share_the_plan_and_the_network_owner_moves_on() {
    let node = node();
    let config = Arc::new(Config::default());
    let apply = |id: &str| {
        node.create(id, &[], &config, RuntimeFeatures::default())
            .unwrap()
    };
    let first = apply("c1");
    // c1's hook moves the VF in, its record saved first; the cache not re-read.
    let (saved, net, away) = hook_moved_vf(&node, Left::Whole);
    let second = apply("c2");
    assert!(first.hooks.is_some());
    assert!(first.annotations.contains_key(RESOLVED_ANNOTATION));
    assert!(second.hooks.is_none(), "{second:?}");
    assert!(second.annotations.is_empty());
    assert_eq!(first.linux, second.linux);
    assert_eq!(first.env, second.env);
    assert_eq!(first.mounts, second.mounts);

    // c1's poststop gives the VF back (c2 has exited too: one still running
    // would keep it in the pod, see the hook's siblings); then c1 is removed.
    std::fs::rename(&away, &net).unwrap();
    saved
        .remove(node.fixture.expected().rdma[0].vfs[0].bus_id)
        .unwrap();
    node.devices
        .ledger()
        .remove_container("sandbox", "c1", &|_| false)
        .unwrap();
    let third = apply("c3");
    assert!(third.hooks.is_some(), "the next container owns the network");
    assert_eq!(
        third.annotations[RESOLVED_ANNOTATION],
        first.annotations[RESOLVED_ANNOTATION]
    );
    let state = node.devices.ledger().snapshot().unwrap();
    let owner = state.pods["sandbox"].network_owner.as_deref();
    assert_eq!(owner, Some("c3"));
    let c3 = state.container("c3").unwrap();
    let annotation = &first.annotations[RESOLVED_ANNOTATION];
    assert!(c3.vouches_for(annotation));
    // Recorded as its digest, not as the text.
    assert_eq!(c3.resolved, None);
    assert_eq!(
        c3.resolved_sha256.as_deref(),
        Some(crate::ledger::resolved_digest(annotation).as_str())
    );
    assert!(!c3.vouches_for(&format!("{annotation} ")));
    assert_eq!(c3.devices, state.container("c2").unwrap().devices);
}

/// The variables a container sets itself decide its plan: a sibling that sets
/// `NCCL_IB_HCA` keeps its own, and the next one without it gets the derived one.
#[test]
fn a_containers_own_variables_are_not_taken_from_its_sibling() {
    let node = node();
    let config = Arc::new(Config::default());
    let apply = |id: &str, env: &[&str]| {
        node.create(id, env, &config, RuntimeFeatures::default())
            .unwrap()
    };
    let derived = apply("c1", &["PATH=/bin"]);
    let hca = env_of(&derived, "NCCL_IB_HCA")
        .expect("derived")
        .to_string();
    let own = apply("c2", &["PATH=/bin", "NCCL_IB_HCA=mlx5_7"]);
    assert_eq!(env_of(&own, "NCCL_IB_HCA"), None, "{own:?}");
    // Unrelated variables do not matter; the container's own ones do.
    let again = apply("c3", &["PATH=/usr/bin", "HOME=/root"]);
    assert_eq!(env_of(&again, "NCCL_IB_HCA"), Some(hca.as_str()));
}

/// Marks the pod's GPU unhealthy (a double-bit ECC error); its UUID.
fn mark_unhealthy(node: &Node) -> String {
    let uuid = node.fixture.expected().gpus[0].uuid.clone();
    crate::gpu::HealthStore::new(&node.dir.path().join("health"))
        .mark(&uuid, &[crate::gpu::health::Fault::DoubleBitEcc], 1)
        .unwrap();
    uuid
}

/// GPU health and the claim are checked at every creation, whatever was kept.
#[test]
fn a_gpu_that_turns_unhealthy_refuses_the_pods_next_container() {
    let node = node();
    let config = Arc::new(Config::default());
    let features = RuntimeFeatures::default();
    node.create("c1", &[], &config, features).unwrap();
    let uuid = &mark_unhealthy(&node);
    let err = node.create("c2", &[], &config, features).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "scheduling.koordinator.sh/device-allocated: gpu[0]: gpu {uuid} is unhealthy: "
        )),
        "{err}"
    );
    let state = node.devices.ledger().snapshot().unwrap();
    assert!(state.container("c2").is_none());
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

/// Every VF setting of the node's config reaches the hook, through the resolved
/// annotation, as the netlink values the hook sends.
#[test]
fn node_vf_settings_reach_the_hook() {
    let node = node();
    let config = Config::parse(
        "[vf.defaults]\nmac = \"random\"\nvlan = 100\nqos = 3\nvlan_proto = \"802.1ad\"\n\
         spoofchk = false\ntrust = true\nlink_state = \"disable\"\n\
         min_tx_rate = 10\nmax_tx_rate = 2000\nmtu = 9000\n",
        "t",
    )
    .unwrap();
    let adj = node
        .create("c1", &[], &Arc::new(config), RuntimeFeatures::default())
        .unwrap();
    let resolved = Resolved::parse(&adj.annotations[RESOLVED_ANNOTATION]).unwrap();
    let vf = node.fixture.expected().rdma[0].vfs[0].bus_id;
    assert_eq!(
        resolved.networks[0].settings,
        netdev::VfSettings {
            mac: netdev::HwAddr::new(&pod_mac("uid", &vf)),
            vlan: Some(100),
            qos: Some(3),
            vlan_proto: Some(netdev::VlanProto::Dot1Ad),
            spoofchk: Some(false),
            trust: Some(true),
            link_state: Some(netdev::LinkState::Disable),
            min_tx_rate: Some(10),
            max_tx_rate: Some(2000),
            mtu: Some(9000),
        }
    );
}

/// How a hook's run on a VF left its record.
#[derive(Debug, Clone, Copy)]
pub(super) enum Left {
    /// A finished attach's.
    Whole,
    /// A restore's that began (`restoring`).
    Restoring,
    /// An attach's cut before it finished (`attaching`).
    Attaching,
}

impl Left {
    pub(super) fn mark(self, rec: &mut netdev::SavedVf) {
        rec.restoring = matches!(self, Left::Restoring);
        rec.attaching = matches!(self, Left::Attaching);
    }
}

/// What the owner c1's hook does to the first VF: saves its record first
/// (left as `left` says), then moves its netdev off the host. The store,
/// and the netdev's place with the one it went to.
fn hook_moved_vf(
    node: &Node,
    left: Left,
) -> (netdev::SavedStore, std::path::PathBuf, std::path::PathBuf) {
    let vf = node.fixture.expected().rdma[0].vfs[0].bus_id.to_string();
    let saved = netdev::SavedStore::new(&node.dir.path().join("state"));
    let mut rec = netdev::SavedVf::example("c1", &vf);
    left.mark(&mut rec);
    saved.save(&rec).unwrap();
    let (net, away) = vf_net(node);
    std::fs::rename(&net, &away).unwrap();
    (saved, net, away)
}

/// The VF's sysfs `net/` directory of node `node`, and where to hide it.
fn vf_net(node: &Node) -> (std::path::PathBuf, std::path::PathBuf) {
    let vf = &node.fixture.expected().rdma[0].vfs[0];
    let net = node
        .fixture
        .root()
        .join("sys/bus/pci/devices")
        .join(vf.bus_id.to_string())
        .join("net");
    (net, node.dir.path().join("net-away"))
}

/// A device another pod holds refuses the container, naming the entry.
#[test]
fn a_held_device_is_refused_by_its_entry() {
    let node = node();
    let config = Arc::new(Config::default());
    node.create("c1", &[], &config, RuntimeFeatures::default())
        .unwrap();
    let other = PodSandbox {
        id: "other".into(),
        uid: "uid-2".into(),
        namespace: "ns".into(),
        name: "b".into(),
        ..node.pod.clone()
    };
    let err = node
        .devices
        .apply(
            &other,
            &container("c9", &[]),
            &config,
            RuntimeFeatures::default(),
            &node.health,
        )
        .unwrap_err();
    let uuid = &node.fixture.expected().gpus[0].uuid;
    assert_eq!(
        err.to_string(),
        format!("scheduling.koordinator.sh/device-allocated: gpu[0]: gpu {uuid} is held by pod /")
    );
}

#[path = "devices_ahead_tests.rs"]
mod ahead;

#[path = "devices_refresh_tests.rs"]
mod refresh;

#[path = "devices_pf_tests.rs"]
mod pf;

#[path = "devices_vf_tests.rs"]
mod vf;

#[path = "devices_cdi_tests.rs"]
mod cdi;

#[path = "devices_rules_tests.rs"]
mod rules;
