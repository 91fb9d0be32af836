//! The gpu module's error: every variant names the GPU, process or file it is about.

use std::path::PathBuf;

use super::nvml::NvmlError;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("gpu {uuid} is unhealthy: {reason}")]
    Unhealthy { uuid: String, reason: String },
    #[error("gpu {uuid} is not in the inventory")]
    UnknownGpu { uuid: String },
    #[error("the inventory has no nvidia char device major (proc/devices), gpu {uuid} cannot be checked")]
    NoNvidiaMajor { uuid: String },
    #[error("list the processes of the proc root")]
    ListProcesses {
        #[source]
        source: std::io::Error,
    },
    #[error("read open files of pid {pid}")]
    ProcessUnreadable {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("send {signal} to pid {pid}")]
    Signal {
        pid: u32,
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("pids {pids:?} of the released pod outlived SIGKILL")]
    Survived { pids: Vec<u32> },
    #[error("pids {pids:?} of the released pod still hold it after {rounds} rounds of ending its processes (a process forks as it is ended)")]
    StillForking { pids: Vec<u32>, rounds: usize },
    #[error("gpu {uuid} is still open in pids {pids:?} outside the released pod")]
    OutsideUsers { uuid: String, pids: Vec<u32> },
    #[error(transparent)]
    Nvml(#[from] NvmlError),
    #[error("reset of gpu {uuid} with {command:?} failed: {reason}")]
    Reset {
        uuid: String,
        command: Vec<String>,
        reason: String,
    },
    #[error("health store {path}")]
    HealthIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("health store {path} is corrupt: {reason}")]
    HealthCorrupt { path: PathBuf, reason: String },
    #[error("read the claims of gpu {uuid}: {reason}")]
    Claims { uuid: String, reason: String },
    /// `[gpu] nvml` is on and the driver is loaded, but NVML did not load:
    /// clocks, compute mode and MIG cannot be reset, nor NVML-only users seen.
    #[error("gpu {uuid} cannot be cleaned: the nvidia driver is loaded but nvml did not load (see [gpu] nvml_library)")]
    NvmlUnavailable { uuid: String },
}
