//! `/dev/char/<major>:<minor>` links for the devices devgate grants.
//!
//! Under the systemd cgroup driver, runc also hands a container's device
//! rules to systemd, as `DeviceAllow=/dev/char/M:m`, and leaves out each rule
//! whose path exists neither there nor as `/sys/dev/char/M:m` (runc,
//! libcontainer/cgroups/devices/systemd.go: "skipping device ... for
//! systemd"). The NVIDIA driver registers its nodes with no sysfs device, so
//! udev makes no such link for them: systemd's copy of the rules lacks the
//! GPUs, and the next `systemctl daemon-reload`, which re-applies that copy,
//! takes them from the running container ("Failed to initialize NVML:
//! Unknown Error", NVIDIA/nvidia-container-toolkit#48). A link made before
//! runc runs puts them in systemd's copy, as `nvidia-ctk system
//! create-dev-char-symlinks` does. Devices with a sysfs entry (RDMA's
//! uverbs, rdma_cm) need none.

use std::collections::HashSet;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use crate::inventory::Inventory;
use crate::plan::DeviceNode;

#[derive(Debug, thiserror::Error)]
#[error("make {link} -> {target}: {source}")]
pub struct DevCharError {
    pub link: PathBuf,
    pub target: String,
    #[source]
    pub source: io::Error,
}

/// The links under one host root's `dev/char`, each made (or found) once per
/// process; one that could not be made is tried again at the next pod, and
/// reported the first time only.
pub struct DevCharLinks {
    dev: PathBuf,
    sys_dev_char: PathBuf,
    state: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    done: HashSet<(u32, u32)>,
    reported: HashSet<(u32, u32)>,
}

/// The NVIDIA nodes devgate can grant on this node: each GPU's, `nvidiactl`,
/// `nvidia-uvm` and `nvidia-uvm-tools` (those whose major is known). Linked
/// when the plugin starts and reads the host again, before any pod, as
/// `nvidia-ctk system create-dev-char-symlinks --create-all` does.
pub fn nvidia_nodes(inv: &Inventory) -> Vec<DeviceNode> {
    use crate::plan::{gpu_node, CTL_NODE, UVM_NODES};
    // The mode is the plan's to choose; a link does not carry one.
    let node = |path: &str, major, minor| DeviceNode::char(path, major, minor, 0o666);
    let mut out = Vec::new();
    if let Some(nvidia) = inv.nvidia_majors.nvidia {
        out.extend(
            inv.gpus
                .iter()
                .map(|g| node(&gpu_node(g.minor), nvidia, g.minor)),
        );
        out.push(node(CTL_NODE.0, nvidia, CTL_NODE.1));
    }
    if let Some(uvm) = inv.nvidia_majors.nvidia_uvm {
        out.extend(
            UVM_NODES
                .iter()
                .map(|(path, minor)| node(path, uvm, *minor)),
        );
    }
    out
}

/// `<dev>/char/M:m`.
pub fn link_path(dev: &Path, major: u32, minor: u32) -> PathBuf {
    dev.join("char").join(format!("{major}:{minor}"))
}

/// Whether runc finds `node` for systemd (it stats `<dev>/char/M:m`, then
/// `<sys>/dev/char/M:m`), or will once the node exists: devgate's own link,
/// `../<node>`, waits for it. Another link that dangles is skipped by runc.
pub fn systemd_sees(host_root: &Path, node: &DeviceNode) -> bool {
    let name = format!("{}:{}", node.major, node.minor);
    let link = host_root.join("dev/char").join(&name);
    let ours = below_dev(&node.path).is_some_and(|rel| {
        std::fs::read_link(&link).is_ok_and(|t| t == Path::new(&format!("../{rel}")))
    });
    link.exists() || ours || host_root.join("sys/dev/char").join(&name).exists()
}

impl DevCharLinks {
    pub fn new(host_root: &Path) -> DevCharLinks {
        DevCharLinks {
            dev: host_root.join("dev"),
            sys_dev_char: host_root.join("sys/dev/char"),
            state: Mutex::default(),
        }
    }

    /// Forgets what was made: the next [`Self::ensure`] looks again (after
    /// the devices changed, a driver reload among them).
    pub fn forget(&self) {
        let mut seen = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *seen = Seen::default();
    }

    /// Makes the missing links for `devices`; returns those it could not
    /// make, each reported once per process (a read-only `/dev` would
    /// otherwise be reported at every pod) and tried again at each call.
    pub fn ensure(&self, devices: &[DeviceNode]) -> Vec<DevCharError> {
        let mut seen = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut failed = Vec::new();
        for d in devices {
            let key = (d.major, d.minor);
            if seen.done.contains(&key) {
                continue;
            }
            match self.ensure_one(d) {
                Ok(()) => {
                    seen.done.insert(key);
                    seen.reported.remove(&key);
                }
                Err(e) if seen.reported.insert(key) => failed.push(e),
                Err(_) => {}
            }
        }
        failed
    }

    fn ensure_one(&self, d: &DeviceNode) -> Result<(), DevCharError> {
        let name = format!("{}:{}", d.major, d.minor);
        // Only where the link may name the node: `../<path below /dev>`.
        let Some(rel) = below_dev(&d.path) else {
            return Ok(());
        };
        // Followed, as runc's stat does.
        if self.sys_dev_char.join(&name).exists() {
            return Ok(());
        }
        let link = link_path(&self.dev, d.major, d.minor);
        let target = format!("../{rel}");
        // Followed, as runc's stat does: a link that leads to a node is kept,
        // whoever made it (udev, nvidia-ctk).
        if link.exists() {
            return Ok(());
        }
        let err = |source| DevCharError {
            link: link.clone(),
            target: target.clone(),
            source,
        };
        if let Ok(now) = std::fs::read_link(&link) {
            // Ours, waiting for its node (a driver not loaded yet).
            if now == Path::new(&target) {
                return Ok(());
            }
            // Dangling elsewhere: runc would skip the rule. Replaced whole,
            // by a rename over it, so it is never missing meanwhile.
            let spare = self
                .dev
                .join("char")
                .join(format!(".{}:{}.devgate", d.major, d.minor));
            let _ = std::fs::remove_file(&spare);
            std::os::unix::fs::symlink(&target, &spare).map_err(err)?;
            if let Err(e) = std::fs::rename(&spare, &link) {
                let _ = std::fs::remove_file(&spare);
                return Err(err(e));
            }
            tracing::info!(link = %link.display(), target, was = %now.display(), "replaced a dangling /dev/char link");
            return Ok(());
        }
        std::fs::create_dir_all(self.dev.join("char")).map_err(err)?;
        match std::os::unix::fs::symlink(&target, &link) {
            Ok(()) => {
                tracing::info!(link = %link.display(), target, "made a /dev/char link");
                Ok(())
            }
            // Made meanwhile by someone else (udev, nvidia-ctk).
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(err(e)),
        }
    }
}

/// `path` below `/dev`, made of plain names only.
fn below_dev(path: &str) -> Option<&str> {
    let rel = path.strip_prefix("/dev/")?;
    let plain = !rel.is_empty()
        && Path::new(rel)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
    plain.then_some(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &str, major: u32, minor: u32) -> DeviceNode {
        DeviceNode::char(path, major, minor, 0o666)
    }

    #[test]
    fn links_are_made_for_nodes_without_a_sysfs_device() {
        let root = tempfile::tempdir().unwrap();
        // uverbs0 has its sysfs device, as the RDMA core registers one.
        let verbs = "sys/devices/virtual/infiniband_verbs/uverbs0";
        std::fs::create_dir_all(root.path().join(verbs)).unwrap();
        std::fs::create_dir_all(root.path().join("sys/dev/char")).unwrap();
        std::os::unix::fs::symlink(
            "../../devices/virtual/infiniband_verbs/uverbs0",
            root.path().join("sys/dev/char/231:0"),
        )
        .unwrap();
        let links = DevCharLinks::new(root.path());
        let devices = [
            node("/dev/nvidia3", 195, 3),
            node("/dev/nvidiactl", 195, 255),
            node("/dev/nvidia-caps/nvidia-cap1", 508, 1),
            node("/dev/infiniband/uverbs0", 231, 0),
        ];
        assert!(links.ensure(&devices).is_empty());
        let dev = root.path().join("dev");
        let read = |m: u32, n: u32| std::fs::read_link(link_path(&dev, m, n)).ok();
        assert_eq!(read(195, 3), Some(PathBuf::from("../nvidia3")));
        assert_eq!(read(195, 255), Some(PathBuf::from("../nvidiactl")));
        assert_eq!(
            read(508, 1),
            Some(PathBuf::from("../nvidia-caps/nvidia-cap1"))
        );
        assert_eq!(read(231, 0), None, "sysfs has it");
        let sees = |d: &DeviceNode| systemd_sees(root.path(), d);
        assert!(sees(&devices[0]), "ours, waiting for its node");
        assert!(sees(&devices[3]), "sysfs has it");
        assert!(
            !sees(&node("/dev/nvidia4", 195, 4)),
            "not granted, not linked"
        );
        let foreign = link_path(&root.path().join("dev"), 195, 6);
        std::os::unix::fs::symlink("/nowhere", foreign).unwrap();
        assert!(
            !sees(&node("/dev/nvidia6", 195, 6)),
            "runc skips a dangling link"
        );
    }

    #[test]
    fn a_link_someone_made_is_kept_while_it_leads_somewhere() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("dev");
        std::fs::create_dir_all(dev.join("char")).unwrap();
        std::fs::write(dev.join("nvidia0"), "").unwrap();
        let theirs = dev.join("nvidia0");
        std::os::unix::fs::symlink(&theirs, link_path(&dev, 195, 0)).unwrap();
        std::os::unix::fs::symlink("/nowhere/nvidia1", link_path(&dev, 195, 1)).unwrap();
        let links = DevCharLinks::new(root.path());
        let devices = [node("/dev/nvidia0", 195, 0), node("/dev/nvidia1", 195, 1)];
        assert!(links.ensure(&devices).is_empty());
        let read = |n: u32| std::fs::read_link(link_path(&dev, 195, n)).unwrap();
        assert_eq!(read(0), theirs, "leads to a node: kept");
        assert_eq!(read(1), PathBuf::from("../nvidia1"), "dangled: replaced");
        let names: Vec<_> = std::fs::read_dir(dev.join("char")).unwrap().collect();
        assert_eq!(names.len(), 2, "no spare left behind");
    }

    #[test]
    fn paths_outside_dev_get_no_link() {
        for path in [
            "/tmp/x",
            "/dev/",
            "/dev/../etc/passwd",
            "/dev/a/../../b",
            "dev/x",
        ] {
            assert_eq!(below_dev(path), None, "{path}");
        }
        assert_eq!(below_dev("/dev/nvidia0"), Some("nvidia0"));
    }

    #[test]
    fn a_failure_is_reported_once_and_tried_again() {
        let root = tempfile::tempdir().unwrap();
        // `dev` is a file: no `dev/char` can be made.
        std::fs::write(root.path().join("dev"), "").unwrap();
        let links = DevCharLinks::new(root.path());
        let devices = [node("/dev/nvidia0", 195, 0)];
        let failed = links.ensure(&devices);
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].to_string().contains("char/195:0 -> ../nvidia0"),
            "{}",
            failed[0]
        );
        assert!(links.ensure(&devices).is_empty(), "reported once");
        // Once `dev` can hold it, the next pod's call makes it.
        std::fs::remove_file(root.path().join("dev")).unwrap();
        assert!(links.ensure(&devices).is_empty());
        let link = link_path(&root.path().join("dev"), 195, 0);
        assert_eq!(
            std::fs::read_link(link).unwrap(),
            PathBuf::from("../nvidia0")
        );
    }
}
