//! Subcommands of the `devgate` binary: argument structs and their entry points.
pub mod cdi;
pub mod clear;
pub mod doctor;
pub mod inventory;
pub mod nri;
pub mod plan;
pub mod status;
