//! GPU teardown of a sandbox kubelet recreated: the old and the new sandbox
//! of one pod share its cgroup and UID, and may hold shares of one GPU.

use super::pod;
use super::teardown::{claim, dev, node, resets, HALF};
use crate::gpu::host::Signal;
use crate::ledger::tests::record;
use crate::ledger::PodRef;

const OLD_CTR: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";
const NEW_CTR: &str = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0";

fn recreated() -> PodRef {
    PodRef {
        sandbox_id: "sb-a-second".to_string(),
        ..pod("a")
    }
}

/// cgroupfs and systemd paths of one container of pod `uid-a`.
fn paths(ctr: &str) -> [String; 2] {
    [
        format!("/kubepods/besteffort/poduid-a/{ctr}"),
        format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_a.slice/cri-containerd-{ctr}.scope"
        ),
    ]
}

#[test]
fn releasing_the_old_sandbox_ends_only_its_own_containers() {
    for (old_path, new_path) in paths(OLD_CTR).into_iter().zip(paths(NEW_CTR)) {
        let n = node(|_| {});
        let (old, new) = (pod("a"), recreated());
        n.ledger.claim(&old, &[claim("GPU-0", HALF)]).unwrap();
        n.ledger.claim(&new, &[claim("GPU-0", HALF)]).unwrap();
        n.ledger
            .record_container(&old.sandbox_id, OLD_CTR, record("main"))
            .unwrap();
        n.ledger
            .record_container(&new.sandbox_id, NEW_CTR, record("main"))
            .unwrap();
        // As NRI gave the old sandbox's cgroup parent: the pod's cgroup.
        n.teardown
            .set_pod_cgroups(&old.sandbox_id, &["/kubepods/besteffort/poduid-a"]);
        n.host.add(100, &[dev(0)], &old_path);
        n.host.add(200, &[dev(0)], &new_path);

        let out = n.ledger.release_pod(&old.sandbox_id, &n.teardown).unwrap();
        assert_eq!(out.failed, vec![], "{old_path}");
        assert_eq!(n.host.signals(), vec![(100, Signal::Term)], "{new_path}");
        assert!(n.host.alive(200), "the new sandbox's process lives");
        assert_eq!(resets(&n.nvml, "GPU-0"), 0, "a gpu still held is not reset");
        let state = n.ledger.snapshot().unwrap();
        assert!(!state.pods.contains_key(&old.sandbox_id));
        assert!(state.devices["gpu GPU-0"].quarantine.is_none());

        // The new sandbox, the pod's only one now, is released by its
        // cgroups again: a process of the pod outside any recorded
        // container ends too.
        n.host
            .add(300, &[dev(0)], "/kubepods/besteffort/poduid-a/other");
        let out = n.ledger.release_pod(&new.sandbox_id, &n.teardown).unwrap();
        assert_eq!(out.failed, vec![]);
        let ended: Vec<u32> = n.host.signals().iter().map(|(pid, _)| *pid).collect();
        assert_eq!(ended, vec![100, 200, 300]);
        assert_eq!(
            resets(&n.nvml, "GPU-0"),
            1,
            "the last holder's release resets"
        );
    }
}

/// A process of the pod in no container of either sandbox, while both
/// hold the GPU: not provably the old sandbox's, so not ended by its
/// release; the GPU is not the old sandbox's last, so nothing fails.
#[test]
fn a_pod_process_of_no_recorded_container_is_left_while_a_sibling_holds_devices() {
    let n = node(|_| {});
    let (old, new) = (pod("a"), recreated());
    n.ledger.claim(&old, &[claim("GPU-0", HALF)]).unwrap();
    n.ledger.claim(&new, &[claim("GPU-0", HALF)]).unwrap();
    n.host
        .add(100, &[dev(0)], "/kubepods/besteffort/poduid-a/short");
    let out = n.ledger.release_pod(&old.sandbox_id, &n.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert_eq!(n.host.signals(), vec![]);
    assert!(n.host.alive(100));
}

/// A ledger that tells the GPU's holders but not the pod's other sandboxes.
struct SiblingsUnknown;

impl crate::gpu::ClaimView for SiblingsUnknown {
    fn holders(&self, _device: &crate::ledger::DeviceId) -> Result<Vec<String>, String> {
        Ok(vec!["sb-a".to_string(), "sb-a-second".to_string()])
    }

    fn siblings(&self, _pod: &PodRef) -> Result<Vec<String>, String> {
        Err("ledger unreadable".to_string())
    }
}

/// Where the ledger cannot say whether another sandbox of the pod runs,
/// only the released sandbox's own containers' processes are ended.
#[test]
fn unknown_siblings_narrow_the_release_to_its_own_containers() {
    use crate::ledger::{PodRecord, Teardown};
    let n = node(|_| {});
    let teardown = crate::gpu::GpuTeardown::new(
        super::gpu_inventory(195, &[0, 1, 2]),
        n.teardown.config().clone(),
        n.host.clone(),
        n.nvml.clone(),
        std::sync::Arc::new(SiblingsUnknown),
    );
    let [old_path, _] = paths(OLD_CTR);
    let [new_path, _] = paths(NEW_CTR);
    n.host.add(100, &[dev(0)], &old_path);
    n.host.add(200, &[dev(0)], &new_path);
    let record = PodRecord {
        pod: pod("a"),
        claims: vec![claim("GPU-0", HALF)],
        claimed_unix: 1,
        containers: [(OLD_CTR.to_string(), record("main"))].into(),
        network_owner: None,
        admitted: 0,
    };
    teardown.teardown(&record).unwrap();
    assert_eq!(n.host.signals(), vec![(100, Signal::Term)]);
    assert!(n.host.alive(200));
}
