//! CreateContainer through CRI against a real containerd (1.7.24, or 2.1.9 with
//! `DEVGATE_TEST_RUNTIME=containerd-2.1`; the report names it), with devgate
//! connected versus no plugin connected, for a pod with 4 GPUs + 4 VFs on the
//! simulated HGX host root. Sets alternate (with, without, without, with, ...)
//! so that machine drift cancels; each creation is timed from the CRI call to its
//! reply, and the container is removed untimed.
//!
//! Also reports the plugin's CPU time (schedstat, nanoseconds) per creation alone
//! and per creation with its removal, and its RSS idle and after all creations.
//! Next to it, two floors, each the CPU time of a process pinged right after each
//! creation, so in the same state of caches and CPUs: one only receives a message
//! of a CreateContainer request's size and answers it; the other also makes the
//! one crash-safe ledger write a claim needs (flock, temporary file, write,
//! rename of a 3 KiB document on tmpfs, made as the ledger makes it: without
//! the fsyncs, which do nothing there). A third process like the first is
//! pinged in the sets without the plugin, untimed, right before each
//! CreateContainer: the floor where the runtime would wake the plugin. The
//! report gives the plugin's CPU and the first floor set by set too, so that a
//! set's figure reads against the machine's state in the same minutes.
//!
//! `cargo bench --bench create_container` (root). `DEVGATE_BENCH_CREATES=N`
//! sets the creations per set (default 500; smoke runs without `--bench` use 10),
//! `DEVGATE_BENCH_SETS=N` the number of set pairs (default 8, and 2 for
//! smoke runs and for `DEVGATE_BENCH_NEW_PODS`). With
//! `DEVGATE_BENCH_PLAIN=1` the pod has no allocation: the plugin's cost for a
//! container it gives nothing (receiving and answering the runtime's messages).
//! With `DEVGATE_BENCH_NEW_PODS=1` every creation is the first container of a
//! pod of its own: the pod is run before (its RunPodSandbox makes the pod's
//! claim) and stopped and removed after, untimed, and the next creation waits
//! until the plugin has released the pod's devices (default 100 creations per
//! set); the plugin's CPU in each RunPodSandbox is reported beside, and its
//! CPU over each pod's whole life (the five events and the release, from the
//! process's CPU clock).
//! Otherwise each creation is its pod's network owner (the hook moves the VFs
//! in), since the container before it was removed; with `DEVGATE_BENCH_OWNER=1`
//! a container created before the sets stays the owner, and each creation is a
//! further container of the pod, as a sidecar or a restarted container is.
//!
//! `DEVGATE_BENCH_KUBELET=1` gives each pod the labels and annotations kubelet
//! passes for a Deployment's pod that Koordinator scheduled (see
//! `kubelet_metadata`), which every request about the pod carries, and its
//! pod cgroup as the sandbox's parent (`/kubepods/besteffort/pod<uid>`, the
//! cgroupfs driver's), so that containers' cgroups lie beneath the pod's;
//! and each container the variables kubelet gives every container
//! (`kubelet_env`). Without it, containerd places each container's cgroup
//! beside the sandbox's (`/k8s.io/<id>`).
//!
//! `DEVGATE_BENCH_PAGES=1` also counts the pages of the plugin's memory each
//! creation touches, by kind (`create_container/pages.rs`); it flushes the
//! plugin's TLB before each creation, so its CPU figures are not comparable.
//!
//! `DEVGATE_BENCH_THREADS=1` also splits the plugin's CPU in the creations by
//! thread (`create_container/threads.rs`): work off the request path that
//! lands inside a creation's window shows under its own thread's name, with
//! how often each thread was put on a CPU and how often it slept.
//!
//! `DEVGATE_BENCH_STANDING=N` runs N more pods before the sets and keeps them
//! until the end, each with one container and an equal share of one of the
//! four GPUs the benchmark's pod leaves (a whole GPU for N up to 4; at most
//! 400 pods, 1 % each); the first twelve also hold a VF. They stand for a
//! node's other GPU pods, whose claims and records every ledger transaction
//! then carries.
//!
//! `DEVGATE_BENCH_PAUSE_MS=N` waits N ms before each creation (and its pod),
//! untimed: the plugin's background work then runs between them, as on a node
//! that starts a pod now and then, instead of within the next one's window.
//!
//! `DEVGATE_BENCH_COMPARE=PATH[:PATH...]` compares the plugin's CPU time with
//! other builds', each `PATH` a `devgate`: sets rotate among the builds (ABBA
//! for two) instead of alternating between the plugin and none, each set in a
//! process of its own, so that many short sets put the builds side by side in
//! the same state of the machine, whose drift swamps small differences between
//! separate runs.
#[path = "create_container/compare.rs"]
mod compare;
#[path = "create_container/floor.rs"]
mod floor;
#[path = "create_container/pages.rs"]
mod pages;
#[path = "create_container/pods.rs"]
mod pods;
#[path = "create_container/proc.rs"]
mod proc;
#[path = "create_container/report.rs"]
mod report;
#[path = "create_container/set.rs"]
mod set;
#[path = "create_container/standing.rs"]
mod standing;
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "create_container/threads.rs"]
mod threads;

use std::time::Duration;

use compare::compare;
use floor::{serve_echo, Floors, ECHO_ENV};
use pods::{kubelet_metadata, wait_released, Pods};
use proc::{ms_each, rss_kib};
use report::{cpu_in_all, print_overhead, print_set_cpu};
use set::{run_set, without_plugin, Cpu, Watched};
use standing::Standing;
use support::node::{allocation, gpu_entry, vf_entry, Node, DEVICE_ALLOCATED};
use support::{require_root, ContainerSpec, PodSpec};

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `DEVGATE_BENCH_KUBELET`: pods and containers as kubelet passes them.
fn kubelet() -> bool {
    std::env::var_os("DEVGATE_BENCH_KUBELET").is_some()
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

fn main() {
    if let Some(mode) = std::env::var_os(ECHO_ENV) {
        serve_echo(&mode.to_string_lossy());
    }
    require_root();
    let full = std::env::args().any(|a| a == "--bench");
    let fresh = std::env::var_os("DEVGATE_BENCH_NEW_PODS").is_some();
    let owner = !fresh && std::env::var_os("DEVGATE_BENCH_OWNER").is_some();
    let n = env_usize(
        "DEVGATE_BENCH_CREATES",
        match (full, fresh) {
            (false, _) => 10,
            (true, false) => 500,
            (true, true) => 100,
        },
    );
    // Eight pairs in a full run of the default modes: this VM's medians move
    // by half within minutes, and on 6 December runs of two pairs of 500 read
    // the median overhead anywhere from -0.03 to +1.49 ms within half an hour;
    // the report gives the pairs' standard error (0.12 to 0.59 ms over eight).
    let sets = env_usize("DEVGATE_BENCH_SETS", if full && !fresh { 8 } else { 2 });
    // Dropped after the node, even on a panic.
    let _sweep = pods::CgroupSweep;
    let mut node = Node::start(&[]);
    let cri = node.cri();
    let spec = PodSpec::new("bench");
    let plain = std::env::var_os("DEVGATE_BENCH_PLAIN").is_some();
    let spec = if plain {
        spec
    } else {
        spec.annotation(DEVICE_ALLOCATED, &pod_allocation(&node))
    };
    let spec = if kubelet() {
        kubelet_metadata(spec)
    } else {
        spec
    };
    // Idle: registered, synchronized (its start-up pages dropped; the moment
    // after registration is left to it), and before any pod, since a pod's
    // sandbox start already makes its claim.
    std::thread::sleep(Duration::from_millis(200));
    let pid = node.plugin.pid().expect("plugin pid");
    let idle_rss = rss_kib(pid);
    let pod = cri.run_pod(&spec).expect("RunPodSandbox");
    // Warm-up: first creations pull the image into the snapshotter.
    let mut warm = Vec::new();
    run_set(&cri, &Pods::Shared(&pod), 5, "warm", &mut warm, None, None);
    let pods = if fresh {
        // The shared pod would hold the devices every fresh pod claims.
        pods::remove(&cri, &pod);
        wait_released(&node.state_dir(), &pod);
        Pods::Fresh(&spec, node.state_dir())
    } else {
        Pods::Shared(&pod)
    };
    // Created, never started: it holds the pod's network from here on.
    let owner_id = owner.then(|| {
        cri.create_container(&pod, &ContainerSpec::shell("owner", "true"))
            .expect("the owner's CreateContainer")
    });
    let standing = Standing::run(&node, &cri, env_usize("DEVGATE_BENCH_STANDING", 0));

    if let Some(other) = std::env::var_os("DEVGATE_BENCH_COMPARE") {
        let others: Vec<_> = std::env::split_paths(&other).collect();
        compare(&mut node, &cri, &pods, n, sets, &others);
        standing.remove(&cri);
        if !fresh {
            pods::remove(&cri, &pod);
            wait_released(&node.state_dir(), &pod);
        }
        return;
    }
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut cpu = Cpu::new();
    let mut floors = Floors::start();
    // The plugin's CPU per creation in each set with it, in the order they ran.
    let mut set_cpu = Vec::new();
    let mut set_floor = Vec::new();
    for set in 0..sets {
        let tag = format!("w{set}-");
        // ABBA: odd pairs run without the plugin first, so that drift within a
        // pair (the machine warming or slowing) cancels too, not only drift
        // between pairs.
        let mut without_set = |node: &mut Node, floors: &mut Floors| {
            without_plugin(
                node,
                &cri,
                &pods,
                n,
                set,
                &mut without,
                &mut floors.at_request,
            )
        };
        if set % 2 == 1 {
            without_set(&mut node, &mut floors);
        }
        let pid = node.plugin.pid().expect("plugin pid");
        let floor_start = floors.echo.mark();
        let after_each = vec![&mut floors.echo, &mut floors.committer];
        let set_start = cpu.create_ns;
        let watched = Watched {
            pid,
            cpu: &mut cpu,
            after_each,
        };
        run_set(&cri, &pods, n, &tag, &mut with, Some(watched), None);
        set_cpu.push(ms_each(cpu.create_ns - set_start, n));
        set_floor.push(floors.echo.since(floor_start));
        if set % 2 == 0 {
            without_set(&mut node, &mut floors);
        }
    }
    // The last respawned process ran no set: measure RSS of a process that did.
    let pid = node.plugin.pid().expect("plugin pid");
    run_set(&cri, &pods, 2 * n, "rss", &mut Vec::new(), None, None);
    let after_rss = rss_kib(pid);
    if let Some(id) = owner_id {
        cri.remove_container(&id)
            .expect("the owner's RemoveContainer");
    }
    let standing_pods = standing.len();
    standing.remove(&cri);
    if !fresh {
        pods::remove(&cri, &pod);
        wait_released(&node.state_dir(), &pod);
    }

    let creations = n * sets;
    let what = match (plain, fresh, owner) {
        (true, _, _) => "pod without an allocation",
        (false, false, false) => "pod with 4 GPUs + 4 VFs, each creation its pod's network owner",
        (false, false, true) => {
            "pod with 4 GPUs + 4 VFs, each creation a further container beside its network owner"
        }
        (false, true, _) => {
            "pods with 4 GPUs + 4 VFs, each creation the first container of its pod"
        }
    };
    let beside = match standing_pods {
        0 => String::new(),
        k => format!(", beside {k} standing pods with devices"),
    };
    println!(
        "CreateContainer through CRI on {}, {what}{beside} ({sets} alternating set pairs of {n})",
        node.ctrd.runtime()
    );
    print_overhead(with, without, n);
    let per = |ns: u64| ms_each(ns, creations);
    println!(
        "plugin cpu: {:.3} ms per CreateContainer, {:.3} ms with its RemoveContainer ({creations} creations){}",
        per(cpu.create_ns),
        per(cpu.total_ns),
        cpu_in_all(&pods, &cpu, creations),
    );
    print_set_cpu(&set_cpu, &set_floor);
    floors.print();
    if let Some(pages) = cpu.pages.as_ref().and_then(pages::Touched::report) {
        println!("plugin pages touched per CreateContainer: {pages}");
    }
    if let Some(threads) = &cpu.threads {
        threads.report();
    }
    println!(
        "plugin rss: {:.1} MiB idle, {:.1} MiB after {} creations",
        idle_rss as f64 / 1024.0,
        after_rss as f64 / 1024.0,
        2 * n
    );
}
