//! CreateContainer through CRI against a real containerd (1.7.24, or 2.1.9 with
//! `DEVGATE_TEST_RUNTIME=containerd-2.1`; the report names it), with devgate
//! connected versus no plugin connected, for a pod with 4 GPUs + 4 VFs on the
//! simulated HGX host root. Sets alternate (with, without, with, ...) so that
//! machine drift cancels; each creation is timed from the CRI call to its
//! reply, and the container is removed untimed.
//!
//! Also reports the plugin's CPU time per creation (utime+stime from
//! /proc/<pid>/stat) and its RSS idle and after all creations.
//!
//! `cargo bench --bench create_container` (root). `DEVGATE_BENCH_CREATES=N`
//! sets the creations per set (default 500; smoke runs without `--bench` use 10),
//! `DEVGATE_BENCH_SETS=N` the number of set pairs (default 2). With
//! `DEVGATE_BENCH_PLAIN=1` the pod has no allocation: the plugin's cost for a
//! container it gives nothing (receiving and answering the runtime's messages).
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::node::{allocation, gpu_entry, vf_entry, Node, DEVICE_ALLOCATED};
use support::{require_root, ContainerSpec, Cri, Pod, PodSpec, SLOW};

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// 4 whole GPUs and one VF on each of 4 PFs.
fn pod_allocation(node: &Node) -> String {
    let inv = node.fixture.expected();
    let gpus: Vec<String> = inv.gpus[..4]
        .iter()
        .map(|g| gpu_entry(g.minor, &g.uuid))
        .collect();
    let rdma: Vec<String> = inv.rdma[..4]
        .iter()
        .enumerate()
        .map(|(i, nic)| vf_entry(i, nic.bus_id, nic.vfs[0].bus_id))
        .collect();
    allocation(&gpus, &rdma)
}

/// Jiffies of user + system CPU of a process.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12) // utime, stime: fields 14 and 15 of proc(5)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn run_set(cri: &Cri, pod: &Pod, n: usize, tag: &str, out: &mut Vec<Duration>) {
    for i in 0..n {
        let spec = ContainerSpec::shell(&format!("{tag}{i}"), "true");
        let start = Instant::now();
        let id = cri.create_container(pod, &spec).expect("CreateContainer");
        out.push(start.elapsed());
        cri.remove_container(&id).expect("RemoveContainer");
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn report(name: &str, mut v: Vec<Duration>) -> f64 {
    v.sort();
    let median = pct(&v, 0.5);
    println!(
        "{name:<14} n={:<5} median {median:.3} ms  p90 {:.3} ms  p99 {:.3} ms",
        v.len(),
        pct(&v, 0.9),
        pct(&v, 0.99)
    );
    median
}

fn main() {
    require_root();
    let full = std::env::args().any(|a| a == "--bench");
    let n = env_usize("DEVGATE_BENCH_CREATES", if full { 500 } else { 10 });
    let sets = env_usize("DEVGATE_BENCH_SETS", 2);
    let mut node = Node::start(&[]);
    let cri = node.cri();
    let spec = PodSpec::new("bench");
    let plain = std::env::var_os("DEVGATE_BENCH_PLAIN").is_some();
    let spec = if plain {
        spec
    } else {
        spec.annotation(DEVICE_ALLOCATED, &pod_allocation(&node))
    };
    let pod = cri.run_pod(&spec).expect("RunPodSandbox");
    let pid = node.plugin.pid().expect("plugin pid");
    let idle_rss = rss_kib(pid);
    // Warm-up: first creations pull the image into the snapshotter.
    let mut warm = Vec::new();
    run_set(&cri, &pod, 5, "warm", &mut warm);

    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut ticks = 0;
    for set in 0..sets {
        let pid = node.plugin.pid().expect("plugin pid");
        let before = cpu_ticks(pid);
        run_set(&cri, &pod, n, &format!("w{set}-"), &mut with);
        ticks += cpu_ticks(pid) - before;
        node.plugin.kill();
        // containerd notices the closed connection on its next write; give it a moment.
        std::thread::sleep(Duration::from_millis(200));
        run_set(&cri, &pod, n, &format!("n{set}-"), &mut without);
        node.plugin.respawn(&node.ctrd);
        node.plugin.wait_registered(&node.ctrd, SLOW);
    }
    // The last respawned process ran no set: measure RSS of a process that did.
    let pid = node.plugin.pid().expect("plugin pid");
    run_set(&cri, &pod, 2 * n, "rss", &mut Vec::new());
    let after_rss = rss_kib(pid);

    let hz = 100.0; // USER_HZ on Linux x86-64
    let creations = (n * sets) as f64;
    let what = if plain {
        "pod without an allocation"
    } else {
        "pod with 4 GPUs + 4 VFs"
    };
    println!(
        "CreateContainer through CRI on {}, {what} ({sets} alternating set pairs of {n})",
        node.ctrd.runtime()
    );
    let m_with = report("devgate", with);
    let m_without = report("no plugin", without);
    println!("median overhead: {:.3} ms", m_with - m_without);
    println!(
        "plugin cpu: {:.3} ms per CreateContainer ({} ticks over {} creations)",
        ticks as f64 / hz * 1e3 / creations,
        ticks,
        creations
    );
    println!(
        "plugin rss: {:.1} MiB idle, {:.1} MiB after {} creations",
        idle_rss as f64 / 1024.0,
        after_rss as f64 / 1024.0,
        2 * n
    );
}
