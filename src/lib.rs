//! devgate: applies scheduler-chosen GPU and RDMA allocations to containers.
pub mod allocation;
pub mod cdi;
pub mod cli;
pub mod config;
pub mod fixture;
pub mod fsutil;
pub mod gpu;
pub mod grant;
pub mod hook;
pub mod inventory;
pub mod ledger;
pub mod logging;
pub mod netdev;
pub mod plan;
pub mod plugin;
pub mod residency;
pub mod untrusted;
