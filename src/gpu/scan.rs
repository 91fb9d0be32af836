//! Who holds a GPU: one pass over the proc root for every device being released, plus
//! NVML's view of compute and graphics contexts.
//!
//! Device files are matched by number (`st_rdev`), never by name: a container may see
//! `/dev/nvidia3` under any path, and a node may have stale nodes whose names lie.

use std::collections::{BTreeMap, HashMap};

use super::cgroup::PodCgroups;
use super::host::{gone, Host};
use super::nvml::{Nvml, NvmlError};
use super::GpuError;

/// The processes holding each device, from one pass.
#[derive(Debug, Default)]
pub struct Users {
    /// Device number → pids holding it, ascending.
    by_dev: HashMap<u64, Vec<u32>>,
    /// GPUs whose processes NVML failed to list, by UUID: their users are
    /// not all known.
    blind: BTreeMap<String, NvmlError>,
}

impl Users {
    pub fn of(&self, rdev: u64) -> &[u32] {
        self.by_dev.get(&rdev).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Adds a holder found another way (NVML).
    pub fn add(&mut self, rdev: u64, pid: u32) {
        let pids = self.by_dev.entry(rdev).or_default();
        if let Err(at) = pids.binary_search(&pid) {
            pids.insert(at, pid);
        }
    }

    /// No holder of any device, and none NVML could not list.
    pub fn is_idle(&self) -> bool {
        self.blind.is_empty() && self.by_dev.values().all(Vec::is_empty)
    }

    /// Why NVML could not list the processes of `uuid`, if it could not.
    pub fn blind(&self, uuid: &str) -> Option<&NvmlError> {
        self.blind.get(uuid)
    }
}

/// Processes per scanning thread. On a 16-core GPU node 2000 processes cost
/// 64 ms of CPU: 8 threads took 10.9 ms, where 4 threads (one per 400
/// processes, at most 4, before) took 19.5 ms (docs/gpu-node.md). Not
/// measured between 500 and 800 processes, where it now starts 2 or 3
/// threads and 400 started one.
const PIDS_PER_WORKER: usize = 250;
/// At most this many threads, whatever the cores: the pass lasts milliseconds,
/// and on a large node the pods keep the other cores meanwhile.
const MAX_WORKERS: usize = 8;

/// One pass over the proc root: which of `targets` each process holds. `skip` is
/// devgate's own processes, which hold GPUs while NVML is loaded. A large node's processes
/// are split over a few threads: the pass is one open, one getdents and a stat per
/// fd for every process, and runs while the ledger is locked.
pub fn scan(host: &dyn Host, targets: &[u64], skip: &[u32]) -> Result<Users, GpuError> {
    scan_on(host, targets, skip, cores().min(MAX_WORKERS))
}

/// [`scan`] on at most `most_workers` threads.
pub(super) fn scan_on(
    host: &dyn Host,
    targets: &[u64],
    skip: &[u32],
    most_workers: usize,
) -> Result<Users, GpuError> {
    let mut users = Users::default();
    if targets.is_empty() {
        return Ok(users);
    }
    let pids = host
        .pids()
        .map_err(|source| GpuError::ListProcesses { source })?;
    let workers = (pids.len() / PIDS_PER_WORKER).clamp(1, most_workers.max(1));
    let found = if workers == 1 {
        scan_pids(host, &pids, targets, skip)?
    } else {
        std::thread::scope(|s| {
            let chunk = pids.len().div_ceil(workers);
            let mut parts = pids.chunks(chunk);
            let first = parts.next().unwrap_or_default();
            // This thread takes the first part itself: one thread fewer to
            // start; and every part no thread could be started for (a node
            // out of pids), rather than fail the release.
            let mut own = vec![first];
            let mut handles = Vec::new();
            for part in parts {
                let spawned = std::thread::Builder::new()
                    .name("devgate-gpu-scan".into())
                    .spawn_scoped(s, move || scan_pids(host, part, targets, skip));
                match spawned {
                    Ok(h) => handles.push(h),
                    Err(_) => own.push(part),
                }
            }
            let mut found = Vec::new();
            for part in own {
                found.extend(scan_pids(host, part, targets, skip)?);
            }
            for h in handles {
                let part = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
                found.extend(part);
            }
            Ok::<_, GpuError>(found)
        })?
    };
    for (rdev, pid) in found {
        users.add(rdev, pid);
    }
    Ok(users)
}

/// The CPUs this process may use, asked once: std asks the cgroup's CPU quota
/// files and the affinity mask at every call, a dozen syscalls per release.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `(device, pid)` for every target device open in `pids`.
fn scan_pids(
    host: &dyn Host,
    pids: &[u32],
    targets: &[u64],
    skip: &[u32],
) -> Result<Vec<(u64, u32)>, GpuError> {
    let mut found = Vec::new();
    let mut devs = Vec::with_capacity(64);
    for &pid in pids.iter().filter(|p| !skip.contains(p)) {
        devs.clear();
        match host.open_char_devices(pid, Some(targets), &mut devs) {
            Ok(()) => {}
            Err(e) if gone(&e) => continue,
            Err(source) => return Err(GpuError::ProcessUnreadable { pid, source }),
        }
        found.extend(
            devs.iter()
                .filter(|d| targets.contains(d))
                .map(|d| (*d, pid)),
        );
    }
    Ok(found)
}

/// Adds NVML's compute and graphics processes of each GPU to `users`. A GPU
/// whose listing fails otherwise (`GPU_IS_LOST` after an XID 79) is noted
/// as [`Users::blind`]: that GPU stays in doubt, and the pod's other GPUs,
/// whose users are known, go on to be cleaned and handed back.
pub fn add_nvml_users(nvml: &dyn Nvml, gpus: &[(String, u64)], skip: &[u32], users: &mut Users) {
    for (uuid, rdev) in gpus {
        let pids = match nvml.processes(uuid) {
            Ok(pids) => pids,
            // The /proc scan has found every process holding the device node;
            // NVML only adds those it alone sees, and a GPU that cannot list its
            // processes adds none. Failing here would hold the GPU for ever.
            Err(NvmlError::NotSupported { call, .. }) => {
                tracing::debug!(gpu = %uuid, call, "nvml lists no processes here");
                continue;
            }
            Err(e) => {
                tracing::warn!(gpu = %uuid, error = %e, "nvml cannot list the gpu's processes");
                users.blind.insert(uuid.clone(), e);
                continue;
            }
        };
        for pid in pids {
            if !skip.contains(&pid) {
                users.add(*rdev, pid);
            }
        }
    }
}

/// Where each holder belongs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// In the released pod, to be ended: pid → its start time when found so.
    pub pod: BTreeMap<u32, u64>,
    /// Outside it, by device.
    pub outside: BTreeMap<u64, Vec<u32>>,
}

/// Holders of a released GPU that are no users of it.
#[derive(Default)]
pub struct NotUsers {
    /// Node daemons by cgroup (`gpu.ignored_cgroups`: nvidia-persistenced).
    pub cgroups: PodCgroups,
    /// Daemons run as pods (`gpu.ignored_pods`), counted as such only while
    /// they hold every GPU of the node, as anything that loads NVML does: a
    /// process in such a pod holding only some (descriptors passed to it by
    /// a tenant) is a user like any other.
    pub daemon_pods: PodCgroups,
    /// Every GPU of the node.
    pub all_gpus: Vec<u64>,
}

impl NotUsers {
    fn holds_every_gpu(&self, users: &Users, pid: u32) -> bool {
        !self.all_gpus.is_empty()
            && self
                .all_gpus
                .iter()
                .all(|r| users.of(*r).binary_search(&pid).is_ok())
    }
}

/// The live processes in the pod's cgroups, whether or not they hold a GPU
/// (zombies, which run nothing, left out).
pub fn pod_processes(host: &dyn Host, pod: &PodCgroups) -> Result<Vec<u32>, GpuError> {
    Ok(pod_processes_pinned(host, pod)?.into_keys().collect())
}

/// [`pod_processes`], each with its start time, to be ended by.
pub fn pod_processes_pinned(
    host: &dyn Host,
    pod: &PodCgroups,
) -> Result<BTreeMap<u32, u64>, GpuError> {
    if pod.names_nothing() {
        return Ok(BTreeMap::new());
    }
    let pids = host
        .pids()
        .map_err(|source| GpuError::ListProcesses { source })?;
    Ok(pids
        .into_iter()
        .filter(|&pid| host.cgroup(pid).is_ok_and(|c| pod.contains(&c)))
        .filter_map(|pid| match super::kill::start_time(host, pid) {
            Ok(Some(start)) => Some((pid, start)),
            _ => None,
        })
        .collect())
}

/// Sorts the holders of `devs` into the pod's and everyone else's. Processes
/// `not_users` names are neither.
pub fn split(
    host: &dyn Host,
    users: &Users,
    devs: &[u64],
    pod: &PodCgroups,
    not_users: &NotUsers,
) -> Split {
    let mut out = Split::default();
    let mut seen: HashMap<u32, Membership> = HashMap::new();
    for rdev in devs {
        for &pid in users.of(*rdev) {
            let m = *seen
                .entry(pid)
                .or_insert_with(|| membership(host, pid, pod, not_users));
            match m {
                Membership::Pod(start) => {
                    out.pod.insert(pid, start);
                }
                Membership::DaemonPod if not_users.holds_every_gpu(users, pid) => {}
                Membership::DaemonPod => {
                    tracing::warn!(pid, "a process of a pod gpu.ignored_pods names holds some gpus, not all: a user");
                    out.outside.entry(*rdev).or_default().push(pid)
                }
                Membership::Outside => out.outside.entry(*rdev).or_default().push(pid),
                Membership::Ignored | Membership::Gone => {}
            }
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Membership {
    /// The pod's, with the start time that pins it.
    Pod(u64),
    Outside,
    Ignored,
    /// In a pod `gpu.ignored_pods` names.
    DaemonPod,
    Gone,
}

/// Where `pid` belongs. Its start time is read before and after its cgroup:
/// only when both agree is the cgroup that process's, so a pid reused while
/// it was read is never taken for the pod's and later signalled.
fn membership(host: &dyn Host, pid: u32, pod: &PodCgroups, not_users: &NotUsers) -> Membership {
    let start = || super::kill::start_time(host, pid);
    let before = match start() {
        Ok(Some(t)) => t,
        Ok(None) => return Membership::Gone,
        // Unknown identity: not provably the pod's, so it must not be killed.
        Err(_) => return Membership::Outside,
    };
    let cgroup = host.cgroup(pid);
    let devgate = host.runs_this_program(pid);
    match start() {
        Ok(Some(t)) if t == before => {}
        // Gone, or another process now: the holder that was found is gone.
        Ok(_) => return Membership::Gone,
        Err(_) => return Membership::Outside,
    }
    match cgroup {
        // The pod's first: a unit name such as `nvidia-dcgm.service` matches a
        // path component anywhere, and a pod running systemd inside (or
        // naming a cgroup so) would otherwise keep the GPU past its release.
        Ok(text) if pod.contains(&text) => Membership::Pod(before),
        // Another devgate process outside the pod (a hook's teardown or
        // inventory, a `devgate status` in the DaemonSet's pod) holds every
        // GPU while its NVML is loaded, as this one does: no user. Still a
        // holder for a full reset, which needs every GPU idle.
        Ok(_) if devgate => Membership::Ignored,
        Ok(text) if not_users.cgroups.ignores(&text) => Membership::Ignored,
        Ok(text) if not_users.daemon_pods.contains(&text) => Membership::DaemonPod,
        Ok(_) => Membership::Outside,
        Err(e) if gone(&e) => Membership::Gone,
        // Unknown cgroup: not provably the pod's, so it must not be killed.
        Err(_) => Membership::Outside,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::host::{Sent, Signal, Wanted};
    use crate::gpu::kill::{self, KillTimes};
    use crate::gpu::tests::fake_host::{FakeHost, FakeProc};
    use std::io;
    use std::time::Duration;

    /// A host where `pid` exits and its number goes to a host process right
    /// after its cgroup is read.
    struct ReusedWhileRead {
        inner: FakeHost,
        pid: u32,
    }

    impl Host for ReusedWhileRead {
        fn pids(&self) -> io::Result<Vec<u32>> {
            self.inner.pids()
        }
        fn open_char_devices(
            &self,
            pid: u32,
            wanted: Wanted<'_>,
            out: &mut Vec<u64>,
        ) -> io::Result<()> {
            self.inner.open_char_devices(pid, wanted, out)
        }
        fn cgroup(&self, pid: u32) -> io::Result<String> {
            let text = self.inner.cgroup(pid);
            if pid == self.pid {
                let host_process = FakeProc {
                    cgroup: "0::/system.slice/sshd.service\n".into(),
                    start: 999_999,
                    ..FakeProc::default()
                };
                self.inner.add_proc(pid, host_process);
            }
            text
        }
        fn start_time(&self, pid: u32) -> io::Result<Option<u64>> {
            self.inner.start_time(pid)
        }
        fn signal(&self, pid: u32, start: u64, signal: Signal) -> io::Result<Sent> {
            self.inner.signal(pid, start, signal)
        }
        fn sleep(&self, d: Duration) {
            self.inner.sleep(d)
        }
        fn run(&self, argv: &[String], timeout: Duration) -> Result<(), String> {
            self.inner.run(argv, timeout)
        }
    }

    #[test]
    fn a_pid_reused_while_its_cgroup_is_read_is_never_signalled() {
        let gpu = libc::makedev(195, 0);
        let host = ReusedWhileRead {
            inner: FakeHost::default(),
            pid: 10,
        };
        host.inner.add(10, &[gpu], "/kubepods/poduid-a/c1");
        host.inner.add(11, &[gpu], "/kubepods/poduid-a/c1");
        let users = scan(&host, &[gpu], &[1]).unwrap();
        assert_eq!(users.of(gpu), [10, 11]);
        let pod = PodCgroups::from_uid("uid-a");
        let split = split(&host, &users, &[gpu], &pod, &NotUsers::default());
        assert_eq!(split.pod, BTreeMap::from([(11, 110)]));
        let times = KillTimes {
            grace: Duration::from_millis(10),
            kill_wait: Duration::from_millis(10),
        };
        kill::end(&host, &split.pod, times).unwrap();
        assert_eq!(host.inner.signals(), [(11, Signal::Term)]);
        assert!(host.inner.alive(10), "the host process lives");
    }

    #[test]
    fn a_large_node_is_scanned_in_parallel_and_nothing_is_lost() {
        let host = FakeHost::default();
        let (gpu, other) = (libc::makedev(195, 0), libc::makedev(1, 3));
        for pid in 1..=3000 {
            let devs: &[u64] = if pid % 500 == 0 {
                &[other, gpu]
            } else {
                &[other]
            };
            host.add(pid, devs, "/x");
        }
        let users = scan(&host, &[gpu], &[1500]).unwrap();
        assert_eq!(users.of(gpu), [500, 1000, 2000, 2500, 3000]);
        assert!(users.of(other).is_empty());
    }
}
