//! The harness itself, without any NRI plugin, under each containerd line the
//! suite runs on (1.7.24 and 2.1.9): pods start, containers run and
//! log, and everything stops and is removed cleanly. When these fail, the NRI
//! tests' failures say nothing about devgate.
mod support;

use support::{require_root, ContainerSpec, Containerd, PodSpec, SLOW};

#[test]
fn host_network_pod_runs_a_container_and_cleans_up() {
    require_root();
    let ctrd = Containerd::launch();
    let cri = ctrd.cri();
    let pod = cri.run_pod(&PodSpec::new("plain")).expect("RunPodSandbox");
    let spec = ContainerSpec::shell(
        "hello",
        "echo hello from busybox; echo to stderr >&2; exit 3",
    );
    let run = cri.run_container(&pod, &spec).expect("run container");
    assert_eq!(run.exit_code, 3);
    assert!(
        run.log.contains("hello from busybox\n"),
        "log: {:?}",
        run.log
    );
    assert!(run.log.contains("to stderr\n"), "log: {:?}", run.log);

    cri.remove_container(&run.id).expect("RemoveContainer");
    assert!(
        cri.container_status(&run.id).is_err(),
        "removed container still has a status"
    );
    cri.stop_pod(&pod).expect("StopPodSandbox");
    cri.remove_pod(&pod).expect("RemovePodSandbox");
    assert!(cri.list_pod_ids().expect("ListPodSandbox").is_empty());
}

#[test]
fn long_running_container_stops_on_request() {
    require_root();
    let ctrd = Containerd::launch();
    let cri = ctrd.cri();
    let pod = cri
        .run_pod(&PodSpec::new("sleeper"))
        .expect("RunPodSandbox");
    let id = cri
        .create_container(
            &pod,
            &ContainerSpec::shell("sleep", "echo started; exec sleep 3600"),
        )
        .expect("CreateContainer");
    cri.start_container(&id).expect("StartContainer");
    support::wait_for("the container to log", SLOW, || {
        cri.container_log(&id).contains("started").then_some(())
    });
    let (code, stdout, _) = cri
        .exec(&id, &["cat", "/proc/1/cmdline"])
        .expect("ExecSync");
    // PID 1 of the container is the exec'd sleep: the exec ran inside it.
    assert_eq!(
        (code, stdout.replace('\0', " ")),
        (0, "sleep 3600 ".to_string())
    );
    cri.stop_container(&id, 0).expect("StopContainer");
    // SIGKILL: 128 + 9.
    assert_eq!(cri.wait_exited(&id, SLOW), 137);
    cri.remove_container(&id).expect("RemoveContainer");
    cri.stop_pod(&pod).expect("StopPodSandbox");
    cri.remove_pod(&pod).expect("RemovePodSandbox");
}

#[test]
fn own_netns_pod_gets_eth0_from_the_test_cni() {
    require_root();
    let ctrd = Containerd::launch();
    let cri = ctrd.cri();
    let pod = cri
        .run_pod(&PodSpec::new("netns").own_netns())
        .expect("RunPodSandbox");
    let run = cri
        .run_container(&pod, &ContainerSpec::shell("links", "cat /proc/net/dev"))
        .expect("run container");
    assert_eq!(run.exit_code, 0, "log: {}", run.log);
    assert!(
        run.log.contains("eth0:"),
        "no eth0 in the pod netns: {}",
        run.log
    );
    let host_links = std::fs::read_to_string("/proc/net/dev").expect("host /proc/net/dev");
    let host_end = format!("dg{}:", &pod.id[..12]);
    assert!(
        host_links.contains(&host_end),
        "host end {host_end} missing"
    );

    cri.stop_pod(&pod).expect("StopPodSandbox");
    let host_links = std::fs::read_to_string("/proc/net/dev").expect("host /proc/net/dev");
    assert!(
        !host_links.contains(&host_end),
        "CNI DEL left {host_end} behind"
    );
    cri.remove_pod(&pod).expect("RemovePodSandbox");
}
