//! `devgate inventory`: show the devices of a host root.
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InventoryFormat {
    Table,
    Json,
    DeviceCr,
}

#[derive(Debug, Clone, clap::Args)]
pub struct InventoryArgs {
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: InventoryFormat,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryCmdError {
    #[error("not built yet")]
    NotBuilt,
}

pub fn run(_args: InventoryArgs) -> Result<(), InventoryCmdError> {
    Err(InventoryCmdError::NotBuilt)
}
