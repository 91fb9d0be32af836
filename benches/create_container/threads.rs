//! `DEVGATE_BENCH_THREADS=1`: which of the plugin's threads ran within the
//! CreateContainer windows, and for how long, so that work off the request
//! path (the grant counters' writer, a release worker) that lands inside a
//! window shows as its own line instead of inflating the request thread's.

use std::collections::BTreeMap;

/// Each thread's CPU time and name, by thread id.
fn sample(pid: u32) -> BTreeMap<u32, (String, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return BTreeMap::new();
    };
    tasks
        .filter_map(|t| {
            let t = t.ok()?;
            let tid = t.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            let ns = stat.split_whitespace().next()?.parse::<u64>().ok()?;
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            Some((tid, (comm.trim_end().to_string(), ns)))
        })
        .collect()
}

/// CPU time per thread name over the windows measured, and in how many of
/// them each name ran.
#[derive(Default)]
pub struct Threads {
    by_name: BTreeMap<String, (u64, usize)>,
    windows: usize,
}

/// A window begun: the threads' times at its start.
pub struct Window(BTreeMap<u32, (String, u64)>);

impl Threads {
    /// `Some` when `DEVGATE_BENCH_THREADS` is set.
    pub fn from_env() -> Option<Self> {
        std::env::var_os("DEVGATE_BENCH_THREADS").map(|_| Self::default())
    }

    pub fn begin(pid: u32) -> Window {
        Window(sample(pid))
    }

    /// A thread that ended within the window is not seen (its time is in
    /// the process's CPU clock, not here); one started in it counts from zero.
    pub fn end(&mut self, pid: u32, window: Window) {
        self.windows += 1;
        let mut ran = BTreeMap::<String, u64>::new();
        for (tid, (name, ns)) in sample(pid) {
            let was = window.0.get(&tid).map_or(0, |(_, ns)| *ns);
            *ran.entry(name).or_default() += ns.saturating_sub(was);
        }
        // Threads of one name (release workers) ran in a window once.
        for (name, ns) in ran {
            let entry = self.by_name.entry(name).or_default();
            entry.0 += ns;
            entry.1 += usize::from(ns > 0);
        }
    }

    pub fn report(&self) {
        for (name, (ns, ran)) in &self.by_name {
            let per = *ns as f64 / 1e6 / self.windows.max(1) as f64;
            println!(
                "thread {name}: {per:.4} ms per CreateContainer, running in {ran} of {} windows",
                self.windows
            );
        }
    }
}
