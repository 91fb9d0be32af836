//! Each way of breaking the healthy node's state directory, devices, RDMA and
//! SR-IOV setup or systemd view fails or warns the check that owns it.
use super::broken::{each_broken_setup_fails_or_warns_its_check, Case, API};
use super::{write, CONTAINERD_CONFIG};
use crate::cli::doctor::Status;

#[test]
fn each_broken_device_setup_fails_or_warns_its_own_check() {
    let cases: &[Case] = &[
        (
            "state dir is a file",
            |n| {
                std::fs::remove_dir_all(&n.roots.state_dir).unwrap();
                std::fs::create_dir(&n.roots.state_dir).unwrap();
                std::fs::remove_dir(&n.roots.state_dir).unwrap();
            },
            "state dirs",
            Status::Warn,
            "missing",
        ),
        (
            "no devices",
            |n| {
                std::fs::remove_dir_all(n.roots.host_root.join("sys/bus")).unwrap();
                std::fs::remove_dir_all(n.roots.host_root.join("sys/class")).unwrap();
                std::fs::remove_dir_all(n.roots.host_root.join("proc/driver")).unwrap();
            },
            "inventory",
            Status::Fail,
            "no NVIDIA GPU",
        ),
        (
            "gpu node missing",
            |n| {
                let minor = n.fixture.gpus[3].minor;
                n.host
                    .devs
                    .remove(&n.roots.host_root.join(format!("dev/nvidia{minor}")));
            },
            "nvidia devices",
            Status::Fail,
            "is not a char device",
        ),
        (
            "gpu node wrong numbers",
            |n| {
                n.host
                    .devs
                    .insert(n.roots.host_root.join("dev/nvidiactl"), (195, 254));
            },
            "nvidia devices",
            Status::Fail,
            "is 195:254, not 195:255",
        ),
        (
            "no nvidia-uvm",
            |n| {
                n.host
                    .devs
                    .remove(&n.roots.host_root.join("dev/nvidia-uvm"));
            },
            "nvidia devices",
            Status::Warn,
            "nvidia-uvm",
        ),
        (
            "no /proc/driver/nvidia",
            |n| {
                std::fs::rename(
                    n.roots.host_root.join("proc/driver/nvidia"),
                    n.roots.host_root.join("proc/driver/nv"),
                )
                .unwrap();
            },
            "nvidia devices",
            Status::Fail,
            "8 GPUs bound to the nvidia driver, but no /proc/driver/nvidia",
        ),
        (
            "a gpu missing from /proc/driver/nvidia",
            |n| {
                let bdf = n.fixture.gpus[0].bus_id;
                std::fs::remove_dir_all(
                    n.roots
                        .host_root
                        .join(format!("proc/driver/nvidia/gpus/{bdf}")),
                )
                .unwrap();
            },
            "nvidia devices",
            Status::Fail,
            "8 GPUs bound to the nvidia driver, 7 in the inventory",
        ),
        (
            "rdma exclusive in config, shared kernel",
            |n| {
                write(
                    n.roots.config.as_deref().unwrap(),
                    &format!("[rdma]\nnetns_mode = \"exclusive\"\n{API}"),
                )
            },
            "rdma netns mode",
            Status::Fail,
            "kernel is shared, config rdma.netns_mode is exclusive",
        ),
        (
            "rdma exclusive without modprobe file",
            |n| {
                write(
                    n.roots.config.as_deref().unwrap(),
                    &format!("[rdma]\nnetns_mode = \"exclusive\"\n{API}"),
                );
                kernel_exclusive(n);
            },
            "rdma netns mode",
            Status::Warn,
            "after a reboot",
        ),
        (
            "rdma exclusive kernel, shared in config",
            kernel_exclusive,
            "rdma netns mode",
            Status::Warn,
            "devgate follows the kernel",
        ),
        (
            "vf count differs",
            |n| {
                write(
                    n.roots.config.as_deref().unwrap(),
                    &format!("[sriov.num_vfs]\n\"0000:19:00.0\" = 8\n{API}"),
                )
            },
            "vfs",
            Status::Fail,
            "has 4 VFs, config wants 8",
        ),
        (
            "vf count kept by no udev rule",
            |n| {
                write(
                    &n.roots.etc_root.join("udev/rules.d/70-devgate-sriov.rules"),
                    "# ACTION==\"add|bind\", SUBSYSTEM==\"pci\", KERNEL==\"0000:19:00.0\", ATTR{sriov_numvfs}=\"4\"\n",
                )
            },
            "vfs",
            Status::Warn,
            "no /etc/udev/rules.d rule gives 0000:19:00.0 its VFs again after a reboot",
        ),
        (
            "vf pf absent",
            |n| {
                write(
                    n.roots.config.as_deref().unwrap(),
                    &format!("[sriov.num_vfs]\n\"0000:77:00.0\" = 8\n{API}"),
                )
            },
            "vfs",
            Status::Fail,
            "0000:77:00.0",
        ),
        (
            "env-only gpus under systemd",
            |n| {
                write(&n.roots.containerd_config, &CONTAINERD_CONFIG.replace("runc.options]", "nvidia.options]").replace("version = 2\n", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"nvidia\"\n"))
            },
            "cgroup",
            Status::Warn,
            "daemon-reload",
        ),
        (
            "no /dev/char links under systemd",
            |n| std::fs::remove_dir_all(n.roots.host_root.join("dev/char")).unwrap(),
            "cgroup",
            Status::Warn,
            "no /dev/char/<major>:<minor> leads to /dev/nvidia",
        ),
        (
            "no /dev/char links, systemd set in the main file, a 2.x drop-in beside it",
            |n| {
                // containerd 2.x merges the drop-in's table into the main
                // file's, so runc keeps the systemd driver.
                n.host.version = Ok("containerd x v2.1.9 y".into());
                write(
                    &n.roots.containerd_config,
                    "version = 3\nimports = [\"conf.d/*.toml\"]\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n",
                );
                write(
                    &n.roots.etc_root.join("containerd/conf.d/10-cdi.toml"),
                    "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  enable_cdi = true\n",
                );
                std::fs::remove_dir_all(n.roots.host_root.join("dev/char")).unwrap();
            },
            "cgroup",
            Status::Warn,
            "no /dev/char/<major>:<minor> leads to /dev/nvidia",
        ),
        (
            "no cgroup fs",
            |n| {
                std::fs::remove_file(n.roots.host_root.join("sys/fs/cgroup/cgroup.controllers"))
                    .unwrap()
            },
            "cgroup",
            Status::Warn,
            "no cgroup filesystem",
        ),
    ];
    each_broken_setup_fails_or_warns_its_check(cases);
}

/// ib_core loaded in exclusive RDMA netns mode.
fn kernel_exclusive(n: &mut super::Node) {
    write(
        &n.roots.host_root.join(crate::inventory::NETNS_MODE_PARAM),
        "N\n",
    );
}
