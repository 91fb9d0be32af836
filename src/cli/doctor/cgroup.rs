//! The cgroup check: the host's cgroup version and containerd's driver, and
//! whether GPU grants survive `systemctl daemon-reload`.

use super::containerd::{cri_runtime, ContainerdConfig};
use super::host::Roots;
use super::Check;
use crate::inventory::Inventory;

pub const CGROUP_CHECK: &str = "cgroup";

/// The host's cgroup version, or the check saying there is none.
pub fn cgroup_version(roots: &Roots) -> Result<&'static str, Check> {
    let fs = roots.host_root.join("sys/fs/cgroup");
    if fs.join("cgroup.controllers").exists() {
        Ok("v2")
    } else if fs.join("unified").is_dir() {
        Ok("v1 (hybrid)")
    } else if fs.join("devices").is_dir() {
        Ok("v1")
    } else {
        Err(Check::warn(
            CGROUP_CHECK,
            "no cgroup filesystem under /sys/fs/cgroup",
            "mount cgroup2 on /sys/fs/cgroup",
        ))
    }
}

pub fn cgroup(roots: &Roots, containerd: &ContainerdConfig, inventory: &Inventory) -> Check {
    const NAME: &str = CGROUP_CHECK;
    let version = match cgroup_version(roots) {
        Ok(version) => version,
        Err(check) => return check,
    };
    let (runtime, systemd) = cri_runtime(containerd);
    let driver = if systemd { "systemd" } else { "cgroupfs" };
    let found = format!("cgroup {version}, runtime {runtime}, {driver} driver");
    // With the systemd driver, `systemctl daemon-reload` re-applies each scope's
    // DeviceAllow= from what runc told systemd, i.e. from the OCI spec: device
    // access that a runtime hook granted by writing the cgroup directly (env-only
    // GPU requests through nvidia-container-runtime) is lost then. devgate puts
    // every device in linux.devices, and links /dev/char/M:m for nodes without a
    // sysfs device (runc registers no rule with systemd without one: see
    // `devchar`), so its grants survive a reload; a node without one vanishes.
    let unseen: Vec<String> = if systemd {
        crate::devchar::nvidia_nodes(inventory)
            .iter()
            .filter(|d| !crate::devchar::systemd_sees(&roots.host_root, d))
            .map(|d| d.path.clone())
            .collect()
    } else {
        Vec::new()
    };
    if !unseen.is_empty() {
        return Check::warn(
            NAME,
            format!("{found}: no /dev/char/<major>:<minor> leads to {}: runc registers no systemd rule for them, and systemctl daemon-reload takes them from running containers", unseen.join(", ")),
            "the plugin links them when it starts and as it grants them: check that it runs and can write /dev/char (the DaemonSet mounts it), or run nvidia-ctk system create-dev-char-symlinks --create-all",
        );
    }
    if systemd && runtime.contains("nvidia") {
        return Check::warn(
            NAME,
            format!("{found}: GPUs granted only through NVIDIA_VISIBLE_DEVICES vanish from a container's cgroup at the next systemctl daemon-reload"),
            "let devgate grant the devices (they are in the OCI spec) or use CDI; kubelet's cgroupDriver must be systemd too",
        );
    }
    Check::pass(
        NAME,
        format!("{found}; through NRI, devgate's device rules are in the OCI spec, with a /dev/char link for each granted node that has no sysfs device, and survive systemctl daemon-reload (hooks-only mode writes the cgroup itself, which a reload under the systemd driver undoes)"),
    )
}
