//! Subcommands of the `devgate` binary: argument structs and their entry points.
pub mod cdi;
pub mod clear;
pub mod doctor;
pub mod inventory;
pub mod nri;
pub mod plan;
pub mod ready;
pub mod status;

use crate::config::{Config, ConfigError, GpuConfig};

/// The config's `[gpu]` section, or the defaults and why the config did not
/// load: the reports that read it (`status`, `inventory`) are wanted most
/// when something is wrong, so they go on and say so.
pub(crate) fn gpu_or_default(path: &std::path::Path) -> (GpuConfig, Option<ConfigError>) {
    match Config::load(path) {
        Ok(config) => (config.gpu, None),
        Err(e) => (GpuConfig::default(), Some(e)),
    }
}
