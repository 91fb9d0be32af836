//! `devgate status`: devices, holders and state from the ledger.
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use crate::gpu::{GpuError, HealthState, HealthStore};
use crate::ledger::{Ledger, LedgerError, LedgerState, Share};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    #[arg(long, default_value = "/run/devgate")]
    pub state_dir: PathBuf,
    /// GPU health that survives reboots (`[gpu] health_dir`).
    #[arg(long, default_value = "/var/lib/devgate")]
    pub health_dir: PathBuf,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: StatusFormat,
}

#[derive(Debug, thiserror::Error)]
pub enum StatusCmdError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("encode status: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(transparent)]
    Health(#[from] GpuError),
}

/// `-o json`: the ledger's devices and pods, and GPU health.
#[derive(Serialize)]
struct StatusView<'a> {
    #[serde(flatten)]
    ledger: &'a LedgerState,
    gpu_health: &'a HealthState,
}

pub fn run(args: StatusArgs) -> Result<(), StatusCmdError> {
    let state = Ledger::open(&args.state_dir)?.snapshot()?;
    let health = HealthStore::new(&args.health_dir).snapshot()?;
    match args.output {
        StatusFormat::Json => {
            let view = StatusView {
                ledger: &state,
                gpu_health: &health,
            };
            println!("{}", serde_json::to_string_pretty(&view)?)
        }
        StatusFormat::Table => {
            print!("{}", table(&state));
            print!("\n{}", crate::gpu::health::table(&health));
        }
    }
    Ok(())
}

fn share_text(share: &Share) -> String {
    match share {
        Share::Exclusive => "exclusive".to_string(),
        Share::Shared { core, memory_ratio } => format!("shared core {core}% mem {memory_ratio}%"),
    }
}

/// A people-readable view: one line per device holder, then one per pod.
pub fn table(state: &LedgerState) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<32} {:<28} {:<24} STATE",
        "DEVICE", "HOLDER", "SHARE"
    );
    for rec in state.devices.values() {
        let quarantine = rec
            .quarantine
            .as_ref()
            .map(|q| format!("quarantined: {}", q.reason))
            .unwrap_or_else(|| "held".to_string());
        if rec.holders.is_empty() {
            let _ = writeln!(
                out,
                "{:<32} {:<28} {:<24} {quarantine}",
                rec.device.to_string(),
                "-",
                "-"
            );
        }
        for h in &rec.holders {
            let holder = state
                .pods
                .get(&h.sandbox_id)
                .map(|p| p.pod.to_string())
                .unwrap_or_else(|| h.sandbox_id.clone());
            let _ = writeln!(
                out,
                "{:<32} {:<28} {:<24} {quarantine}",
                rec.device.to_string(),
                holder,
                share_text(&h.share)
            );
        }
    }
    let _ = writeln!(out, "\n{:<28} {:<16} CONTAINERS", "POD", "SANDBOX");
    for p in state.pods.values() {
        let names: Vec<&str> = p.containers.values().map(|c| c.name.as_str()).collect();
        let sandbox: String = p.pod.sandbox_id.chars().take(12).collect();
        let _ = writeln!(
            out,
            "{:<28} {:<16} {}",
            p.pod.to_string(),
            sandbox,
            names.join(",")
        );
    }
    out
}
