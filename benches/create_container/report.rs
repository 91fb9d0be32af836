//! What a run prints: each set's medians and the overheads between them, and
//! the plugin's CPU over more than a creation's own call.

use std::time::Duration;

use crate::pods::Pods;
use crate::proc::ms_each;
use crate::set::Cpu;

/// The plugin's CPU over more than a creation's own call. With a pod per
/// creation: in RunPodSandbox (where it claims the pod's devices), in the
/// pod's three calls together, and in all. With one pod: per creation in all,
/// every thread, from each creation's start to the end of its removal, so that
/// work a creation leaves for later (an audit line, a journal fold) is counted
/// too.
pub fn cpu_in_all(pods: &Pods<'_>, cpu: &Cpu, creations: usize) -> String {
    let per = |ns: u64| ms_each(ns, creations.max(1));
    if !matches!(pods, Pods::Fresh(..)) {
        return format!(
            "; {:.4} ms per creation in all (every thread, from the process's CPU clock)",
            per(cpu.in_all_ns)
        );
    }
    let mut wall = cpu.sandbox_wall.clone();
    wall.sort();
    format!(
        "; {:.4} ms per RunPodSandbox, {:.4} ms per pod with both; RunPodSandbox median {:.1} ms; \
         {:.3} ms per pod in all (its five events and its release, from the process's CPU clock)",
        per(cpu.sandbox_ns),
        per(cpu.sandbox_ns + cpu.total_ns),
        pct(&wall, 0.5),
        per(cpu.in_all_ns),
    )
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

/// Each pair's medians, the pooled medians and the two overheads.
pub fn print_overhead(with: Vec<Duration>, without: Vec<Duration>, n: usize) {
    // Each set's median, in the order they ran: a set far from its neighbours
    // points at drift, not at the plugin.
    let mut differences = Vec::new();
    for (set, (w, o)) in with.chunks(n).zip(without.chunks(n)).enumerate() {
        let median = |v: &[Duration]| {
            let mut v = v.to_vec();
            v.sort();
            pct(&v, 0.5)
        };
        let (w, o) = (median(w), median(o));
        differences.push(w - o);
        println!("pair {set}: devgate median {w:.3} ms, no plugin {o:.3} ms");
    }
    let m_with = report("devgate", with);
    let m_without = report("no plugin", without);
    println!("median overhead: {:.3} ms", m_with - m_without);
    // A step in the machine's speed between two sets moves the pooled medians
    // above; within a pair the two sets ran next to each other.
    let (mean, se) = mean_and_error(&differences);
    let spread = se.map_or(String::new(), |se| {
        format!(
            " ± {se:.3} (standard error over {} pairs)",
            differences.len()
        )
    });
    println!(
        "pairwise overhead: {mean:.3} ms{spread}, the mean of the pairs' differences of medians"
    );
}

/// The mean of `v` and its standard error (the sample standard deviation over
/// the square root of the count), which needs two values at least. This VM's
/// medians move between sets, so the error says how far a run's overhead can
/// be trusted.
fn mean_and_error(v: &[f64]) -> (f64, Option<f64>) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n.max(1.0);
    if v.len() < 2 {
        return (mean, None);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, Some((var / n).sqrt()))
}

/// The plugin's CPU per CreateContainer in each set with it: the spread
/// within a run, which the pooled figure hides.
/// Beside it, the floor process's CPU per ping in the same sets: whether a
/// set's figure follows the machine's state or something of the plugin's.
pub fn print_set_cpu(per_set: &[f64], floor_per_set: &[f64]) {
    let list = |v: &[f64]| {
        v.iter()
            .map(|ms| format!("{ms:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (mean, se) = mean_and_error(per_set);
    let spread = se.map_or(String::new(), |se| format!(", mean {mean:.3} ± {se:.3}"));
    println!(
        "plugin cpu by set: {} ms per CreateContainer{spread}",
        list(per_set)
    );
    println!("floor by set: {} ms per message", list(floor_per_set));
}
