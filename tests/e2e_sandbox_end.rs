//! A sandbox that claimed its pod's devices at its start and ended with no
//! container, against a real containerd (1.7.24 and 2.1.9: the suite runs
//! under both). containerd sends the plugins nothing for a sandbox whose
//! init died before the kubelet stopped it: the plugin follows the init it
//! was told of at RunPodSandbox, and its retry round releases the claim once
//! that init has exited with still no container recorded.
mod support;

use devgate::fixture::HostRootBuilder;
use support::node::{gpu_entry, gpus, Node, DEVICE_ALLOCATED};
use support::{require_root, run, wait_for, ContainerSpec, PodSpec, SLOW};

/// The pid runc reports for the sandbox's init (the pause process).
fn sandbox_init(node: &Node, sandbox_id: &str) -> i32 {
    let root = node.ctrd.path("runc").join("k8s.io");
    let root = root.to_str().expect("utf-8 runc root");
    let out = run("runc", &["--root", root, "state", sandbox_id]).expect("runc state");
    let state: serde_json::Value = serde_json::from_str(&out).unwrap();
    state["pid"].as_i64().expect("pid") as i32
}

#[test]
fn a_sandbox_whose_init_ended_with_no_container_is_released() {
    require_root();
    let node = Node::start_full(
        HostRootBuilder::hgx(),
        "[gpu]\nhealth_interval_secs = 1\n",
        &[],
    );
    let cri = node.cri();
    let (ended_gpu, kept_gpu) = (node.gpu(3).uuid.clone(), node.gpu(4).uuid.clone());
    let ended = cri
        .run_pod(
            &PodSpec::new("ended").annotation(DEVICE_ALLOCATED, &gpus(&[gpu_entry(3, &ended_gpu)])),
        )
        .unwrap();
    let kept = cri
        .run_pod(
            &PodSpec::new("kept").annotation(DEVICE_ALLOCATED, &gpus(&[gpu_entry(4, &kept_gpu)])),
        )
        .unwrap();
    cri.create_container(&kept, &ContainerSpec::shell("main", "true"))
        .unwrap();
    let held = |uuid: &str| node.ledger().devices.contains_key(&format!("gpu {uuid}"));
    assert!(
        held(&ended_gpu) && held(&kept_gpu),
        "claimed at their start"
    );

    // Rounds pass while the init lives: nothing is released.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(held(&ended_gpu), "its init lives");

    // Both inits die; no event reaches the plugin.
    for pod in [&ended, &kept] {
        let pid = nix::unistd::Pid::from_raw(sandbox_init(&node, &pod.id));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    }
    wait_for("the ended sandbox's claim released", SLOW, || {
        (!held(&ended_gpu)).then_some(())
    });
    // Rounds pass: the sandbox with a container keeps its claim.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(
        held(&kept_gpu),
        "a sandbox with a container is left to its stop and removal"
    );
    assert!(!node.ledger().pods.contains_key(&ended.id));
}
