//! Ending the released pod's leftover GPU users: SIGTERM, a grace period, SIGKILL.
//!
//! Each process comes pinned by the start time read when it was found to be the
//! pod's ([`super::scan::split`]), and every signal goes through a pidfd opened
//! before a check that the pid still names that process
//! ([`super::host::Host::signal`]), so a pid the kernel reused meanwhile is
//! never signalled.

use std::collections::BTreeMap;
use std::time::Duration;

use super::host::{gone, Host, Sent, Signal};
use super::GpuError;

/// How often a waiting teardown looks again.
const POLL: Duration = Duration::from_millis(10);

/// How long each phase may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillTimes {
    pub grace: Duration,
    pub kill_wait: Duration,
}

/// What ending the processes took.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ended {
    /// Gone after SIGTERM within the grace period.
    pub terminated: Vec<u32>,
    /// Needed SIGKILL.
    pub killed: Vec<u32>,
}

/// Ends `pinned` (pid → start time). Fails when one cannot be signalled or
/// outlives SIGKILL (stuck in the driver, typically), which leaves the GPU in use.
pub fn end(
    host: &dyn Host,
    pinned: &BTreeMap<u32, u64>,
    times: KillTimes,
) -> Result<Ended, GpuError> {
    let mut live: Vec<(u32, u64)> = pinned.iter().map(|(&p, &s)| (p, s)).collect();
    let mut ended = Ended::default();
    if live.is_empty() {
        return Ok(ended);
    }
    signal_all(host, &mut live, Signal::Term)?;
    let before = live.clone();
    wait_gone(host, &mut live, times.grace)?;
    ended.terminated = gone_from(&before, &live);
    if live.is_empty() {
        return Ok(ended);
    }
    signal_all(host, &mut live, Signal::Kill)?;
    ended.killed = live.iter().map(|(p, _)| *p).collect();
    wait_gone(host, &mut live, times.kill_wait)?;
    if live.is_empty() {
        return Ok(ended);
    }
    Err(GpuError::Survived {
        pids: live.iter().map(|(p, _)| *p).collect(),
    })
}

pub(super) fn start_time(host: &dyn Host, pid: u32) -> Result<Option<u64>, GpuError> {
    match host.start_time(pid) {
        Ok(t) => Ok(t),
        Err(e) if gone(&e) => Ok(None),
        Err(source) => Err(GpuError::ProcessUnreadable { pid, source }),
    }
}

fn still_same(host: &dyn Host, pid: u32, start: u64) -> Result<bool, GpuError> {
    Ok(start_time(host, pid)? == Some(start))
}

fn signal_all(host: &dyn Host, live: &mut Vec<(u32, u64)>, signal: Signal) -> Result<(), GpuError> {
    let mut kept = Vec::with_capacity(live.len());
    for &(pid, start) in live.iter() {
        match host.signal(pid, start, signal) {
            Ok(Sent::Sent) => kept.push((pid, start)),
            Ok(Sent::Gone) => {}
            Err(e) if gone(&e) => {}
            Err(source) => {
                return Err(GpuError::Signal {
                    pid,
                    signal: signal.name(),
                    source,
                })
            }
        }
    }
    *live = kept;
    Ok(())
}

fn wait_gone(host: &dyn Host, live: &mut Vec<(u32, u64)>, limit: Duration) -> Result<(), GpuError> {
    let rounds = limit.as_millis().div_ceil(POLL.as_millis()).max(1);
    for _ in 0..rounds {
        let mut kept = Vec::with_capacity(live.len());
        for &(pid, start) in live.iter() {
            if still_same(host, pid, start)? {
                kept.push((pid, start));
            }
        }
        *live = kept;
        if live.is_empty() {
            return Ok(());
        }
        host.sleep(POLL);
    }
    Ok(())
}

fn gone_from(before: &[(u32, u64)], after: &[(u32, u64)]) -> Vec<u32> {
    before
        .iter()
        .filter(|b| !after.contains(b))
        .map(|(p, _)| *p)
        .collect()
}
