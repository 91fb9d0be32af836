//! The state directory (read-only, a file), the node prep listing, and the GPU
//! device nodes the running plugin can or cannot see.
use super::*;

/// A state directory devgate cannot write to (read-only mount) fails.
#[test]
fn state_dir_on_a_read_only_mount_fails() {
    let node = healthy();
    let dir = node.roots.state_dir.to_str().unwrap().to_string();
    let mount = |args: &[&str]| {
        let ok = std::process::Command::new("mount")
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount {args:?} (tests run as root)");
    };
    mount(&["-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", &dir]);
    let checks = run_checks(&node.roots, &node.host);
    let _ = std::process::Command::new("umount").arg(&dir).status();
    let c = check(&checks, "state dirs");
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(c.detail.contains("is not writable: "), "{c:?}");
    assert!(c.detail.contains("Read-only file system"), "{c:?}");
}

#[test]
fn state_dir_that_is_a_file_fails() {
    let node = healthy();
    std::fs::remove_dir_all(&node.roots.state_dir).unwrap();
    std::fs::write(&node.roots.state_dir, "").unwrap();
    let checks = run_checks(&node.roots, &node.host);
    let c = check(&checks, "state dirs");
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(c.detail.contains("not a directory"), "{c:?}");
}

#[test]
fn node_prep_lists_vfs_and_rdma_mode() {
    let config = crate::config::Config::parse(
        "[rdma]\nnetns_mode = \"exclusive\"\n[sriov.num_vfs]\n\"0000:19:00.0\" = 8\n\"0000:1d:00.0\" = 0\n",
        "t",
    )
    .unwrap();
    assert_eq!(
        super::super::node_prep(&config),
        "sriov_numvfs 0000:19:00.0 8\nsriov_numvfs 0000:1d:00.0 0\nrdma_netns_mode exclusive\n"
    );
}

/// NVML in the plugin opens `/dev/nvidia*` as the plugin sees them: one whose
/// `/dev` is its container's own misses the nodes a driver made after it
/// started, and the check names the first.
#[test]
fn nvidia_nodes_the_running_plugin_cannot_see_fail() {
    let mut node = healthy();
    let host_dev = node.roots.host_root.join("dev");
    let plugin_dev = node.roots.proc_dir.join("4242/root/dev");
    std::fs::create_dir_all(&plugin_dev).unwrap();
    let seen: Vec<(PathBuf, (u32, u32))> = node
        .host
        .devs
        .iter()
        .filter_map(|(path, dev)| Some((plugin_dev.join(path.strip_prefix(&host_dev).ok()?), *dev)))
        .collect();
    node.host.devs.extend(seen);
    let checks = run_checks(&node.roots, &node.host);
    let c = check(&checks, "nvidia devices");
    assert_eq!(c.status, Status::Pass, "{c:?}");
    assert_eq!(
        c.detail,
        "/proc/driver/nvidia, 10 device nodes, as the plugin (pid 4242) sees them too"
    );
    // nvidia-uvm is CUDA's, not NVML's: the plugin need not see it.
    node.host.devs.remove(&plugin_dev.join("nvidia-uvm"));
    let checks = run_checks(&node.roots, &node.host);
    assert_eq!(check(&checks, "nvidia devices").status, Status::Pass);

    let minor = node.fixture.gpus[3].minor;
    node.host
        .devs
        .remove(&plugin_dev.join(format!("nvidia{minor}")));
    let checks = run_checks(&node.roots, &node.host);
    let c = check(&checks, "nvidia devices");
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert_eq!(
        c.detail,
        format!("the running plugin (pid 4242) does not see the host's /dev/nvidia{minor} (1 of 9 nodes): its /dev is not the host's, so NVML cannot open them")
    );
    assert!(
        c.fix
            .as_deref()
            .is_some_and(|f| f.contains("install/kubernetes/daemonset.yaml")),
        "{c:?}"
    );
}

/// An HGX A100 binds six NVSwitches (class 0x0680) to the nvidia driver
/// beside its GPUs, with no `/proc/driver/nvidia/gpus` entry: not GPUs the
/// inventory misses.
#[test]
fn nvswitches_bound_to_the_nvidia_driver_are_not_counted_as_gpus() {
    let node = healthy();
    let root = &node.roots.host_root;
    for i in 0..6 {
        let bdf = format!("0000:15:0{i}.0");
        write(
            &root.join(format!("sys/devices/pci0000:15/{bdf}/class")),
            "0x068000\n",
        );
        std::os::unix::fs::symlink(
            format!("../../../../devices/pci0000:15/{bdf}"),
            root.join("sys/bus/pci/drivers/nvidia").join(&bdf),
        )
        .unwrap();
    }
    let checks = run_checks(&node.roots, &node.host);
    let c = check(&checks, "nvidia devices");
    assert_eq!(c.status, Status::Pass, "{c:?}");
}

/// A plugin that may not follow other processes' descriptors (no
/// CAP_SYS_PTRACE, or a confining profile) would count GPUs they hold as
/// free at teardown: warned, with the fix.
#[test]
fn a_plugin_that_cannot_follow_other_processes_descriptors_warns() {
    let node = healthy();
    let pid_dir = node.roots.proc_dir.join("4242");
    let c = run_check(&node, "gpu process scan");
    assert_eq!(c.status, Status::Pass, "{c:?}");
    assert_eq!(
        c.detail,
        "devgate nri (pid 4242) has CAP_SYS_PTRACE and runs unconfined"
    );

    // CAP_SYS_PTRACE (bit 19) dropped.
    write(&pid_dir.join("status"), "CapEff:\t000001fffff7ffff\n");
    let c = run_check(&node, "gpu process scan");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.detail.contains("lacks CAP_SYS_PTRACE"), "{c:?}");
    assert!(c.fix.as_deref().unwrap().contains("CapabilityBoundingSet"));

    write(&pid_dir.join("status"), "CapEff:\t000001ffffffffff\n");
    write(
        &pid_dir.join("attr/current"),
        "cri-containerd.apparmor.d (enforce)\n",
    );
    let c = run_check(&node, "gpu process scan");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(
        c.detail
            .contains("confined by \"cri-containerd.apparmor.d (enforce)\""),
        "{c:?}"
    );

    std::fs::remove_file(pid_dir.join("status")).unwrap();
    let c = run_check(&node, "gpu process scan");
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(c.detail.contains("no CapEff"), "{c:?}");
}
