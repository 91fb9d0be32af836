//! `devgate plan`: show what a pod's container would get.
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    Json,
    Table,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// A Kubernetes Pod object (JSON or YAML), or `-` for stdin.
    #[arg(long)]
    pub pod: String,
    /// Container name; default: the first app container.
    #[arg(long)]
    pub container: Option<String>,
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    #[arg(long, default_value = "/run/devgate")]
    pub state_dir: PathBuf,
    #[arg(short = 'o', long = "output", value_enum, default_value = "json")]
    pub output: PlanFormat,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanCmdError {
    #[error("not built yet")]
    NotBuilt,
}

pub fn run(_args: PlanArgs) -> Result<(), PlanCmdError> {
    Err(PlanCmdError::NotBuilt)
}
