//! GPU teardown of a sandbox kubelet recreated: the old and the new sandbox
//! of one pod share its cgroup and UID, and may hold shares of one GPU.

use super::fake_host::FakeProc;
use super::pod;
use super::teardown::{claim, dev, node, resets, HALF};
use crate::gpu::host::Signal;
use crate::ledger::{ContainerRecord, PodRef};

const OLD_CTR: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";
const NEW_CTR: &str = "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0";

fn record() -> ContainerRecord {
    ContainerRecord {
        name: "main".to_string(),
        devices: vec!["/dev/nvidia0".to_string()],
        applied_unix: 1,
        init: None,
        cgroups: Vec::new(),
        resolved: None,
        resolved_sha256: None,
        hooks_only: false,
    }
}

fn recreated() -> PodRef {
    PodRef {
        sandbox_id: "sb-a-second".to_string(),
        ..pod("a")
    }
}

/// cgroupfs and systemd paths of one container of pod `uid-a`.
fn paths(ctr: &str) -> [String; 2] {
    [
        format!("0::/kubepods/besteffort/poduid-a/{ctr}\n"),
        format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_a.slice/cri-containerd-{ctr}.scope\n"
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
            .record_container(&old.sandbox_id, OLD_CTR, record())
            .unwrap();
        n.ledger
            .record_container(&new.sandbox_id, NEW_CTR, record())
            .unwrap();
        // As NRI gave the old sandbox's cgroup parent: the pod's cgroup.
        n.teardown
            .set_pod_cgroups(&old.sandbox_id, &["/kubepods/besteffort/poduid-a"]);
        let leftover = FakeProc {
            devs: vec![dev(0)],
            cgroup: old_path.clone(),
            start: 5,
            ..FakeProc::default()
        };
        n.host.add_proc(100, leftover);
        let live = FakeProc {
            devs: vec![dev(0)],
            cgroup: new_path.clone(),
            start: 6,
            ..FakeProc::default()
        };
        n.host.add_proc(200, live);

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
