//! Whether a pod's other containers still run, at its network owner's
//! poststop. The VFs sit in the pod's network namespace, which every
//! container of the pod shares: the owner's poststop giving them back would
//! take `net1` (and, in exclusive mode, the RDMA device) from a sidecar or a
//! second app container that runs on, until a container is next created in
//! the pod, which may be never. So the VFs stay while any process other than
//! the sandbox's own (the pause process, in the sandbox's cgroup) is in the
//! namespace; the pod's release at StopPodSandbox restores them then, as it
//! does for a poststop that never ran. In a pod whose other containers have
//! all exited, poststop restores as before.
//!
//! Only the pod itself is affected either way: its devices stay claimed until
//! its release, so a pod process that lingers in the namespace, or one
//! placed in a cgroup named after the sandbox, changes only when its own VFs
//! go home.

use std::path::Path;

use crate::netdev::NetnsId;

/// Most processes looked at; more than any node runs.
const MAX_PROCS: usize = 1 << 20;

/// A process other than the sandbox's own in the namespace `netns`, found in
/// `proc_root`: its pid, or `None` when there is none.
pub(crate) fn running_beside(proc_root: &Path, netns: NetnsId, sandbox_id: &str) -> Option<u32> {
    let want = format!("net:[{}]", netns.ino);
    let entries = std::fs::read_dir(proc_root).ok()?;
    entries.flatten().take(MAX_PROCS).find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let link = std::fs::read_link(entry.path().join("ns/net")).ok()?;
        if link.as_os_str() != want.as_str() {
            return None;
        }
        // A process gone meanwhile, or one whose cgroup cannot be read, is
        // not counted: the restore then goes ahead, as it always did.
        let sandboxes = super::membership::own_cgroups(proc_root, pid, sandbox_id).ok()?;
        sandboxes.is_empty().then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SANDBOX: &str = "5a3c0ffee0ddf00d5a3c0ffee0ddf00d5a3c0ffee0ddf00d5a3c0ffee0ddf00d";
    const NETNS: NetnsId = NetnsId {
        dev: 4,
        ino: 4026532300,
    };

    /// A process in `proc` with its netns link and cgroup file.
    fn process(proc: &Path, pid: u32, ino: u64, cgroup: &str) {
        let dir = proc.join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::os::unix::fs::symlink(format!("net:[{ino}]"), dir.join("ns/net")).unwrap();
        std::fs::write(dir.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
    }

    /// A process: pid, netns inode, cgroup path.
    type Proc = (u32, u64, String);

    #[test]
    fn only_processes_outside_the_sandbox_keep_the_network() {
        let cases: &[(&str, &[Proc], Option<u32>)] = &[
            ("empty namespace", &[], None),
            (
                "the pause process alone (cgroupfs)",
                &[(10, NETNS.ino, format!("/k8s.io/{SANDBOX}"))],
                None,
            ),
            (
                "the pause process alone (systemd)",
                &[(
                    10,
                    NETNS.ino,
                    format!("/kubepods.slice/kubepods-pod1.slice/cri-containerd-{SANDBOX}.scope"),
                )],
                None,
            ),
            (
                "a sidecar runs on",
                &[
                    (10, NETNS.ino, format!("/k8s.io/{SANDBOX}")),
                    (
                        11,
                        NETNS.ino,
                        "/k8s.io/0123456789abcdef0123456789abcdef".to_string(),
                    ),
                ],
                Some(11),
            ),
            (
                "another pod's process",
                &[
                    (10, NETNS.ino, format!("/k8s.io/{SANDBOX}")),
                    (
                        12,
                        NETNS.ino + 1,
                        "/k8s.io/0123456789abcdef0123456789abcdef".to_string(),
                    ),
                ],
                None,
            ),
        ];
        for (what, procs, want) in cases {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("self")).unwrap();
            for (pid, ino, cgroup) in procs.iter() {
                process(dir.path(), *pid, *ino, cgroup);
            }
            assert_eq!(running_beside(dir.path(), NETNS, SANDBOX), *want, "{what}");
        }
    }

    /// A process whose cgroup cannot be read (it exited between the two
    /// reads) does not keep the VFs.
    #[test]
    fn a_process_gone_between_the_reads_is_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        process(dir.path(), 11, NETNS.ino, "/k8s.io/0123456789abcdef");
        std::fs::remove_file(dir.path().join("11/cgroup")).unwrap();
        assert_eq!(running_beside(dir.path(), NETNS, SANDBOX), None);
    }
}
