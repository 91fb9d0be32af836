//! Whether the runtime accepted the running plugin, not only whether it runs.
//!
//! NRI has no call that lists a runtime's plugins; containerd (1.7.24 and
//! 2.1.9 alike) only logs `plugin "external:10-devgate[<pid>]" registered as
//! "10-devgate"` at info level, in a log whose place depends on the node. But a
//! runtime sends Configure only to a plugin whose RegisterPlugin it accepted
//! (NRI api.proto: RegisterPlugin, then Configure and Synchronize), and
//! `devgate nri` records every Configure in `<state-dir>/runtime.json`, with
//! the pid and start time of the process that wrote it. A record naming this
//! process therefore shows that it was registered; the plugin marks the
//! record when the runtime closes that connection (`disconnected_unix`),
//! until a runtime configures it again. The `nri socket` check covers a
//! runtime that is down.
use std::path::{Path, PathBuf};

use super::host::{read_bounded, Host, Roots};
use crate::hook::liveness::{self, LivenessError};
use crate::plugin::features::{FeaturesError, RuntimeRecord};

#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("start time of pid {pid}")]
    Start {
        pid: u32,
        #[source]
        source: LivenessError,
    },
    #[error("read boot time from {path}: {reason}")]
    BootTime { path: PathBuf, reason: String },
    #[error("runtime record")]
    Record(#[from] FeaturesError),
}

/// What the state directory says about the plugin process `pid`.
#[derive(Debug)]
pub enum Registration {
    /// A runtime configured it after it started.
    Configured(RuntimeRecord),
    /// The last Configure recorded is older than the process, or there is none.
    NotSinceStart {
        started_unix: u64,
        last: Option<RuntimeRecord>,
    },
}

/// Reads `<proc>/<pid>/stat`, `<proc>/stat` and the runtime record.
pub fn registration(
    roots: &Roots,
    host: &dyn Host,
    pid: u32,
) -> Result<Registration, RegistrationError> {
    let ticks = liveness::start_ticks(&roots.proc_dir, pid)
        .map_err(|source| RegistrationError::Start { pid, source })?;
    let boot = boot_time(&roots.proc_dir)?;
    let started_unix = boot.saturating_add(ticks / host.clock_ticks_per_sec().max(1));
    let record = RuntimeRecord::load(&roots.state_dir)?;
    Ok(match record {
        Some(r) if configured_this(&r, pid, ticks, started_unix) => Registration::Configured(r),
        last => Registration::NotSinceStart { started_unix, last },
    })
}

/// Whether `r` records a Configure of the process `pid` that started at
/// `ticks`. A record naming its plugin answers exactly, whatever the clock
/// did since (a boot-time step by NTP moves `btime`, read in the clock of
/// now; a restart within the second of a Configure is the same second).
/// Only a record of an older release, naming none, is judged by its time,
/// both times whole seconds rounded down: one second is allowed.
fn configured_this(r: &RuntimeRecord, pid: u32, ticks: u64, started_unix: u64) -> bool {
    match &r.plugin {
        Some(p) => p.pid == pid && p.start_ticks == ticks,
        None => r.configured_unix.saturating_add(1) >= started_unix,
    }
}

/// `btime` of proc(5) `/proc/stat`: the boot time in seconds since the epoch.
fn boot_time(proc_dir: &Path) -> Result<u64, RegistrationError> {
    let path = proc_dir.join("stat");
    let text = read_bounded(&path).map_err(|e| RegistrationError::BootTime {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(RegistrationError::BootTime {
            path,
            reason: "no btime line".to_string(),
        })
}
