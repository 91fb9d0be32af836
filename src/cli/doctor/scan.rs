//! Whether the running plugin sees which processes hold a GPU. Its GPU
//! teardown follows every process's descriptors (`/proc/<pid>/fd`), which
//! takes ptrace read access to each (`proc_fd_access_allowed`,
//! fs/proc/base.c): CAP_SYS_PTRACE for processes of other users, and the
//! leave of a security module confining the plugin (AppArmor's container
//! profiles allow it only between processes of one profile). A process the
//! plugin may not follow counts as holding nothing, so a GPU it holds open
//! would pass the teardown's outside-users check; counting it as a holder
//! instead would quarantine every GPU of a node where the plugin runs
//! confined, so doctor says it here.
use std::path::Path;

use super::host::{read_bounded, Roots};
use super::Check;

const NAME: &str = "gpu process scan";
/// include/uapi/linux/capability.h.
const CAP_SYS_PTRACE: u32 = 19;
const FIX: &str = "run devgate nri as root with CAP_SYS_PTRACE and no security profile that denies ptrace read (the DaemonSet is privileged; a systemd unit must keep CAP_SYS_PTRACE in CapabilityBoundingSet)";

/// The check for the plugin `pid` (none running: nothing to check).
pub fn gpu_scan(roots: &Roots, pid: Option<u32>) -> Check {
    let Some(pid) = pid else {
        return Check::pass(NAME, "no devgate nri runs: nothing to check");
    };
    let dir = roots.proc_dir.join(pid.to_string());
    let who = format!("devgate nri (pid {pid})");
    let Some(caps) = read_bounded(&dir.join("status"))
        .ok()
        .and_then(|s| effective_caps(&s))
    else {
        return Check::warn(
            NAME,
            format!("{who}: no CapEff in {}", dir.join("status").display()),
            FIX,
        );
    };
    if caps & (1 << CAP_SYS_PTRACE) == 0 {
        return Check::warn(
            NAME,
            format!("{who} lacks CAP_SYS_PTRACE: the GPU teardown cannot follow the descriptors of other users' processes and counts them as holding no GPU"),
            FIX,
        );
    }
    match confinement(&dir) {
        Some(label) => Check::warn(
            NAME,
            format!("{who} is confined by {label:?}: a profile that denies ptrace read hides the GPUs other processes hold from the GPU teardown"),
            FIX,
        ),
        None => Check::pass(NAME, format!("{who} has CAP_SYS_PTRACE and runs unconfined")),
    }
}

/// `CapEff` of proc(5) `/proc/<pid>/status`: 64 bits in hex.
fn effective_caps(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// The security label confining the process, if one does: the LSM's
/// `attr/current`, read as unconfined where absent or empty; for AppArmor
/// (`profile (mode)`), `unconfined` or a profile in complain or unconfined
/// mode; for SELinux (`user:role:type:level`), an unconfined type or the
/// super-privileged container type `spc_t`. Only the type confines: a user
/// `unconfined_u` with the type `container_t` is confined.
fn confinement(dir: &Path) -> Option<String> {
    let label = read_bounded(&dir.join("attr/current")).ok()?;
    let label = label.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    let free = match label.rsplit_once(" (") {
        Some((_, mode)) => matches!(mode, "complain)" | "unconfined)"),
        None => match label.split(':').nth(2) {
            Some(kind) => kind == "spc_t" || kind.starts_with("unconfined_"),
            None => label.is_empty() || label == "unconfined",
        },
    };
    (!free).then(|| label.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_capabilities_are_read_from_status() {
        let status = "Name:\tdevgate\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(status), Some(0x1ff_ffff_ffff));
        assert_eq!(effective_caps("CapEff:\tzz\n"), None);
        assert_eq!(effective_caps("Name:\tx\n"), None);
    }

    #[test]
    fn labels_that_confine_and_labels_that_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let label = |text: &str| {
            std::fs::create_dir_all(dir.path().join("attr")).unwrap();
            std::fs::write(dir.path().join("attr/current"), text).unwrap();
            confinement(dir.path())
        };
        for free in [
            "unconfined\n",
            "",
            "cri-containerd.apparmor.d (complain)\n",
            "system_u:system_r:spc_t:s0\0",
            "system_u:system_r:unconfined_service_t:s0",
            "unconfined_u:unconfined_r:unconfined_t:s0-s0:c0.c1023",
            "devgate (unconfined)\n",
        ] {
            assert_eq!(label(free), None, "{free:?}");
        }
        assert_eq!(
            label("cri-containerd.apparmor.d (enforce)\n").as_deref(),
            Some("cri-containerd.apparmor.d (enforce)")
        );
        assert_eq!(
            label("system_u:system_r:container_t:s0:c1,c2").as_deref(),
            Some("system_u:system_r:container_t:s0:c1,c2")
        );
        // The user or a profile's name saying so confines nothing.
        for confined in [
            "unconfined_u:system_r:container_t:s0",
            "unconfined-devgate (enforce)",
            "kernel-unconfined",
        ] {
            assert_eq!(label(confined).as_deref(), Some(confined));
        }
        std::fs::remove_file(dir.path().join("attr/current")).unwrap();
        assert_eq!(confinement(dir.path()), None, "no security module");
    }
}
