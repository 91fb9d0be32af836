//! `DEVGATE_BENCH_THREADS=1`: which of the plugin's threads ran within the
//! CreateContainer windows, and for how long, so that work off the request
//! path (the grant counters' writer, a release worker) that lands inside a
//! window shows as its own line instead of inflating the request thread's.

use std::collections::BTreeMap;

use crate::proc::ms_each;

/// Each thread's name, CPU time and timeslices (how often it was put on a
/// CPU: schedstat's third field), by thread id.
fn sample(pid: u32) -> BTreeMap<u32, (String, u64, u64, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return BTreeMap::new();
    };
    tasks
        .filter_map(|t| {
            let t = t.ok()?;
            let tid = t.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            let mut fields = stat.split_whitespace();
            let ns = fields.next()?.parse::<u64>().ok()?;
            let slices = fields.nth(1)?.parse::<u64>().ok()?;
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let sleeps = status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
                .trim()
                .parse::<u64>()
                .ok()?;
            Some((tid, (comm.trim_end().to_string(), ns, slices, sleeps)))
        })
        .collect()
}

/// CPU time and timeslices per thread name over the windows measured, and in
/// how many of them each name ran.
#[derive(Default)]
pub struct Threads {
    by_name: BTreeMap<String, (u64, u64, u64, usize)>,
    windows: usize,
}

/// A window begun: the threads' times at its start.
pub struct Window(BTreeMap<u32, (String, u64, u64, u64)>);

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
        let mut ran = BTreeMap::<String, (u64, u64, u64)>::new();
        for (tid, (name, ns, slices, sleeps)) in sample(pid) {
            let was = window.0.get(&tid).map_or((0, 0, 0), |w| (w.1, w.2, w.3));
            let entry = ran.entry(name).or_default();
            entry.0 += ns.saturating_sub(was.0);
            entry.1 += slices.saturating_sub(was.1);
            entry.2 += sleeps.saturating_sub(was.2);
        }
        // Threads of one name (release workers) ran in a window once.
        for (name, (ns, slices, sleeps)) in ran {
            let entry = self.by_name.entry(name).or_default();
            entry.0 += ns;
            entry.1 += slices;
            entry.2 += sleeps;
            entry.3 += usize::from(ns > 0);
        }
    }

    pub fn report(&self) {
        let windows = self.windows.max(1) as f64;
        for (name, (ns, slices, sleeps, ran)) in &self.by_name {
            let per = ms_each(*ns, self.windows.max(1));
            let slices = *slices as f64 / windows;
            let sleeps = *sleeps as f64 / windows;
            println!(
                "thread {name}: {per:.4} ms, {slices:.2} timeslices and {sleeps:.2} sleeps \
                 per CreateContainer, running in {ran} of {} windows",
                self.windows
            );
        }
    }
}
