//! devgate: applies scheduler-chosen GPU and RDMA allocations to containers.
pub mod cli;
pub mod config;
pub mod inventory;
pub mod ledger;
