//! One set of creations, and what it measures of the plugin: CPU time around
//! each CRI call and, when asked, the pages and threads of each creation.

use std::time::{Duration, Instant};

use crate::env_usize;
use crate::floor::Echo;
use crate::pods::{kubelet_env, Pods};
use crate::proc::{cpu_ns, process_cpu_ns, wait_releases_ended};
use crate::support::node::Node;
use crate::support::{ContainerSpec, Cri, SLOW};
use crate::{kubelet, pages, threads};

/// Plugin CPU over a set: creation calls alone, and creation plus removal;
/// with a pod per creation, also its RunPodSandbox calls (the pod's claim).
#[derive(Default)]
pub struct Cpu {
    pub create_ns: u64,
    pub total_ns: u64,
    pub sandbox_ns: u64,
    /// The process's CPU, every thread, from before each creation's pod is
    /// got until its release ended: with a pod per creation its five events
    /// and the release; with one pod, the creation, the removal and what they
    /// left for later.
    pub in_all_ns: u64,
    /// Each RunPodSandbox call's wall time, with a pod per creation.
    pub sandbox_wall: Vec<Duration>,
    /// The pages each creation touched, with `DEVGATE_BENCH_PAGES=1`.
    pub pages: Option<pages::Touched>,
    /// Each thread's share of the creations, with `DEVGATE_BENCH_THREADS=1`.
    pub threads: Option<threads::Threads>,
}

impl Cpu {
    pub fn new() -> Cpu {
        let pages = std::env::var_os("DEVGATE_BENCH_PAGES").map(|_| pages::Touched::default());
        Cpu {
            pages,
            threads: threads::Threads::from_env(),
            ..Cpu::default()
        }
    }
}

/// The plugin process a set measures, where its figures add up, and the
/// floor processes pinged after each creation (both, or none in the sets of
/// a build compared).
pub struct Watched<'a> {
    pub pid: u32,
    pub cpu: &'a mut Cpu,
    pub after_each: Vec<&'a mut Echo>,
}

impl Watched<'_> {
    /// Runs `create` between the readings that bound its window: the CPU
    /// clock always, the pages and threads when asked for. Returns what
    /// `create` returned and the CPU clock's reading before it.
    fn window<T>(&mut self, create: impl FnOnce() -> T) -> (T, u64) {
        let pid = self.pid;
        if self.cpu.pages.is_some() {
            pages::Touched::clear(pid);
        }
        let threads = self
            .cpu
            .threads
            .as_ref()
            .map(|_| threads::Threads::begin(pid));
        let before = cpu_ns(pid);
        let made = create();
        self.cpu.create_ns += cpu_ns(pid) - before;
        if let (Some(t), Some(window)) = (self.cpu.threads.as_mut(), threads) {
            t.end(pid, window);
        }
        if let Some(pages) = self.cpu.pages.as_mut() {
            pages.count(pid);
        }
        self.after_each.iter_mut().for_each(|f| f.ping());
        (made, before)
    }
}

/// Creates and removes `n` containers, timing each creation; with `plugin`, also
/// adds that process's CPU time to its `cpu` (the removal's RemoveContainer event
/// is answered before the CRI call returns, so each window holds its own work
/// only). `at_request`, given in the sets without the plugin, is pinged untimed
/// right before each CreateContainer: the floor in the state the plugin is
/// woken in.
pub fn run_set(
    cri: &Cri,
    pods: &Pods<'_>,
    n: usize,
    tag: &str,
    out: &mut Vec<Duration>,
    mut plugin: Option<Watched<'_>>,
    mut at_request: Option<&mut Echo>,
) {
    let pause = Duration::from_millis(env_usize("DEVGATE_BENCH_PAUSE_MS", 0) as u64);
    for i in 0..n {
        // Untimed: pods as far apart as a node starts them, not back to back.
        std::thread::sleep(pause);
        let whole = plugin.as_ref().map_or(0, |w| process_cpu_ns(w.pid));
        let started = plugin.as_ref().map_or(0, |w| cpu_ns(w.pid));
        let run = Instant::now();
        let pod = pods.get(cri, tag, i);
        let run = run.elapsed();
        let spec = ContainerSpec::shell(&format!("{tag}{i}"), "true");
        let spec = if kubelet() { kubelet_env(spec) } else { spec };
        if let Some(echo) = at_request.as_mut() {
            echo.ping();
        }
        let mut create = || {
            let start = Instant::now();
            let id = cri.create_container(&pod, &spec).expect("CreateContainer");
            out.push(start.elapsed());
            id
        };
        let (id, before) = match plugin.as_mut() {
            Some(w) => w.window(create),
            None => (create(), 0),
        };
        cri.remove_container(&id).expect("RemoveContainer");
        if let Some(w) = plugin.as_mut() {
            w.cpu.sandbox_ns += before - started;
            w.cpu.sandbox_wall.push(run);
            w.cpu.total_ns += cpu_ns(w.pid) - before;
        }
        pods.done(cri, &pod);
        if let Some(w) = plugin.as_mut() {
            wait_releases_ended(w.pid);
            w.cpu.in_all_ns += process_cpu_ns(w.pid).saturating_sub(whole);
        }
    }
}

/// One set with the plugin stopped; it is running again afterwards.
pub fn without_plugin(
    node: &mut Node,
    cri: &Cri,
    pods: &Pods<'_>,
    n: usize,
    set: usize,
    out: &mut Vec<Duration>,
    at_request: &mut Echo,
) {
    node.plugin.kill();
    // containerd notices the closed connection on its next write; give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    run_set(
        cri,
        pods,
        n,
        &format!("n{set}-"),
        out,
        None,
        Some(at_request),
    );
    node.plugin.respawn(&node.ctrd);
    node.plugin.wait_registered(&node.ctrd, SLOW);
}
