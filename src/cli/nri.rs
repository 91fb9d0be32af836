//! `devgate nri`: run the NRI plugin.
use std::path::PathBuf;

/// Flags of `devgate nri` (a contract: install scripts and tests rely on them).
#[derive(Debug, Clone, clap::Args)]
pub struct NriArgs {
    /// NRI socket of the runtime; ignored in pre-installed mode (fd 3 from the runtime).
    #[arg(long, default_value = "/var/run/nri/nri.sock")]
    pub socket: PathBuf,
    /// Plugin name registered with the runtime.
    #[arg(long, default_value = "devgate")]
    pub name: String,
    /// Two-digit plugin index; lower runs first.
    #[arg(long, default_value = "10")]
    pub idx: String,
    /// Node config file; a missing file means defaults.
    #[arg(long, default_value = devgate_default_config())]
    pub config: PathBuf,
    /// Root holding the host's `sys/` and `proc/`.
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// Directory of claims and saved device state.
    #[arg(long, default_value = "/run/devgate")]
    pub state_dir: PathBuf,
}

const fn devgate_default_config() -> &'static str {
    crate::config::DEFAULT_CONFIG_PATH
}

#[derive(Debug, thiserror::Error)]
pub enum NriCmdError {
    #[error("not built yet")]
    NotBuilt,
}

pub fn run(_args: NriArgs) -> Result<(), NriCmdError> {
    Err(NriCmdError::NotBuilt)
}
