//! Device inventory read from a host root.
pub mod model;
pub use model::*;
