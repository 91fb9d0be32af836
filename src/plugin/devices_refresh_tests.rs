//! `Devices` when the host or the runtime changed under it: a replaced GPU,
//! a network owner that never ran.
use super::*;
use crate::allocation::DEVICE_ALLOCATED;

/// A GPU replaced after the cache was read (same minor, a new UUID): the
/// scheduler's UUID disagrees with the cache, and the host is read again
/// before the container is refused.
#[test]
fn a_gpu_uuid_the_cache_does_not_match_is_checked_by_a_re_read() {
    let node = node();
    let gpu = node.fixture.expected().gpus[0].clone();
    let info = node
        .fixture
        .root()
        .join("proc/driver/nvidia/gpus")
        .join(gpu.bus_id.to_string())
        .join("information");
    let text = std::fs::read_to_string(&info).unwrap();
    let new_uuid = "GPU-00000000-1111-2222-3333-444444444444";
    std::fs::write(&info, text.replace(&gpu.uuid, new_uuid)).unwrap();
    let mut pod = node.pod.clone();
    let ann = pod
        .annotations
        .get_mut(crate::allocation::DEVICE_ALLOCATED)
        .unwrap();
    *ann = ann.replace(&gpu.uuid, new_uuid);
    let config = Arc::new(Config::default());
    let adj = node
        .devices
        .apply(
            &pod,
            &container("c1", &[]),
            &config,
            RuntimeFeatures::default(),
            &node.health,
        )
        .unwrap();
    let visible = adj.env.iter().find(|e| e.key == "NVIDIA_VISIBLE_DEVICES");
    assert_eq!(visible.map(|e| e.value.as_str()), Some(new_uuid));
}

/// A container whose allocation resolves to other devices than its pod's
/// claim (a GPU renumbered since, or the annotation changed) is refused
/// naming the annotation, the entry and the device that differs.
#[test]
fn a_claim_that_differs_from_the_pods_names_the_entry_and_the_device() {
    let node = node();
    let config = Arc::new(Config::default());
    node.create("c1", &[], &config, RuntimeFeatures::default())
        .unwrap();
    let inv = node.fixture.expected();
    let (was, now) = (&inv.gpus[0], &inv.gpus[1]);
    let mut pod = node.pod.clone();
    let ann = pod.annotations.get_mut(DEVICE_ALLOCATED).unwrap();
    *ann = ann.replace(&was.uuid, &now.uuid).replace(
        &format!(r#""minor":{},"id""#, was.minor),
        &format!(r#""minor":{},"id""#, now.minor),
    );
    let e = node
        .devices
        .apply(
            &pod,
            &container("c2", &[]),
            &config,
            RuntimeFeatures::default(),
            &node.health,
        )
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("{DEVICE_ALLOCATED}: gpu[0]: ")),
        "{text}"
    );
    assert!(
        text.contains(&format!("gpu {} is asked and not among them", now.uuid)),
        "{text}"
    );
}

/// The runtime failed the network owner's creation after the plugin answered
/// and never said so: its hook never ran and no VF of the pod was moved. The
/// next container created takes the pod's network over and moves the VFs.
#[test]
fn an_owner_that_never_ran_gives_the_network_to_the_next_container() {
    let node = node();
    let config = Arc::new(Config::default());
    let apply = |id: &str| {
        node.create(id, &[], &config, RuntimeFeatures::default())
            .unwrap()
    };
    let first = apply("c1");
    let retry = apply("c2");
    assert!(retry.hooks.is_some(), "{retry:?}");
    assert_eq!(
        retry.annotations[RESOLVED_ANNOTATION],
        first.annotations[RESOLVED_ANNOTATION]
    );
    let state = node.devices.ledger().snapshot().unwrap();
    assert_eq!(state.pods["sandbox"].network_owner.as_deref(), Some("c2"));
    let annotation = &first.annotations[RESOLVED_ANNOTATION];
    let c1 = state.container("c1").unwrap();
    assert!(
        !c1.vouches_for(annotation),
        "c1's annotation no longer vouched for"
    );
    assert!(state.container("c2").unwrap().vouches_for(annotation));
}

/// A creation that reaches the plugin after its sandbox's StopPodSandbox
/// (the runtime checked the sandbox ready just before) claims nothing, so
/// the devices are not held until the sandbox's removal; a sandbox removed
/// is forgotten, as is one a Synchronize no longer lists (its removal
/// missed while the plugin was away).
#[test]
fn a_creation_after_the_sandbox_stopped_claims_nothing() {
    let node = node();
    let config = Arc::new(Config::default());
    node.devices.pod_stopped(&node.pod.id);
    let e = node
        .create("late", &[], &config, RuntimeFeatures::default())
        .unwrap_err();
    assert!(matches!(e, DeviceError::Stopped { .. }), "{e}");
    assert!(
        e.to_string().starts_with(DEVICE_ALLOCATED),
        "names the annotation: {e}"
    );
    assert!(node.devices.ledger().snapshot().unwrap().pods.is_empty());
    node.devices.pod_removed(&node.pod.id);
    node.create("next", &[], &config, RuntimeFeatures::default())
        .unwrap();
    assert_eq!(node.devices.ledger().snapshot().unwrap().pods.len(), 1);

    node.devices.pod_stopped("gone");
    node.devices.pod_stopped(&node.pod.id);
    node.devices.pods_listed(&[node.pod.id.as_str()].into());
    let e = node.create("later", &[], &config, RuntimeFeatures::default());
    assert!(
        matches!(e, Err(DeviceError::Stopped { .. })),
        "still listed"
    );
    assert!(!node.devices.stopped.contains("gone"), "its removal missed");
}

/// Exclusive RDMA netns mode: the pod's owner moved its VF's netdev and RDMA
/// device into the pod, and the host is read again since (a restart of the
/// plugin, another pod's refresh). The pod's next container still gets the
/// VF's char devices, found through their class entries.
#[test]
fn a_vf_whose_rdma_device_is_in_the_pod_serves_its_next_container_after_a_re_read() {
    let node = node();
    let mut config = Config::default();
    config.rdma.netns_mode = crate::config::RdmaNetnsMode::Exclusive;
    let config = Arc::new(config);
    let features = RuntimeFeatures::default();
    let owner = node.create("c1", &[], &config, features).unwrap();
    // The hook moved both into the pod's netns, its record saved first.
    hook_moved_vf(&node, Left::Whole);
    let ibdev = &node.fixture.expected().rdma[0].vfs[0]
        .rdma
        .as_ref()
        .unwrap()
        .name;
    let class_link = node.fixture.root().join("sys/class/infiniband").join(ibdev);
    let ibdir = std::fs::canonicalize(&class_link).unwrap();
    std::fs::remove_file(&class_link).unwrap();
    std::fs::remove_dir_all(&ibdir).unwrap();
    node.devices.refresh();
    node.devices.forget_pod("sandbox");

    let sidecar = node.create("c2", &[], &config, features).unwrap();
    assert!(sidecar.hooks.is_none(), "{sidecar:?}");
    assert_eq!(sidecar.linux.devices, owner.linux.devices);
}

/// The first VF's uverbs as a plan grants it, and its number in the host tree.
struct Uverbs {
    path: String,
    major: u32,
    minor: u32,
    dev: std::path::PathBuf,
}

impl Uverbs {
    fn of(node: &Node) -> Uverbs {
        use crate::inventory::model::RdmaCharKind;
        let vf = &node.fixture.expected().rdma[0].vfs[0];
        let uverbs = vf
            .rdma
            .as_ref()
            .unwrap()
            .char_devs
            .iter()
            .find(|c| c.kind == RdmaCharKind::Uverbs)
            .unwrap()
            .clone();
        Uverbs {
            path: format!("/dev/infiniband/{}", uverbs.name),
            major: uverbs.dev.major,
            minor: uverbs.dev.minor,
            dev: node
                .fixture
                .root()
                .join("sys/class/infiniband_verbs")
                .join(&uverbs.name)
                .join("dev"),
        }
    }

    /// Numbers it anew in the host tree, as the kernel does when the RDMA
    /// core registers the device again; the new minor.
    fn renumber(&self) -> u32 {
        let renumbered = self.minor + 64;
        std::fs::write(&self.dev, format!("{}:{renumbered}\n", self.major)).unwrap();
        renumbered
    }

    /// The minor an adjustment grants it.
    fn minor_in(&self, adj: &ContainerAdjustment) -> Option<i64> {
        let devices = &adj.linux.as_ref().unwrap().devices;
        devices
            .iter()
            .find(|d| d.path == self.path)
            .map(|d| d.minor)
    }
}

/// A VF's uverbs numbered anew by the kernel (its PF's VFs made again, an
/// RDMA device moved between namespaces: the lowest free minor is taken)
/// while the cache holds the old number. Until the kernel reports a change
/// the cache answers; once its uevent count moved, the next plan reads the
/// host again and grants the number the VF has now, not one another VF may
/// hold.
#[test]
fn a_uverbs_numbered_anew_is_read_again_after_a_uevent() {
    let node = node();
    let uverbs = Uverbs::of(&node);
    let config = Arc::new(Config::default());
    let features = RuntimeFeatures::default();
    let before = node.create("c1", &[], &config, features).unwrap();
    assert_eq!(uverbs.minor_in(&before), Some(i64::from(uverbs.minor)));
    let renumbered = uverbs.renumber();
    let cached = node.create("c2", &[], &config, features).unwrap();
    assert_eq!(uverbs.minor_in(&cached), Some(i64::from(uverbs.minor)));
    node.devices.host_changes().bump();
    let after = node.create("c3", &[], &config, features).unwrap();
    assert_eq!(uverbs.minor_in(&after), Some(i64::from(renumbered)));
}

/// Where the kernel's uevents cannot be read, the host is read again each
/// period on the inventory thread: a uverbs numbered anew is granted by its
/// new number once a period has passed, with no uevent.
#[test]
fn without_uevents_the_host_is_read_again_each_period() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let node = node();
    let uverbs = Uverbs::of(&node);
    let config = Arc::new(Config::default());
    let features = RuntimeFeatures::default();
    node.create("c1", &[], &config, features).unwrap();
    let renumbered = uverbs.renumber();
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&reads);
    *node.devices.after_read.lock().unwrap() = Some(Box::new(move || {
        counted.fetch_add(1, Ordering::SeqCst);
    }));
    node.devices
        // Long beside a read of the fixture (milliseconds): three reads 20 ms
        // apart each overtaken by a period's change, which would refuse the
        // pod's RDMA devices as changing, would need reads nearly this long.
        .poll_host(std::time::Duration::from_millis(500))
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while reads.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(reads.load(Ordering::SeqCst) >= 2, "read again each period");
    let after = node.create("c2", &[], &config, features).unwrap();
    assert_eq!(uverbs.minor_in(&after), Some(i64::from(renumbered)));
}

/// A read of the host during which the kernel reported device changes is
/// read again (three reads at most) and, overtaken each time, not taken as
/// current: a plan with RDMA devices is refused from it, a GPU-only one is
/// not, and once the changes stop one read is kept as current.
#[test]
fn a_read_a_change_overtook_is_read_again_and_refuses_rdma() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let node = node();
    let changes = Arc::clone(node.devices.host_changes());
    let reads = Arc::new(AtomicUsize::new(0));
    // A change during each of the first `overtaken` reads.
    let overtake = |overtaken: usize| {
        let (during, reads) = (Arc::clone(&changes), Arc::clone(&reads));
        reads.store(0, Ordering::SeqCst);
        *node.devices.after_read.lock().unwrap() = Some(Box::new(move || {
            if reads.fetch_add(1, Ordering::SeqCst) < overtaken {
                during.bump();
            }
        }));
        changes.bump();
    };
    overtake(2);
    node.devices.fresh_inventory();
    assert_eq!(reads.load(Ordering::SeqCst), 3);
    assert!(node.devices.is_current(), "the third read was settled");

    let config = Arc::new(Config::default());
    overtake(usize::MAX);
    let err = node
        .create("c1", &[], &config, RuntimeFeatures::default())
        .unwrap_err();
    assert_eq!(reads.load(Ordering::SeqCst), 3);
    assert!(!node.devices.is_current());
    assert_eq!(
        nri::ErrorChain(&err).to_string(),
        "scheduling.koordinator.sh/device-allocated: rdma: the node's devices changed during each read of them (devices being made, reloaded or moved): refused until they settle"
    );
    assert!(node.devices.ledger().snapshot().unwrap().pods.is_empty());
    let gpu = &node.fixture.expected().gpus[1];
    let mut gpu_only = node.pod.clone();
    gpu_only.id = "gpu-only".into();
    gpu_only.annotations.insert(
        crate::allocation::DEVICE_ALLOCATED.into(),
        format!(
            r#"{{"gpu":[{{"minor":{},"id":"{}"}}]}}"#,
            gpu.minor, gpu.uuid
        ),
    );
    node.devices
        .apply(
            &gpu_only,
            &container("g1", &[]),
            &config,
            RuntimeFeatures::default(),
            &node.health,
        )
        .expect("no rdma device: planned from the overtaken read");

    overtake(0);
    node.create("c1", &[], &config, RuntimeFeatures::default())
        .expect("settled");
    assert_eq!(reads.load(Ordering::SeqCst), 1);
    assert!(node.devices.is_current());
}
