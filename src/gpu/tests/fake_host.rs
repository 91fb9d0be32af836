//! A recording host: processes are entries in a map, signals remove them unless they
//! resist, sleeping only adds up.

use std::collections::BTreeMap;
use std::io;
use std::sync::Mutex;
use std::time::Duration;

use crate::gpu::host::{Host, Sent, Signal, Wanted};

#[derive(Debug, Clone, Default)]
pub struct FakeProc {
    pub devs: Vec<u64>,
    pub cgroup: String,
    pub start: u64,
    pub ignores_term: bool,
    pub unkillable: bool,
    /// Ended by SIGTERM, it leaves a child (its pid + 1000) holding what it
    /// held, in its cgroup, this many times over.
    pub forks_on_term: u32,
    /// It runs devgate's own executable.
    pub devgate: bool,
}

/// A process of pod a (`uid-a`) holding `devs`.
pub fn in_pod(devs: Vec<u64>) -> FakeProc {
    FakeProc {
        devs,
        cgroup: "0::/kubepods/poduid-a/c1\n".into(),
        start: 1,
        ..FakeProc::default()
    }
}

#[derive(Default)]
pub struct FakeHost {
    pub procs: Mutex<BTreeMap<u32, FakeProc>>,
    pub signals: Mutex<Vec<(u32, Signal)>>,
    pub slept: Mutex<Duration>,
    pub commands: Mutex<Vec<Vec<String>>>,
    /// Whether the NVIDIA driver counts as loaded.
    pub driver_loaded: std::sync::atomic::AtomicBool,
}

impl FakeHost {
    pub fn add(&self, pid: u32, devs: &[u64], cgroup: &str) -> &Self {
        self.add_proc(
            pid,
            FakeProc {
                devs: devs.to_vec(),
                cgroup: format!("0::{cgroup}\n"),
                start: u64::from(pid) * 10,
                ..FakeProc::default()
            },
        )
    }

    pub fn add_proc(&self, pid: u32, p: FakeProc) -> &Self {
        self.procs.lock().unwrap().insert(pid, p);
        self
    }

    pub fn alive(&self, pid: u32) -> bool {
        self.procs.lock().unwrap().contains_key(&pid)
    }

    pub fn signals(&self) -> Vec<(u32, Signal)> {
        self.signals.lock().unwrap().clone()
    }

    pub fn slept(&self) -> Duration {
        *self.slept.lock().unwrap()
    }
}

fn not_found() -> io::Error {
    io::Error::from(io::ErrorKind::NotFound)
}

impl Host for FakeHost {
    fn runs_this_program(&self, pid: u32) -> bool {
        let procs = self.procs.lock().unwrap();
        procs.get(&pid).is_some_and(|p| p.devgate)
    }

    fn nvidia_driver_loaded(&self) -> bool {
        self.driver_loaded
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn pids(&self) -> io::Result<Vec<u32>> {
        Ok(self.procs.lock().unwrap().keys().copied().collect())
    }

    fn open_char_devices(
        &self,
        pid: u32,
        wanted: Wanted<'_>,
        out: &mut Vec<u64>,
    ) -> io::Result<()> {
        let procs = self.procs.lock().unwrap();
        let devs = &procs.get(&pid).ok_or_else(not_found)?.devs;
        out.extend(devs.iter().filter(|d| wanted.is_none_or(|w| w.contains(d))));
        Ok(())
    }

    fn cgroup(&self, pid: u32) -> io::Result<String> {
        let procs = self.procs.lock().unwrap();
        Ok(procs.get(&pid).ok_or_else(not_found)?.cgroup.clone())
    }

    fn start_time(&self, pid: u32) -> io::Result<Option<u64>> {
        Ok(self.procs.lock().unwrap().get(&pid).map(|p| p.start))
    }

    fn signal(&self, pid: u32, start: u64, signal: Signal) -> io::Result<Sent> {
        let mut procs = self.procs.lock().unwrap();
        let Some(p) = procs.get(&pid).filter(|p| p.start == start) else {
            return Ok(Sent::Gone);
        };
        self.signals.lock().unwrap().push((pid, signal));
        let dies = match signal {
            Signal::Term => !p.ignores_term && !p.unkillable,
            Signal::Kill => !p.unkillable,
        };
        if dies {
            let gone = procs.remove(&pid).unwrap_or_default();
            if signal == Signal::Term && gone.forks_on_term > 0 {
                let child = FakeProc {
                    start: gone.start + 1,
                    forks_on_term: gone.forks_on_term - 1,
                    ..gone
                };
                procs.insert(pid + 1000, child);
            }
        }
        Ok(Sent::Sent)
    }

    fn sleep(&self, duration: Duration) {
        *self.slept.lock().unwrap() += duration;
    }

    fn run(&self, argv: &[String], _timeout: Duration) -> Result<(), String> {
        self.commands.lock().unwrap().push(argv.to_vec());
        Ok(())
    }
}
