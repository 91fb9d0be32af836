//! Checks of the node's devices against what devgate and its config expect.

use super::host::{read_bounded, Host, Roots};
use super::Check;
use crate::config::{Config, RdmaNetnsMode};
use crate::inventory::Inventory;

/// The name of the check of the NVIDIA driver and its nodes.
const NVIDIA_CHECK: &str = "nvidia devices";

pub fn inventory(inv: &Inventory) -> Check {
    const NAME: &str = "inventory";
    let vfs: usize = inv.rdma.iter().map(|n| n.vfs.len()).sum();
    let found = format!(
        "{} GPUs, {} RDMA devices, {vfs} VFs",
        inv.gpus.len(),
        inv.rdma.len()
    );
    let warned = inv
        .warnings
        .first()
        .map(|first| format!("{} warnings, first: {first}", inv.warnings.len()));
    // A node devgate serves has devices (the DaemonSet selects such nodes):
    // an empty inventory is a driver not loaded or a sysfs not read, and
    // every allocation sent here would be refused.
    if inv.gpus.is_empty() && inv.rdma.is_empty() {
        let detail = match &warned {
            Some(w) => format!("no NVIDIA GPU and no RDMA device found; {w}"),
            None => "no NVIDIA GPU and no RDMA device found".to_string(),
        };
        return Check::fail(
            NAME,
            detail,
            "load the nvidia and RDMA drivers; devgate refuses every allocation on this node until then",
        );
    }
    if let Some(w) = warned {
        return Check::warn(
            NAME,
            format!("{found}; {w}"),
            "devgate inventory lists every warning; fix the driver or sysfs entry it names",
        );
    }
    Check::pass(NAME, found)
}

/// `plugin`: the running plugin's pid, whose own view of `/dev` is checked too.
pub fn nvidia(roots: &Roots, host: &dyn Host, inv: &Inventory, plugin: Option<u32>) -> Check {
    const NAME: &str = NVIDIA_CHECK;
    // The driver's sysfs links exist as soon as it binds a GPU; discovery also
    // needs /proc/driver/nvidia, so count both.
    let bound = nvidia_bound(&roots.host_root);
    if inv.gpus.is_empty() && bound == 0 {
        return Check::pass(NAME, "no NVIDIA GPUs: nothing to check");
    }
    if !roots.host_root.join("proc/driver/nvidia").is_dir() {
        return Check::fail(
            NAME,
            format!("{bound} GPUs bound to the nvidia driver, but no /proc/driver/nvidia"),
            "load the NVIDIA kernel driver (modprobe nvidia)",
        );
    }
    if bound > inv.gpus.len() {
        return Check::fail(
            NAME,
            format!(
                "{bound} GPUs bound to the nvidia driver, {} in the inventory",
                inv.gpus.len()
            ),
            "devgate inventory names what it could not read in /proc/driver/nvidia/gpus",
        );
    }
    let major = inv.nvidia_majors.nvidia.unwrap_or(195);
    let mut want: Vec<(String, u32, u32)> = inv
        .gpus
        .iter()
        .map(|g| (format!("nvidia{}", g.minor), major, g.minor))
        .collect();
    want.push(("nvidiactl".to_string(), major, crate::plan::CTL_NODE.1));
    let mut problems = Vec::new();
    for (name, major, minor) in &want {
        let path = roots.host_root.join("dev").join(name);
        match host.char_device(&path) {
            Ok(Some(got)) if got == (*major, *minor) => {}
            Ok(Some((a, b))) => {
                problems.push(format!("/dev/{name} is {a}:{b}, not {major}:{minor}"))
            }
            Ok(None) => problems.push(format!("/dev/{name} is not a char device")),
            Err(e) => problems.push(format!("/dev/{name}: {e}")),
        }
    }
    let uvm = roots.host_root.join("dev/nvidia-uvm");
    let uvm_ok = matches!(host.char_device(&uvm), Ok(Some(_)));
    if let Some(first) = problems.first() {
        return Check::fail(
            NAME,
            format!("{first} ({} problems)", problems.len()),
            "run nvidia-smi once or nvidia-modprobe -c <minor> to create the nodes",
        );
    }
    // The nodes NVML opens (nvidia-uvm is CUDA's, and the plugin reads its
    // major from /proc/devices), as the running plugin sees them.
    let view = match plugin.map(|pid| plugin_view(roots, host, pid, &want)) {
        Some(View::Misses(check)) => return check,
        Some(View::Sees(pid)) => format!(", as the plugin (pid {pid}) sees them too"),
        Some(View::Unreadable(pid)) => format!(" (the plugin's view, pid {pid}, not readable)"),
        None => String::new(),
    };
    if !uvm_ok {
        return Check::warn(
            NAME,
            "no /dev/nvidia-uvm: CUDA programs fail to start",
            "nvidia-modprobe -u -c=0 loads nvidia-uvm and creates its nodes",
        );
    }
    Check::pass(
        NAME,
        format!("/proc/driver/nvidia, {} device nodes{view}", want.len() + 1),
    )
}

/// What the running plugin sees of the nodes NVML opens.
enum View {
    Sees(u32),
    /// Its root could not be read: a doctor run without root's rights, a
    /// plugin that exited meanwhile, a fake tree.
    Unreadable(u32),
    Misses(Check),
}

/// The host's nodes as the running plugin sees them (`<proc>/<pid>/root/dev`):
/// NVML opens them by those paths. A plugin in a container whose `/dev` is
/// its own, filled at its creation (a privileged container without the
/// host's `/dev` mounted), misses every node a driver made after it started.
fn plugin_view(roots: &Roots, host: &dyn Host, pid: u32, want: &[(String, u32, u32)]) -> View {
    let root = roots.process_root(pid);
    if !root.is_dir() {
        return View::Unreadable(pid);
    }
    let unseen: Vec<&str> = want
        .iter()
        .filter(|(name, major, minor)| {
            host.char_device(&root.join("dev").join(name))
                .ok()
                .flatten()
                != Some((*major, *minor))
        })
        .map(|(name, ..)| name.as_str())
        .collect();
    let Some(first) = unseen.first() else {
        return View::Sees(pid);
    };
    // A plugin that exited or restarted while its nodes were looked at.
    if !root.is_dir() {
        return View::Unreadable(pid);
    }
    View::Misses(Check::fail(
        NVIDIA_CHECK,
        format!(
            "the running plugin (pid {pid}) does not see the host's /dev/{first} ({} of {} nodes): its /dev is not the host's, so NVML cannot open them",
            unseen.len(),
            want.len()
        ),
        "give the plugin the host's /dev, then restart it: in a container, mount the host's /dev at /dev as install/kubernetes/daemonset.yaml does (a container's own /dev holds only the nodes that existed when it started); under systemd, no PrivateDevices=",
    ))
}

/// GPUs bound to the nvidia driver (`sys/bus/pci/drivers/nvidia/<bdf>`), as
/// the inventory counts them ([`crate::inventory::counts_as_gpu`]): not the
/// NVSwitches, six beside eight GPUs on an HGX A100, with no
/// `/proc/driver/nvidia/gpus` entry.
fn nvidia_bound(host_root: &std::path::Path) -> usize {
    let dir = host_root.join("sys/bus/pci/drivers/nvidia");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<crate::inventory::PciAddr>().is_ok())
        })
        .filter(|e| {
            let class = read_bounded(&e.path().join("class")).ok();
            crate::inventory::counts_as_gpu(class.and_then(|t| crate::inventory::parse_class(&t)))
        })
        .count()
}

fn modprobe_sets_exclusive(roots: &Roots) -> bool {
    let Ok(entries) = std::fs::read_dir(roots.etc_root.join("modprobe.d")) else {
        return false;
    };
    entries.flatten().any(|e| {
        read_bounded(&e.path()).is_ok_and(|t| {
            t.lines().any(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                words.len() >= 3
                    && words[0] == "options"
                    && words[1] == "ib_core"
                    && words[2..].contains(&"netns_mode=0")
            })
        })
    })
}

/// Whether a rule in /etc/udev/rules.d names the PF and writes its count, as
/// the one bootstrap installs does (`KERNEL=="<bdf>"`, `ATTR{sriov_numvfs}="<n>"`).
fn udev_keeps_numvfs(roots: &Roots, pf: &str, count: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(roots.etc_root.join("udev/rules.d")) else {
        return false;
    };
    let kernel = format!("KERNEL==\"{pf}\"");
    let attr = format!("ATTR{{sriov_numvfs}}=\"{count}\"");
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".rules"))
        .any(|e| {
            read_bounded(&e.path()).is_ok_and(|t| {
                t.lines().any(|l| {
                    !l.trim_start().starts_with('#') && l.contains(&kernel) && l.contains(&attr)
                })
            })
        })
}

pub fn rdma_netns(roots: &Roots, config: &Config, inv: &Inventory) -> Check {
    const NAME: &str = "rdma netns mode";
    let want = config.rdma.netns_mode;
    let param = roots.host_root.join(crate::inventory::NETNS_MODE_PARAM);
    let kernel = read_bounded(&param)
        .ok()
        .and_then(|t| crate::inventory::parse_netns_mode(&t));
    match kernel {
        None if inv.rdma.is_empty() => Check::pass(NAME, "no RDMA devices: nothing to check"),
        None => Check::warn(
            NAME,
            format!("ib_core is not loaded (no /{})", crate::inventory::NETNS_MODE_PARAM),
            "load the RDMA drivers",
        ),
        // The hook refuses every VF pod: the kernel moves no RDMA device.
        Some(RdmaNetnsMode::Shared) if want == RdmaNetnsMode::Exclusive => Check::fail(
            NAME,
            "kernel is shared, config rdma.netns_mode is exclusive: pods with VFs are refused",
            "write `options ib_core netns_mode=0` to /etc/modprobe.d (install/bootstrap.sh does) and reboot, or set rdma.netns_mode = \"shared\"",
        ),
        // The plan follows the kernel (`plan::rdma::moves_rdma`): pods work,
        // but the config no longer says how the node is set up.
        Some(RdmaNetnsMode::Exclusive) if want == RdmaNetnsMode::Shared => Check::warn(
            NAME,
            "kernel is exclusive, config rdma.netns_mode is shared: devgate follows the kernel and moves each VF's RDMA device into its pod",
            "set rdma.netns_mode = \"exclusive\", or remove `options ib_core netns_mode=0` from /etc/modprobe.d and reboot",
        ),
        Some(RdmaNetnsMode::Exclusive) if !modprobe_sets_exclusive(roots) => Check::warn(
            NAME,
            "exclusive now, but no /etc/modprobe.d file keeps it after a reboot",
            "write `options ib_core netns_mode=0` to /etc/modprobe.d/devgate-rdma.conf (install/bootstrap.sh does)",
        ),
        Some(k) => Check::pass(NAME, format!("{}, as configured", k.as_str())),
    }
}

pub fn vfs(roots: &Roots, config: &Config) -> Check {
    const NAME: &str = "vfs";
    if config.sriov.num_vfs.is_empty() {
        return Check::pass(NAME, "no [sriov] num_vfs in the config: nothing to check");
    }
    let mut problems = Vec::new();
    for (pf, want) in &config.sriov.num_vfs {
        let file = roots
            .host_root
            .join("sys/bus/pci/devices")
            .join(pf.to_string())
            .join("sriov_numvfs");
        match read_bounded(&file).map(|t| t.trim().parse::<u32>()) {
            Ok(Ok(got)) if got == *want => {}
            Ok(Ok(got)) => problems.push(format!("{pf} has {got} VFs, config wants {want}")),
            Ok(Err(_)) => problems.push(format!("{pf}: sriov_numvfs is not a number")),
            Err(e) => problems.push(format!("{pf}: {e}")),
        }
    }
    if problems.is_empty() {
        let unkept: Vec<String> = config
            .sriov
            .num_vfs
            .iter()
            .filter(|(pf, n)| **n > 0 && !udev_keeps_numvfs(roots, &pf.to_string(), **n))
            .map(|(pf, _)| pf.to_string())
            .collect();
        if !unkept.is_empty() {
            return Check::warn(
                NAME,
                format!(
                    "{} PFs as configured, but no /etc/udev/rules.d rule gives {} its VFs again after a reboot",
                    config.sriov.num_vfs.len(),
                    unkept.join(", ")
                ),
                "install/bootstrap.sh writes /etc/udev/rules.d/70-devgate-sriov.rules; ignore this where another tool sets VF counts at boot",
            );
        }
        return Check::pass(
            NAME,
            format!("{} PFs as configured", config.sriov.num_vfs.len()),
        );
    }
    Check::fail(
        NAME,
        problems.join("; "),
        "install/bootstrap.sh writes sriov_numvfs (0 first: the kernel refuses a change between two non-zero counts); it destroys the PF's VFs, so drain the node first",
    )
}

#[cfg(test)]
mod tests {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    use super::*;
    use crate::cli::doctor::RealHost;

    /// The plugin's view on the real kernel: a process in a mount namespace of
    /// its own whose `/dev` is a tmpfs holding only `null` (a container's own
    /// `/dev`, filled at its creation) is seen through `/proc/<pid>/root` to
    /// miss `/dev/zero`, which the host has; this test's own process sees both.
    #[test]
    fn the_view_through_a_process_root_is_that_process_own() {
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount -t tmpfs tmpfs /dev && mknod -m 666 /dev/null c 1 3 && echo ready && exec sleep 60")
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux; tests run as root)");
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        let roots = Roots {
            host_root: "/".into(),
            etc_root: "/etc".into(),
            proc_dir: "/proc".into(),
            containerd_config: "/etc/containerd/config.toml".into(),
            config: None,
            state_dir: "/run/devgate".into(),
            nri_socket: "/var/run/nri/nri.sock".into(),
        };
        let host = RealHost::new("containerd".into());
        let want = [("null".to_string(), 1, 3), ("zero".to_string(), 1, 5)];
        let own = plugin_view(&roots, &host, std::process::id(), &want);
        let other = plugin_view(&roots, &host, child.id(), &want);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(line.trim(), "ready");
        assert!(matches!(own, View::Sees(_)));
        let View::Misses(check) = other else {
            panic!("the process's own /dev was taken for the host's");
        };
        assert!(
            check
                .detail
                .contains("does not see the host's /dev/zero (1 of 2 nodes)"),
            "{check:?}"
        );
    }
}
