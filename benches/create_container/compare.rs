//! `DEVGATE_BENCH_COMPARE`: this build's plugin side by side with others, in
//! rounds of short sets, each set in a plugin process of its own.

use std::time::Duration;

use crate::pods::Pods;
use crate::proc::ms_each;
use crate::set::{run_set, Cpu, Watched};
use crate::support::node::Node;
use crate::support::{self, Cri, SLOW};
use crate::{cpu_in_all, pages};

/// `sets` rounds, each a set of this build and one of every build in `others`,
/// in an order reversed every other round (ABBA for two builds), printing the
/// plugin CPU of each set and of each build over all.
pub fn compare(
    node: &mut Node,
    cri: &Cri,
    pods: &Pods<'_>,
    n: usize,
    sets: usize,
    others: &[std::path::PathBuf],
) {
    let builds: Vec<std::path::PathBuf> = std::iter::once(support::DEVGATE.into())
        .chain(others.iter().cloned())
        .collect();
    let mut cpus: Vec<Cpu> = builds.iter().map(|_| Cpu::new()).collect();
    for set in 0..sets {
        let mut order: Vec<usize> = (0..builds.len()).collect();
        if set % 2 == 1 {
            order.reverse();
        }
        let mut line = format!("round {set}:");
        for i in order {
            let before = cpus[i].create_ns;
            run_build(
                node,
                cri,
                pods,
                n,
                &format!("b{i}s{set}-"),
                &builds[i],
                &mut cpus[i],
            );
            line += &format!(" [{i}] {:.3}", ms_each(cpus[i].create_ns - before, n));
        }
        println!("{line} ms per CreateContainer");
    }
    for (i, (build, cpu)) in builds.iter().zip(&cpus).enumerate() {
        println!(
            "[{i}] {}: {:.4} ms per CreateContainer, {:.4} ms with its RemoveContainer ({} creations){}",
            build.display(),
            ms_each(cpu.create_ns, n * sets),
            ms_each(cpu.total_ns, n * sets),
            n * sets,
            cpu_in_all(pods, cpu, n * sets),
        );
        if let Some(pages) = cpu.pages.as_ref().and_then(pages::Touched::report) {
            println!("[{i}] pages touched per CreateContainer: {pages}");
        }
    }
}

/// One set with `program` as the plugin, in a process of its own, measured
/// into `cpu`.
fn run_build(
    node: &mut Node,
    cri: &Cri,
    pods: &Pods<'_>,
    n: usize,
    tag: &str,
    program: &std::path::Path,
    cpu: &mut Cpu,
) {
    // Stopped as the DaemonSet stops it, so that it folds its journal into the
    // document for a build that may read the journal's lines differently.
    node.plugin
        .signal_and_wait(nix::sys::signal::Signal::SIGTERM, SLOW);
    // containerd notices the closed connection on its next write; give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    node.plugin.set_program(program.to_path_buf());
    node.plugin.respawn(&node.ctrd);
    node.plugin.wait_registered(&node.ctrd, SLOW);
    let pid = node.plugin.pid().expect("plugin pid");
    run_set(
        cri,
        pods,
        n,
        tag,
        &mut Vec::new(),
        Some(Watched {
            pid,
            cpu,
            after_each: Vec::new(),
        }),
        None,
    );
}
