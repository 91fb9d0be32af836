//! Only the scheduler grants devices, against a real containerd (1.7.24 and
//! 2.1.9: the suite runs under both): devgate
//! watches this node's pods on a fake API server (plain HTTP on localhost, in this
//! process) and refuses an allocation its pod's containers do not request.
mod support;

use std::time::{Duration, Instant};

use devgate::fixture::HostRootBuilder;
use devgate::grant::fake_api::{pod, FakeApi};
use support::node::{gpu_entry, gpus, Node, DEVICE_ALLOCATED};
use support::{require_root, ContainerSpec, PodSpec};

const NODE: &str = "e2e-node";

fn start(api: &FakeApi) -> Node {
    let config = format!(
        "grant_check = \"requests\"\ngrant_wait_ms = 400\n[kube_api]\nurl = \"{}\"\nnode_name = \"{NODE}\"\n",
        api.url()
    );
    Node::start_full(HostRootBuilder::hgx(), &config, &[])
}

#[test]
fn forged_allocation_is_refused_and_a_requesting_pod_starts() {
    require_root();
    let api = FakeApi::start().expect("fake api server");
    let node = start(&api);
    let cri = node.cri();
    let gpu = node.gpu(2).clone();
    let alloc = gpus(&[gpu_entry(2, &gpu.uuid)]);

    // A tenant's pod that requests no device but carries an allocation.
    let forged = PodSpec::new("forged").annotation(DEVICE_ALLOCATED, &alloc);
    api.put_pod(pod("default", "forged", &forged.uid, NODE, &[("cpu", "1")]));
    let sandbox = cri.run_pod(&forged).expect("RunPodSandbox");
    let err = cri
        .create_container(&sandbox, &ContainerSpec::shell("main", "true"))
        .expect_err("forged allocation refused");
    let msg = err.message();
    assert!(msg.contains(DEVICE_ALLOCATED), "{msg}");
    assert!(msg.contains("default/forged"), "{msg}");
    assert!(
        msg.contains("the pod's containers request no gpu, but 1 gpus are allocated"),
        "{msg}"
    );
    assert!(
        node.ledger().pods.is_empty(),
        "a refused pod claims nothing"
    );

    // The scheduler's pod: requests one GPU, gets exactly that one.
    let legit = PodSpec::new("legit").annotation(DEVICE_ALLOCATED, &alloc);
    api.put_pod(pod(
        "default",
        "legit",
        &legit.uid,
        NODE,
        &[("nvidia.com/gpu", "1")],
    ));
    let sandbox = cri.run_pod(&legit).expect("RunPodSandbox");
    let run = cri
        .run_container(
            &sandbox,
            &ContainerSpec::shell("main", "ls /dev; echo VIS=$NVIDIA_VISIBLE_DEVICES"),
        )
        .expect("legit pod starts");
    assert!(run.log.contains("nvidia2"), "{}", run.log);
    assert!(
        run.log.contains(&format!("VIS={}", gpu.uuid)),
        "{}",
        run.log
    );
    assert_eq!(node.ledger().pods.len(), 1);
    // Its second container gets the same decision: counted, and logged as its own.
    cri.run_container(&sandbox, &ContainerSpec::shell("side", "true"))
        .expect("legit pod's second container starts");

    // A pod the API server does not know: refused once the wait is over.
    let ghost = PodSpec::new("ghost").annotation(DEVICE_ALLOCATED, &alloc);
    let sandbox = cri.run_pod(&ghost).expect("RunPodSandbox");
    let err = cri
        .create_container(&sandbox, &ContainerSpec::shell("main", "true"))
        .expect_err("unknown pod refused");
    let msg = err.message();
    assert!(msg.contains(DEVICE_ALLOCATED), "{msg}");
    assert!(
        msg.contains("is not among this node's pods on the api server after 400 ms"),
        "{msg}"
    );

    // A static pod (kubelet marks its source): the scheduler placed nothing on it.
    let static_pod = PodSpec::new("static")
        .annotation("kubernetes.io/config.source", "file")
        .annotation(DEVICE_ALLOCATED, &alloc);
    let sandbox = cri.run_pod(&static_pod).expect("RunPodSandbox");
    let err = cri
        .create_container(&sandbox, &ContainerSpec::shell("main", "true"))
        .expect_err("static pod refused");
    let msg = err.message();
    assert!(
        msg.contains("pod default/static is a static pod (kubernetes.io/config.source: file)"),
        "{msg}"
    );

    // The decisions, as a separate `devgate status` process shows them. The
    // plugin writes its counters in the background: wait until they are there.
    let expected =
        "GRANTS granted 2 unchecked 0 unverified 0 refused 3 (mismatch 1, static_pod 1, unknown_pod 1)";
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = node.status(&[]);
        if text.contains(expected) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(text.contains(expected), "{text}");
    assert!(text.contains("last refusal: default/static"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&node.status(&["-o", "json"])).expect("status json");
    let grants = &json["grants"];
    assert_eq!(grants["granted"], 2, "{json}");
    assert_eq!(grants["refused"], 3, "{json}");
    assert_eq!(grants["refused_by_reason"]["static_pod"], 1, "{json}");

    // Each container's decision is one audit line in the plugin's log, with
    // its pod, container, devices and reason. A granted decision's line is
    // logged by the counters' writer, before the write that counts it, with
    // its time.
    let log = node.plugin.output();
    let audit: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("devgate::audit"))
        .collect();
    assert_eq!(audit.len(), 5, "{log}");
    let lines = |pod: &str, container: &str| -> Vec<String> {
        audit
            .iter()
            .filter(|l| {
                l.contains(&format!("pod=default/{pod} "))
                    && l.contains(&format!("container={container} "))
            })
            .map(|l| l.to_string())
            .collect()
    };
    let line = |pod: &str| {
        let found = lines(pod, "main");
        assert_eq!(found.len(), 1, "one line for {pod}: {audit:#?}");
        found[0].clone()
    };
    for container in ["main", "side"] {
        let found = lines("legit", container);
        assert_eq!(found.len(), 1, "one line for {container}: {audit:#?}");
        for field in [
            "device grant",
            &format!("uid={}", legit.uid),
            "devices=",
            "outcome=\"granted\"",
            "reason=",
            "decided=20",
        ] {
            assert!(found[0].contains(field), "{field} in {}", found[0]);
        }
    }
    let refused = line("static");
    for field in [
        "device grant refused",
        "WARN",
        "container=main",
        "rule=\"static_pod\"",
        "is a static pod",
    ] {
        assert!(refused.contains(field), "{field} in {refused}");
    }
    assert!(line("forged").contains("rule=\"mismatch\""));
    assert!(line("ghost").contains("rule=\"unknown_pod\""));
    // Pods without the annotation never consult the API server: no decision,
    // no audit line.
    let plain = cri.run_pod(&PodSpec::new("plain")).expect("RunPodSandbox");
    cri.run_container(&plain, &ContainerSpec::shell("main", "true"))
        .expect("plain pod starts");
    let log = node.plugin.output();
    assert_eq!(
        log.lines().filter(|l| l.contains("devgate::audit")).count(),
        5,
        "{log}"
    );
    assert!(!log.contains("pod=default/plain"), "{log}");
    assert!(node.status(&[]).contains(expected));
}
