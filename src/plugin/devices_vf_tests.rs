//! A pod's VFs and their netdevs: found again on the host after a stale
//! read, and moved into the pod by its network owner alone.
use super::*;

/// The cache read while a VF's netdev was in another pod's netns: the
/// container is not refused, nor given the VF without its netdev; the host is
/// read again, and the VF is moved as planned.
#[test]
fn a_vf_netdev_back_on_the_host_is_found_by_a_re_read() {
    let node = node();
    let (net, away) = vf_net(&node);
    std::fs::rename(&net, &away).unwrap();
    let stale = node.devices.refresh();
    assert!(stale.rdma[0].vfs[0].netdev.is_none(), "read while away");
    std::fs::rename(&away, &net).unwrap();
    let config = Arc::new(Config::default());
    let adj = node
        .create("c1", &[], &config, RuntimeFeatures::default())
        .unwrap();
    assert!(adj.annotations.contains_key(RESOLVED_ANNOTATION), "{adj:?}");
    assert!(adj.hooks.is_some());
}

/// Once the network owner moved the VF into the pod, the host has no netdev
/// for it: a further container of that pod, planned from a re-read host, is
/// admitted with the same variables and moves nothing. A pod that does not
/// own the VF cannot be given it without its netdev, and nothing is kept that
/// would spare the next owner its hook.
#[test]
fn a_vf_moved_into_its_pod_serves_the_pods_further_containers_only() {
    let node = node();
    let config = Arc::new(Config::default());
    let features = RuntimeFeatures::default();
    let owner = node.create("c1", &[], &config, features).unwrap();
    // The hook moved it, its record saved first.
    let (_saved, net, away) = hook_moved_vf(&node, Left::Whole);
    node.devices.refresh();
    let sidecar = node.create("c2", &[], &config, features).unwrap();
    assert!(sidecar.hooks.is_none() && sidecar.annotations.is_empty());
    assert_eq!(env_of(&sidecar, "NCCL_SOCKET_IFNAME"), Some("net1"));
    assert_eq!(sidecar.env, owner.env);

    // Another pod given the same VF: the ledger refuses it, whatever the host.
    let other = PodSandbox {
        id: "other".into(),
        uid: "uid-2".into(),
        ..node.pod.clone()
    };
    let e = node
        .devices
        .apply(
            &other,
            &container("o1", &[]),
            &config,
            features,
            &node.health,
        )
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("scheduling.koordinator.sh/device-allocated: rdma[0].vfs[0]: rdma vf ")
            && e.to_string()
                .ends_with(" has no host netdev to move into the pod"),
        "{e}"
    );

    // The owner stopped (the VF back on the host) and went: the next
    // container owns the network and moves the VF again.
    std::fs::rename(&away, &net).unwrap();
    let away = |p: &crate::ledger::PodRecord| node.devices.vfs_away(p);
    node.devices
        .ledger()
        .remove_container("sandbox", "c1", &away)
        .unwrap();
    let next = node.create("c3", &[], &config, features).unwrap();
    assert!(next.hooks.is_some(), "{next:?}");
    assert_eq!(
        next.annotations[RESOLVED_ANNOTATION],
        owner.annotations[RESOLVED_ANNOTATION]
    );
}

/// The owner's poststop brought the VF home but could not finish its restore
/// (its PF settings), so its record stays. An owner whose VFs are all on the
/// host holds nothing: the next container takes the network over (and its
/// hook finishes the restore first) instead of starting without the VF. While
/// the VF is in the pod, a record makes the owner keep it, though the cached
/// inventory still shows the netdev on the host.
#[test]
fn an_owner_whose_vfs_came_home_with_their_records_hands_the_network_over() {
    let node = node();
    let config = Arc::new(Config::default());
    let features = RuntimeFeatures::default();
    let owner = node.create("c1", &[], &config, features).unwrap();
    assert!(owner.hooks.is_some());
    // The hook moved it; not re-read.
    let (_saved, net, away) = hook_moved_vf(&node, Left::Whole);

    let sidecar = node.create("c2", &[], &config, features).unwrap();
    assert!(
        sidecar.hooks.is_none() && sidecar.annotations.is_empty(),
        "{sidecar:?}"
    );

    std::fs::rename(&away, &net).unwrap(); // home, its record kept
    let restarted = node.create("c3", &[], &config, features).unwrap();
    assert!(restarted.hooks.is_some(), "{restarted:?}");
    assert_eq!(
        restarted.annotations[RESOLVED_ANNOTATION],
        owner.annotations[RESOLVED_ANNOTATION]
    );
    let ledger = node.devices.ledger().snapshot().unwrap();
    assert_eq!(ledger.pods["sandbox"].network_owner.as_deref(), Some("c3"));
}

/// The owner's restore failed with its VF still in the pod (or its hook was
/// killed), and kubelet removed the dead container while the pod lives on:
/// the owner stays the owner, so the pod's next container is admitted to the
/// VF in the pod rather than refused until the pod goes. Once the VF is home,
/// a removal hands the network on.
#[test]
fn a_removed_owner_whose_vf_is_still_away_keeps_the_network() {
    let node = node();
    let config = Arc::new(Config::default());
    let features = RuntimeFeatures::default();
    let owner = node.create("c1", &[], &config, features).unwrap();
    // In the pod, its restore failed.
    let (saved, net, away) = hook_moved_vf(&node, Left::Whole);
    node.devices.refresh();
    let vfs_away = |p: &crate::ledger::PodRecord| node.devices.vfs_away(p);
    let ledger = node.devices.ledger();
    ledger.remove_container("sandbox", "c1", &vfs_away).unwrap();
    let pod = &ledger.snapshot().unwrap().pods["sandbox"];
    assert_eq!(pod.network_owner.as_deref(), Some("c1"));
    assert!(!pod.containers.contains_key("c1"));

    let next = node.create("c3", &[], &config, features).unwrap();
    assert!(
        next.hooks.is_none() && next.annotations.is_empty(),
        "{next:?}"
    );
    assert_eq!(next.env, owner.env);

    // Home again (a later restore): the owner's removal now hands it on.
    std::fs::rename(&away, &net).unwrap();
    saved
        .remove(node.fixture.expected().rdma[0].vfs[0].bus_id)
        .unwrap();
    ledger.remove_container("sandbox", "c1", &vfs_away).unwrap();
    assert_eq!(
        ledger.snapshot().unwrap().pods["sandbox"].network_owner,
        None
    );
}

/// Records the restores it is asked to finish; finishes none.
#[derive(Default)]
struct Finishes(std::sync::Mutex<Vec<(String, Vec<crate::inventory::PciAddr>)>>);

impl crate::plugin::vf_finish::FinishRestore for Finishes {
    fn finish(&self, sandbox: &str, container: &str, vfs: &[crate::inventory::PciAddr]) {
        assert_eq!(sandbox, "sandbox");
        self.0
            .lock()
            .unwrap()
            .push((container.to_string(), vfs.to_vec()));
    }
}

/// A restore began on the VF and stopped with it still in the pod (down,
/// its VLAN perhaps reset; its poststop killed by the runtime's hook
/// timeout): no container of the pod is given it as it is. The plugin
/// finishes that restore and refuses the container once; kubelet's retry,
/// with the VF home, moves it in again.
#[test]
fn a_vf_a_restore_began_on_is_finished_before_a_container_gets_it() {
    cut_run_is_restored_before_a_container_gets_it(Left::Restoring);
}

/// The same for an attach cut after the move (the runtime died during
/// createRuntime: no rollback, no poststop), which may have left the VF in
/// the pod not renamed, configured or up.
#[test]
fn a_vf_whose_attach_was_cut_is_restored_before_a_container_gets_it() {
    cut_run_is_restored_before_a_container_gets_it(Left::Attaching);
}

fn cut_run_is_restored_before_a_container_gets_it(left: Left) {
    let node = node();
    let finishes = Arc::new(Finishes::default());
    node.devices.set_finish_restore(finishes.clone());
    let config = Arc::new(Config::default());
    let features = RuntimeFeatures::default();
    let owner = node.create("c1", &[], &config, features).unwrap();
    let (saved, net, away) = hook_moved_vf(&node, left);
    node.devices.refresh();
    let e = node.create("c2", &[], &config, features).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("scheduling.koordinator.sh/device-allocated: rdma[0].vfs[0]: rdma vf ")
            && e.to_string().contains(
                " is left in the pod by an earlier container's hook that stopped part way "
            ),
        "{e}"
    );
    let vf = node.fixture.expected().rdma[0].vfs[0].bus_id;
    assert_eq!(*finishes.0.lock().unwrap(), [("c1".to_string(), vec![vf])]);
    let ledger = node.devices.ledger();
    assert!(
        !ledger.snapshot().unwrap().pods["sandbox"]
            .containers
            .contains_key("c2"),
        "nothing recorded for the refused container"
    );

    // The restore finished: the VF home, its record gone. The retry moves it.
    std::fs::rename(&away, &net).unwrap();
    saved.remove(vf).unwrap();
    let retried = node.create("c2", &[], &config, features).unwrap();
    assert!(retried.hooks.is_some(), "{retried:?}");
    assert_eq!(
        retried.annotations[RESOLVED_ANNOTATION],
        owner.annotations[RESOLVED_ANNOTATION]
    );
    assert_eq!(finishes.0.lock().unwrap().len(), 1);
    assert_eq!(
        ledger.snapshot().unwrap().pods["sandbox"]
            .network_owner
            .as_deref(),
        Some("c2")
    );
}

/// The owner's poststop gave the pod's network up and was killed before its
/// restore began: the VF is in the pod, whole, and no container owns it. The
/// pod's next container starts that restore and is refused once, rather than
/// refused for good for a VF with no netdev on the host.
#[test]
fn a_vf_whose_owner_gave_the_network_up_is_restored_before_a_container_gets_it() {
    let node = node();
    let finishes = Arc::new(Finishes::default());
    node.devices.set_finish_restore(finishes.clone());
    let config = Arc::new(Config::default());
    let features = RuntimeFeatures::default();
    node.create("c1", &[], &config, features).unwrap();
    let (saved, net, away) = hook_moved_vf(&node, Left::Whole);
    node.devices.refresh();
    let ledger = node.devices.ledger();
    ledger.give_up_network("c1").unwrap();
    let e = node.create("c2", &[], &config, features).unwrap_err();
    assert!(
        e.to_string()
            .contains(" is left in the pod by an earlier container's hook"),
        "{e}"
    );
    let vf = node.fixture.expected().rdma[0].vfs[0].bus_id;
    assert_eq!(*finishes.0.lock().unwrap(), [("c1".to_string(), vec![vf])]);

    // Home again: the retry moves it in and owns the network.
    std::fs::rename(&away, &net).unwrap();
    saved.remove(vf).unwrap();
    let retried = node.create("c2", &[], &config, features).unwrap();
    assert!(retried.hooks.is_some(), "{retried:?}");
    assert_eq!(
        ledger.snapshot().unwrap().pods["sandbox"]
            .network_owner
            .as_deref(),
        Some("c2")
    );
}

/// While the restore or the attach is unfinished, the owner's removal gives
/// up the network; a finished attach keeps it.
#[test]
fn a_removed_owner_whose_vf_is_half_restored_gives_up_the_network() {
    for (left, kept) in [
        (Left::Restoring, false),
        (Left::Attaching, false),
        (Left::Whole, true),
    ] {
        let node = node();
        node.devices
            .set_finish_restore(Arc::new(Finishes::default()));
        let config = Arc::new(Config::default());
        node.create("c1", &[], &config, RuntimeFeatures::default())
            .unwrap();
        hook_moved_vf(&node, left);
        let vfs_away = |p: &crate::ledger::PodRecord| node.devices.vfs_away(p);
        let ledger = node.devices.ledger();
        ledger.remove_container("sandbox", "c1", &vfs_away).unwrap();
        let owner = ledger.snapshot().unwrap().pods["sandbox"]
            .network_owner
            .clone();
        assert_eq!(owner.is_some(), kept, "{left:?}");
    }
}

/// The pod's first NIC's first two VFs, the first moved by `c1` (its record
/// left as said) and the second as said: away with a whole record of `c1`,
/// or home.
fn two_vfs(node: &Node, first: Left, second_away: bool) -> [crate::inventory::PciAddr; 2] {
    let nic = &node.fixture.expected().rdma[0];
    let vfs = [nic.vfs[0].bus_id, nic.vfs[1].bus_id];
    let saved = netdev::SavedStore::new(&node.dir.path().join("state"));
    for (i, vf) in vfs.iter().enumerate() {
        if i == 1 && !second_away {
            continue;
        }
        let mut rec = netdev::SavedVf::example("c1", &vf.to_string());
        if i == 0 {
            first.mark(&mut rec);
        }
        saved.save(&rec).unwrap();
        let net = node
            .fixture
            .root()
            .join("sys/bus/pci/devices")
            .join(vf.to_string())
            .join("net");
        std::fs::rename(&net, node.dir.path().join(format!("away-{i}"))).unwrap();
    }
    vfs
}

/// A node whose pod has the first NIC's first two VFs, its owner `c1` created.
fn two_vf_node() -> (Node, Arc<Finishes>) {
    let mut node = node();
    let nic = &node.fixture.expected().rdma[0];
    let allocation = format!(
        r#"{{"rdma":[{{"minor":0,"id":"{}","resources":{{"koordinator.sh/rdma":"1"}},"extension":{{"vfs":[{{"minor":-1,"busID":"{}"}},{{"minor":-1,"busID":"{}"}}]}}}}]}}"#,
        nic.bus_id, nic.vfs[0].bus_id, nic.vfs[1].bus_id
    );
    node.pod
        .annotations
        .insert(crate::allocation::DEVICE_ALLOCATED.into(), allocation);
    let finishes = Arc::new(Finishes::default());
    node.devices.set_finish_restore(finishes.clone());
    let owner = node
        .create(
            "c1",
            &[],
            &Arc::new(Config::default()),
            RuntimeFeatures::default(),
        )
        .unwrap();
    assert!(owner.hooks.is_some());
    (node, finishes)
}

/// The pod's next container `c2`, refused: the reason.
fn refused_next(node: &Node) -> String {
    let config = Arc::new(Config::default());
    node.devices.refresh();
    let e = node.create("c2", &[], &config, RuntimeFeatures::default());
    e.unwrap_err().to_string()
}

/// The owner's poststop was cut between two VFs (or its attach, before the
/// second was saved): one home, one still in the pod as it was moved. The
/// pod's next container is refused rather than started with the one in the
/// pod alone, and the one in the pod is brought home, so that the retry
/// moves both in.
#[test]
fn a_pod_whose_vfs_are_split_between_host_and_pod_is_refused() {
    let (node, finishes) = two_vf_node();
    let vfs = two_vfs(&node, Left::Whole, false);
    let e = refused_next(&node);
    assert!(
        e.contains(&format!(
            "rdma vf {} is left in the pod by an earlier container's hook that stopped part way ",
            vfs[0]
        )),
        "{e}"
    );
    let asked = finishes.0.lock().unwrap().clone();
    assert_eq!(asked, [("c1".to_string(), vfs.to_vec())]);
}

/// A restore began on one VF of the owner's, or its attach was cut: every
/// VF that owner moved is restored, so the next attempt moves them in
/// together.
#[test]
fn every_vf_the_owner_moved_is_restored_once_one_restore_began() {
    for left in [Left::Restoring, Left::Attaching] {
        let (node, finishes) = two_vf_node();
        let vfs = two_vfs(&node, left, true);
        let e = refused_next(&node);
        assert!(
            e.contains(" is left in the pod by an earlier container's hook that stopped part way "),
            "{left:?}: {e}"
        );
        let asked = finishes.0.lock().unwrap().clone();
        assert_eq!(asked, [("c1".to_string(), vfs.to_vec())], "{left:?}");
    }
}
