//! Whether a pod's other containers still run, at its network owner's
//! poststop. The VFs sit in the pod's network namespace, which every
//! container of the pod shares: the owner's poststop giving them back would
//! take `net1` (and, in exclusive mode, the RDMA device) from a sidecar or a
//! second app container that runs on, until a container is next created in
//! the pod, which may be never. So the VFs stay while a process of another
//! container the ledger records for the pod (the plugin records each one,
//! selected or not) is in the namespace, known by its cgroup, whose path
//! names its container (`/k8s.io/<id>`, `.../pod<uid>/<id>`,
//! `cri-containerd-<id>.scope`, `crio-<id>.scope`); the plugin restores them
//! at the pod's StopPodSandbox, before it answers and so before the runtime
//! removes the namespace (`plugin::vf_teardown`), as its release does for a
//! poststop that never ran. In a pod whose other containers have all exited, poststop restores as
//! before. Hooks-only mode, which records each container's init, asks
//! [`init_beside`] instead (`super::kept_network`).
//!
//! Only the pod itself is affected either way: its devices stay claimed until
//! its release, so whatever its processes do changes only when its own VFs
//! go home.

use std::path::Path;

use crate::ledger::PodRecord;
use crate::netdev::netns::{links_to, pids_in};
use crate::netdev::NetnsId;

/// More than any host mounts (one line per hierarchy).
const MAX_LINES: usize = 64;

/// A process of one of the containers `others` in the namespace `netns`,
/// found in `proc_root`: its pid, or `None` when there is none.
pub(crate) fn running_beside(proc_root: &Path, netns: NetnsId, others: &[&str]) -> Option<u32> {
    if others.is_empty() {
        return None;
    }
    pids_in(proc_root, netns).find_map(|(pid, dir)| {
        // A process gone meanwhile is not counted: the restore then goes
        // ahead, as it always did.
        let text = super::cgroup::read_bounded(&dir.join("cgroup")).ok()?;
        let theirs = text.lines().take(MAX_LINES).any(|line| {
            let path = line.splitn(3, ':').nth(2).unwrap_or("");
            others
                .iter()
                .any(|id| super::membership::own_prefix(path, id).is_some())
        });
        theirs.then_some(pid)
    })
}

/// A container of `pod`, other than those in `except`, whose recorded init
/// still runs (the same pid and start time) in the namespace `netns`: its id
/// and pid.
/// Hooks-only mode records each container's init at its createRuntime, so
/// its containers are known by their inits, whatever their cgroup paths
/// (podman's `libpod-<id>.scope` among them). An init that cannot be read
/// counts as not running: the restore then goes ahead, as it always did.
pub(crate) fn init_beside<'p>(
    proc_root: &Path,
    netns: NetnsId,
    pod: &'p PodRecord,
    except: &[&str],
) -> Option<(&'p str, u32)> {
    let want = netns.to_string();
    pod.containers
        .iter()
        .filter(|(id, _)| !except.contains(&id.as_str()))
        .find_map(|(id, record)| {
            let init = record.init.as_ref()?;
            if !links_to(&proc_root.join(init.pid.to_string()), &want) {
                return None;
            }
            // Read after the link: a pid reused meanwhile has another start.
            let start = super::liveness::start_ticks(proc_root, init.pid).ok()?;
            (start == init.start_ticks).then_some((id.as_str(), init.pid))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SANDBOX: &str = "5a3c0ffee0ddf00d5a3c0ffee0ddf00d5a3c0ffee0ddf00d5a3c0ffee0ddf00d";
    const SIDE: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const NETNS: NetnsId = NetnsId {
        dev: 4,
        ino: 4026532300,
    };

    /// A process: pid, netns inode, cgroup path.
    type Proc = (u32, u64, String);

    /// A process in `proc` with its netns link and cgroup file.
    fn process(proc: &Path, (pid, ino, cgroup): &Proc) {
        let dir = proc.join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::os::unix::fs::symlink(format!("net:[{ino}]"), dir.join("ns/net")).unwrap();
        std::fs::write(dir.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
    }

    #[test]
    fn only_the_pods_other_containers_keep_the_network() {
        let pause = (10, NETNS.ino, format!("/k8s.io/{SANDBOX}"));
        let cases: &[(&str, Vec<Proc>, Option<u32>)] = &[
            ("empty namespace", vec![], None),
            ("the pause process alone", vec![pause.clone()], None),
            (
                "a sidecar runs on (cgroupfs)",
                vec![pause.clone(), (11, NETNS.ino, format!("/k8s.io/{SIDE}"))],
                Some(11),
            ),
            (
                "a sidecar runs on (systemd)",
                vec![(
                    12,
                    NETNS.ino,
                    format!("/kubepods.slice/kubepods-pod1.slice/cri-containerd-{SIDE}.scope"),
                )],
                Some(12),
            ),
            (
                "the sidecar's id in another namespace",
                vec![(13, NETNS.ino + 1, format!("/k8s.io/{SIDE}"))],
                None,
            ),
            (
                "a process of no recorded container",
                vec![(14, NETNS.ino, "/user.slice/user-0.slice".to_string())],
                None,
            ),
        ];
        for (what, procs, want) in cases {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("self")).unwrap();
            procs.iter().for_each(|p| process(dir.path(), p));
            assert_eq!(running_beside(dir.path(), NETNS, &[SIDE]), *want, "{what}");
            assert_eq!(running_beside(dir.path(), NETNS, &[]), None, "{what}");
        }
    }

    /// A process whose cgroup cannot be read (it exited between the two
    /// reads) does not keep the VFs.
    #[test]
    fn a_process_gone_between_the_reads_is_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        process(dir.path(), &(11, NETNS.ino, format!("/k8s.io/{SIDE}")));
        std::fs::remove_file(dir.path().join("11/cgroup")).unwrap();
        assert_eq!(running_beside(dir.path(), NETNS, &[SIDE]), None);
    }

    /// A pod of three recorded containers: "owner" (init 20), "side" (init
    /// 21), whose inits started at tick 500 + pid, and one with no known init.
    fn pod() -> PodRecord {
        let record = |pid: Option<u32>| crate::ledger::ContainerRecord {
            name: String::new(),
            devices: Vec::new(),
            applied_unix: 0,
            init: pid.map(|pid| crate::ledger::InitProcess {
                pid,
                start_ticks: 500 + u64::from(pid),
            }),
            cgroups: Vec::new(),
            resolved: None,
            resolved_sha256: None,
            hooks_only: true,
        };
        PodRecord {
            pod: crate::ledger::PodRef::default(),
            claims: Vec::new(),
            claimed_unix: 0,
            containers: [("owner", Some(20)), ("side", Some(21)), ("unknown", None)]
                .into_iter()
                .map(|(id, pid)| (id.to_string(), record(pid)))
                .collect(),
            network_owner: Some("owner".to_string()),
            admitted: 0,
        }
    }

    /// A process `pid` started at `start`, in the namespace `ino`.
    fn init(proc: &Path, pid: u32, start: u64, ino: u64) {
        process(proc, &(pid, ino, "/libpod_parent/libpod-x".to_string()));
        let stat =
            format!("{pid} (sleep) S 0 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n");
        std::fs::write(proc.join(pid.to_string()).join("stat"), stat).unwrap();
    }

    #[test]
    fn a_recorded_init_running_in_the_namespace_keeps_the_network() {
        /// What, the side container's init if it runs (its start tick and
        /// netns inode), and the container found beside the owner.
        type Case = (
            &'static str,
            Option<(u64, u64)>,
            Option<(&'static str, u32)>,
        );
        let cases: &[Case] = &[
            (
                "its init runs in the namespace",
                Some((521, NETNS.ino)),
                Some(("side", 21)),
            ),
            ("its init exited", None, None),
            (
                "its pid is another process's now",
                Some((999, NETNS.ino)),
                None,
            ),
            (
                "its init is in another namespace",
                Some((521, NETNS.ino + 1)),
                None,
            ),
        ];
        let pod = pod();
        for (what, side, want) in cases {
            let dir = tempfile::tempdir().unwrap();
            // The owner itself still shows in the namespace: never counted.
            init(dir.path(), 20, 520, NETNS.ino);
            if let Some((start, ino)) = side {
                init(dir.path(), 21, *start, *ino);
            }
            assert_eq!(
                init_beside(dir.path(), NETNS, &pod, &["owner"]),
                *want,
                "{what}"
            );
        }
        // Both running: whichever is not left out counts.
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), 20, 520, NETNS.ino);
        init(dir.path(), 21, 521, NETNS.ino);
        let beside = |except: &[&str]| init_beside(dir.path(), NETNS, &pod, except);
        assert_eq!(beside(&["side"]), Some(("owner", 20)));
        assert_eq!(beside(&["owner"]), Some(("side", 21)));
        assert_eq!(beside(&["side", "owner"]), None);
    }
}
