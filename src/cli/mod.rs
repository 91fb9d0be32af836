//! Subcommands of the `devgate` binary: argument structs and their entry points.
pub mod cdi;
pub mod clear;
pub mod doctor;
pub mod inventory;
pub mod nri;
pub mod plan;
pub mod ready;
pub mod status;

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError, GpuConfig};

/// A host root without `sys/devices`: a wrong `--host-root`, or a
/// container's `/host/sys` left unmounted.
#[derive(Debug, thiserror::Error)]
#[error("no sysfs under {}: {}/sys/devices is not a directory (give --host-root the root holding the host's sys/ and proc/, with sys mounted)", .root.display(), .root.display())]
pub struct NoSysfs {
    pub root: PathBuf,
}

/// Refuses a host root without sysfs before anything reads it: it would read
/// as a node without devices, and what the command makes of that (a device
/// object saying so, CDI specs removed as stale) would tell the scheduler or
/// the runtime the node has none.
pub(crate) fn require_sysfs(root: &Path) -> Result<(), NoSysfs> {
    if root.join("sys/devices").is_dir() {
        Ok(())
    } else {
        Err(NoSysfs {
            root: root.to_path_buf(),
        })
    }
}

/// Writing a command's report to stdout failed.
#[derive(Debug, thiserror::Error)]
#[error("write to stdout")]
pub struct StdoutError(#[source] pub std::io::Error);

/// Writes `text` to stdout and flushes it. `print!` panics when the write
/// fails (a full disk, a closed descriptor); a command reports it as its
/// error instead. A closed pipe ends the process by SIGPIPE (see `main`).
pub(crate) fn to_stdout(text: &str) -> Result<(), StdoutError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(StdoutError)
}

/// The config's `[gpu]` section, or the defaults and why the config did not
/// load: the reports that read it (`status`, `inventory`) are wanted most
/// when something is wrong, so they go on and say so.
pub(crate) fn gpu_or_default(path: &std::path::Path) -> (GpuConfig, Option<ConfigError>) {
    match Config::load(path) {
        Ok(config) => (config.gpu, None),
        Err(e) => (GpuConfig::default(), Some(e)),
    }
}
