//! The shipped deployment end to end, against a real containerd (1.7.24 and
//! 2.1.9: the suite runs under both): the image `install/image.sh` builds, run
//! as `install/kubernetes/daemonset.yaml` says (its init container, then
//! `devgate nri` with the manifest's command, args, env, security context and
//! volumes, the ConfigMap's config), registers with containerd's NRI; a GPU pod
//! then gets exactly its GPU, and a VF pod its VF through the hook the init
//! container copied onto the host. The agent's `/dev` is the host's: a node
//! made on the host after the agent started shows in it.
//!
//! The one liberty: each hostPath of the manifest is a directory of the test's
//! own (the NRI socket's directory is the private containerd's, `/sys` and
//! `/proc` are the simulated host root's, `/dev` its `dev` holding what the
//! container needs of a host's: `null` and `shm`), and the config's `hook_path` and
//! `hook_state_dir` name those directories, as they name the real ones on a node.
mod support;

#[path = "hook_netns/net.rs"]
mod net;

/// The manifests read as kubelet reads them: the DaemonSet's containers as CRI
/// specs, its hostPaths as the test's directories, the ConfigMap's config.
#[path = "e2e_daemonset/manifest.rs"]
mod manifest;

use std::path::{Path, PathBuf};

use devgate::fixture::HostRootBuilder;
use devgate::ledger::Ledger;
use k8s_cri::v1::NamespaceMode;
use manifest::{container, repo, strs, write_config, yaml, HostPaths};
use net::{link, In, Veth};
use support::node::{allocation, gpu_entry, vf_entry, DEVICE_ALLOCATED, GPU2_NODES};
use support::{require_root, wait_for, ContainerSpec, Containerd, PodSpec, DEVGATE, SLOW};

#[test]
fn daemonset_image_serves_gpu_and_vf_pods_through_containerd() {
    require_root();
    let ctrd = Containerd::launch();
    let fixture = HostRootBuilder::hgx()
        .vf_netdev_prefix("dgds")
        .build(&ctrd.path("host"))
        .expect("host root");
    let image = ctrd.path("devgate-image.tar");
    let bin_dir = Path::new(DEVGATE).parent().expect("binary dir");
    let out = std::process::Command::new(repo().join("install/image.sh"))
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--output")
        .arg(&image)
        .output()
        .expect("run install/image.sh");
    assert!(
        out.status.success(),
        "image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ctrd.import_image(&image);

    let ds = yaml("install/kubernetes/daemonset.yaml");
    let pod_spec = &ds["spec"]["template"]["spec"];
    let volumes = &pod_spec["volumes"];
    let hosts = HostPaths::new(&ctrd, fixture.root());
    // The host's NVML where Debian keeps it, the first the ConfigMap lists.
    devgate::fixture::build_nvml_stand_in(&hosts.get("/usr").join("lib/x86_64-linux-gnu"))
        .expect("nvml stand-in");
    let config_dir = ctrd.path("configmap");
    write_config(&config_dir, &hosts);
    // What every host's /dev has and a container whose /dev is a read-only
    // bind of it needs: the null node (runc compares the stdio descriptors
    // with it) and the shm directory (containerd mounts the sandbox's there).
    let host_dev = hosts.get("/dev");
    mknod_char(&host_dev.join("null"), 1, 3);
    std::fs::create_dir_all(host_dev.join("shm")).expect("host dev shm");
    let host_dev_before = entries(host_dev);
    assert_eq!(pod_spec["hostPID"].as_bool(), Some(true));
    assert_eq!(pod_spec["hostNetwork"].as_bool(), Some(true));
    let cri = ctrd.cri();
    let agent = cri
        .run_pod(
            &PodSpec::new("devgate")
                .namespace("devgate-system")
                .edit(|c| {
                    let linux = c.linux.get_or_insert_with(Default::default);
                    let sc = linux.security_context.get_or_insert_with(Default::default);
                    sc.privileged = true;
                    let ns = sc.namespace_options.get_or_insert_with(Default::default);
                    ns.pid = NamespaceMode::Node as i32;
                }),
        )
        .expect("RunPodSandbox for the DaemonSet pod");
    let init = &pod_spec["initContainers"][0];
    let run = cri
        .run_container(&agent, &container(init, volumes, &hosts, &config_dir))
        .expect("init container");
    assert_eq!(run.exit_code, 0, "init container: {}", run.log);
    let hook = hosts.get("/opt/devgate/bin").join("devgate-hook");
    let help = std::process::Command::new(&hook).arg("--help").output();
    assert!(
        help.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("devgate-hook")),
        "the copied hook does not run on the host"
    );

    let main = &pod_spec["containers"][0];
    let id = cri
        .create_container(&agent, &container(main, volumes, &hosts, &config_dir))
        .expect("CreateContainer devgate");
    cri.start_container(&id).expect("StartContainer devgate");
    wait_for(
        r#"containerd to log plugin "10-devgate" connected"#,
        SLOW,
        || {
            let status = cri.container_status(&id).expect("status");
            assert_ne!(
                status.state,
                k8s_cri::v1::ContainerState::ContainerExited as i32,
                "devgate exited ({}): {}",
                status.exit_code,
                cri.container_log(&id)
            );
            ctrd.log()
                .contains(r#"plugin \"10-devgate\" connected"#)
                .then_some(())
        },
    );

    // The manifest's readiness probe, run in the agent as kubelet runs it.
    let probe = strs(&main["readinessProbe"]["exec"]["command"]);
    let probe: Vec<&str> = probe.iter().map(String::as_str).collect();
    assert!(!probe.is_empty(), "no readiness probe in the manifest");
    let (code, out, err) = cri.exec(&id, &probe).expect("readiness probe");
    assert_eq!(code, 0, "readiness probe: {out}{err}");
    assert!(out.contains("configured by containerd"), "{out}{err}");

    driver_nodes_made_later_show_in_the_agent(&cri, &id, host_dev, &host_dev_before);

    // The GPU health monitor loads the host's NVML through the /usr mount.
    wait_for("devgate to load the host's nvml", SLOW, || {
        let log = cri.container_log(&id);
        (log.contains("nvml loaded")
            && log.contains("/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
        .then_some(())
    });

    gpu_pod_gets_its_gpu(&ctrd, &fixture, &id);
    vf_pod_gets_its_vf_through_the_copied_hook(&ctrd, &fixture, &hosts);
}

/// The agent's /dev is the host's: a node the host makes after the agent
/// started (a driver loaded later) shows in it, as NVML will look for it; and
/// neither runc nor kubelet's termination-log mount put anything into the
/// host's /dev.
fn driver_nodes_made_later_show_in_the_agent(
    cri: &support::Cri,
    agent: &str,
    host_dev: &Path,
    before: &[String],
) {
    assert_eq!(
        entries(host_dev),
        before,
        "the agent's start changed the host's /dev"
    );
    let late = host_dev.join("nvidia-late");
    mknod_char(&late, 195, 7);
    let (code, out, err) = cri
        .exec(agent, &["ls", "-l", "/dev/nvidia-late"])
        .expect("exec ls");
    assert_eq!(
        code, 0,
        "a node made on the host is missing in the agent: {out}{err}"
    );
    assert!(
        out.starts_with('c') && out.contains("195,"),
        "not the host's node: {out}"
    );
    std::fs::remove_file(&late).expect("remove the late node");
}

fn mknod_char(path: &Path, major: u64, minor: u64) {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(major, minor),
    )
    .unwrap_or_else(|e| panic!("mknod {}: {e}", path.display()));
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A GPU pod gets its GPU; `devgate status` in the DaemonSet's container (as
/// `kubectl exec` runs it) shows the pod holding it.
fn gpu_pod_gets_its_gpu(ctrd: &Containerd, fixture: &devgate::fixture::Fixture, agent: &str) {
    let gpu = fixture
        .expected()
        .gpus
        .iter()
        .find(|g| g.minor == 2)
        .expect("gpu 2");
    let cri = ctrd.cri();
    let pod = cri
        .run_pod(&PodSpec::new("gpu").annotation(
            DEVICE_ALLOCATED,
            &allocation(&[gpu_entry(2, &gpu.uuid)], &[]),
        ))
        .expect("RunPodSandbox");
    let script = "for d in /dev/nvidia*; do echo \"node $d $(stat -c '%t:%T' $d)\"; done; \
                  echo \"open: $(cat /dev/nvidia2 2>&1)\"";
    let run = cri
        .run_container(&pod, &ContainerSpec::shell("main", script))
        .expect("gpu container");
    let nodes: Vec<&str> = run.log.lines().filter(|l| l.starts_with("node ")).collect();
    assert_eq!(nodes, GPU2_NODES, "log: {}", run.log);
    assert!(run.log.contains("No such device or address"), "{}", run.log);
    // Made by the agent through the writable /dev/char mount inside its
    // read-only view of the host's /dev.
    let link = std::fs::read_link(fixture.root().join("dev/char/195:2"));
    assert_eq!(link.ok(), Some("../nvidia2".into()), "/dev/char/195:2");
    let (code, out, err) = cri
        .exec(
            agent,
            &[
                "devgate",
                "status",
                "--state-dir",
                "/run/devgate",
                "-o",
                "json",
            ],
        )
        .expect("exec devgate status");
    assert_eq!(code, 0, "devgate status: {out}{err}");
    let status: serde_json::Value = serde_json::from_str(&out).expect("status json");
    let holder = &status["devices"][format!("gpu {}", gpu.uuid)];
    assert!(holder.to_string().contains(&pod.id), "{status:#}");
    cri.delete_pod(&pod, &[]);
}

fn vf_pod_gets_its_vf_through_the_copied_hook(
    ctrd: &Containerd,
    fixture: &devgate::fixture::Fixture,
    hosts: &HostPaths,
) {
    let (pf, vf) = (
        &fixture.expected().rdma[0],
        &fixture.expected().rdma[0].vfs[1],
    );
    let host_name = vf.netdev.clone().expect("fixture vf netdev");
    let stand_in = Veth::new(&host_name, "dgdspeer", "02:00:00:de:0d:01");
    let cri = ctrd.cri();
    let pod = cri
        .run_pod(&PodSpec::new("vf").own_netns().annotation(
            DEVICE_ALLOCATED,
            &allocation(&[], &[vf_entry(0, pf.bus_id, vf.bus_id)]),
        ))
        .expect("RunPodSandbox");
    let id = cri
        .create_container(&pod, &ContainerSpec::shell("main", "sleep 300"))
        .expect("CreateContainer");
    let spec = cri.runtime_spec(&id).expect("runtime spec");
    let hook_path = spec["hooks"]["createRuntime"][0]["path"]
        .as_str()
        .map(PathBuf::from);
    assert_eq!(
        hook_path.as_deref(),
        Some(hosts.get("/opt/devgate/bin").join("devgate-hook").as_path())
    );
    cri.start_container(&id).expect("StartContainer");
    let (code, out, err) = cri
        .exec(&id, &["ip", "-o", "link", "show", "net1"])
        .expect("exec");
    assert_eq!(code, 0, "net1 missing in the pod: {out} {err}");
    assert!(out.contains("02:00:00:de:0d:01"), "{out}");
    assert!(
        link(In::Host, &host_name).is_none(),
        "the VF is still on the host"
    );

    cri.delete_pod(&pod, &[&id]);
    let back = wait_for("vf back on the host", SLOW, || link(In::Host, &host_name));
    assert_eq!(back.address.as_deref(), Some("02:00:00:de:0d:01"));
    let state_dir = hosts.get("/run/devgate");
    wait_for("claims released", SLOW, || {
        Ledger::read(state_dir).ok()?.pods.is_empty().then_some(())
    });
    drop(stand_in);
}
