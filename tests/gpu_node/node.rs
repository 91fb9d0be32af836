//! The real node's side of the GPU checks: nvidia-smi's view, the processes
//! holding a GPU's device node, and a pod cgroup as kubelet's cgroupfs driver
//! names it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One GPU as `nvidia-smi --query-gpu` reports it.
#[derive(Debug, Clone)]
pub struct SmiGpu {
    pub index: u32,
    pub uuid: String,
    /// Lower-case, four-digit domain (nvidia-smi prints eight).
    pub bus_id: String,
    pub memory_mib: u64,
    pub compute_mode: String,
}

fn smi(args: &[&str]) -> String {
    let out = Command::new("nvidia-smi")
        .args(args)
        .output()
        .expect("run nvidia-smi: these checks need an NVIDIA GPU node with its driver");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "nvidia-smi {args:?}: {text}");
    text
}

/// The node's GPUs; fails where there are none.
pub fn gpus() -> Vec<SmiGpu> {
    let query = "--query-gpu=index,uuid,pci.bus_id,memory.total,compute_mode";
    let text = smi(&[query, "--format=csv,noheader,nounits"]);
    let gpus: Vec<SmiGpu> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            assert_eq!(f.len(), 5, "nvidia-smi line {line:?}");
            let bus = f[2].to_lowercase();
            SmiGpu {
                index: f[0].parse().unwrap(),
                uuid: f[1].to_string(),
                bus_id: bus[bus.len() - 12..].to_string(),
                memory_mib: f[3].parse().unwrap(),
                compute_mode: f[4].to_string(),
            }
        })
        .collect();
    assert!(!gpus.is_empty(), "nvidia-smi lists no gpu");
    gpus
}

pub fn compute_mode(uuid: &str) -> String {
    let text = smi(&[
        "-i",
        uuid,
        "--query-gpu=compute_mode",
        "--format=csv,noheader",
    ]);
    text.trim().to_string()
}

pub fn set_compute_mode(uuid: &str, mode: &str) {
    smi(&["-i", uuid, "-c", mode]);
}

/// Puts the GPU's compute mode back to what it was when dropped, whatever
/// the test did to it.
pub struct ComputeModeGuard {
    uuid: String,
    /// As `nvidia-smi -c` takes it (`DEFAULT`, `EXCLUSIVE_PROCESS`, `PROHIBITED`).
    mode: String,
}

impl ComputeModeGuard {
    pub fn new(uuid: &str) -> ComputeModeGuard {
        ComputeModeGuard {
            uuid: uuid.to_string(),
            mode: compute_mode(uuid).to_uppercase(),
        }
    }
}

impl Drop for ComputeModeGuard {
    fn drop(&mut self) {
        let restored = Command::new("nvidia-smi")
            .args(["-i", &self.uuid, "-c", &self.mode])
            .output()
            .is_ok_and(|o| o.status.success());
        if !restored {
            eprintln!(
                "compute mode of {} not restored to {}",
                self.uuid, self.mode
            );
        }
    }
}

/// Pids with an open file on the char device `rdev`, as GPU teardown's own
/// scan of /proc lists them.
pub fn holders(rdev: u64) -> Vec<u32> {
    use devgate::gpu::{Host, ProcHost};
    let host = ProcHost::new(Path::new("/proc"));
    let mut open = Vec::new();
    let pids = host.pids().expect("list /proc");
    pids.into_iter()
        .filter(|&pid| {
            open.clear();
            host.open_char_devices(pid, None, &mut open).is_ok() && open.contains(&rdev)
        })
        .collect()
}

/// Polls `f` every 100 ms for up to `limit`.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

/// A container cgroup of pod `uid` as kubelet's cgroupfs driver makes it
/// (`kubepods/besteffort/pod<uid>/<container>`), in the unified hierarchy or,
/// on a v1 host, the pids one. Removed, with the levels it made, when dropped.
/// A running kubelet with that driver may remove a pod cgroup it does not
/// know: run these tests on a node kubelet does not manage, or a drained one.
pub struct PodCgroup {
    made: Vec<PathBuf>,
    pub leaf: PathBuf,
}

impl PodCgroup {
    pub fn new(uid: &str) -> PodCgroup {
        let base = Path::new("/sys/fs/cgroup");
        let root = if base.join("cgroup.controllers").exists() {
            base.to_path_buf()
        } else {
            ["pids", "memory", "cpu", "systemd"]
                .iter()
                .map(|c| base.join(c))
                .find(|p| p.join("cgroup.procs").exists())
                .expect("a cgroup hierarchy to place the pod in")
        };
        // Built first, so that a level made before a failure is removed too.
        let mut cgroup = PodCgroup {
            made: Vec::new(),
            leaf: root,
        };
        let pod = format!("pod{uid}");
        for part in ["kubepods", "besteffort", &pod, "ctr-gpu-node"] {
            cgroup.leaf = cgroup.leaf.join(part);
            if !cgroup.leaf.exists() {
                std::fs::create_dir(&cgroup.leaf).unwrap();
                cgroup.made.push(cgroup.leaf.clone());
            }
        }
        cgroup
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for dir in self.made.iter().rev() {
            // The last task may still be leaving just after it was reaped.
            let removed = (0..10).any(|_| {
                let done = std::fs::remove_dir(dir).is_ok();
                if !done {
                    std::thread::sleep(Duration::from_millis(10));
                }
                done
            });
            if !removed {
                eprintln!("cgroup {} left", dir.display());
            }
        }
    }
}
