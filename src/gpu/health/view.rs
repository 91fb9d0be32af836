//! Health as `devgate inventory` and `devgate status` show it.

use std::fmt::Write as _;

use super::HealthState;
use crate::inventory::{Health, Inventory};

/// Puts the stored health into an inventory's GPUs. A GPU discovery already found
/// unhealthy stays so, with both reasons.
pub fn merge_into(inventory: &mut Inventory, state: &HealthState) {
    for gpu in &mut inventory.gpus {
        let Some(cond) = state.unhealthy(&gpu.uuid) else {
            continue;
        };
        let reason = match &gpu.health {
            Health::Healthy => cond.reason(),
            Health::Unhealthy { reason } => format!("{reason}; {}", cond.reason()),
        };
        gpu.health = Health::Unhealthy { reason };
    }
}

/// One line per GPU with a health entry: the table fragment for `devgate status`.
/// (`-o json` is the [`HealthState`] itself, serialized.)
pub fn table(state: &HealthState) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<44} {:<10} {:<12} {:<6} FAULTS",
        "GPU", "HEALTH", "SINCE", "CLEAN"
    );
    for (uuid, gpu) in &state.gpus {
        let (health, since, faults) = match &gpu.unhealthy {
            Some(c) => ("unhealthy", c.since_unix.to_string(), c.reason()),
            None => ("healthy", "-".to_string(), "-".to_string()),
        };
        let _ = writeln!(
            out,
            "{uuid:<44} {health:<10} {since:<12} {:<6} {faults}",
            gpu.clean_checks
        );
    }
    out
}
