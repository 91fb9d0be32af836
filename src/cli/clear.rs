//! `devgate clear DEVICE...`: returns devices to service by hand, once an
//! operator has looked at them. A GPU loses its health mark and, when no pod
//! holds it, its quarantine, but only after the cleaning every release does
//! (no process may still have it open; clocks, compute mode and MIG are
//! reset), unless `--force`. A NIC loses its quarantine when no pod holds it
//! and no saved VF state says it may still sit configured in a pod.
//!
//! The plugin retries quarantined GPUs and heals GPUs on its own (NRI mode);
//! hooks-only mode retries a quarantined GPU only when a container wants it,
//! and nothing there heals a GPU's health mark: this is that mode's way back.

use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError};
use crate::gpu::{self, GpuError, HealthStore, Retried};
use crate::inventory::PciAddr;
use crate::ledger::{DeviceId, Ledger, LedgerError, LedgerState};
use crate::netdev::SavedStore;

#[derive(Debug, Clone, clap::Args)]
pub struct ClearArgs {
    /// GPUs by UUID (`GPU-…`), NICs (PFs or VFs) by PCI address.
    #[arg(required = true, value_parser = parse_target)]
    pub devices: Vec<Target>,
    #[arg(long, default_value = "/run/devgate")]
    pub state_dir: PathBuf,
    /// GPU health (`[gpu] health_dir` of the config when not given).
    #[arg(long)]
    pub health_dir: Option<PathBuf>,
    /// Root holding the host's `sys/` and `proc/`, for the GPU cleaning.
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    #[arg(long, default_value = crate::config::DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    /// Clear a quarantine without cleaning or checking the device first.
    #[arg(long)]
    pub force: bool,
}

/// A device named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Gpu(String),
    Nic(PciAddr),
}

/// Longest GPU UUID taken (NVIDIA's are 40 characters).
const MAX_UUID: usize = 64;

fn parse_target(text: &str) -> Result<Target, String> {
    let uuid_ok =
        |u: &str| u.len() <= MAX_UUID && u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if text.starts_with("GPU-") || text.starts_with("MIG-") {
        return uuid_ok(text)
            .then(|| Target::Gpu(text.to_string()))
            .ok_or_else(|| format!("{text:?} is not a gpu uuid"));
    }
    text.parse::<PciAddr>()
        .map(Target::Nic)
        .map_err(|_| format!("{text:?} is neither a gpu uuid (GPU-…) nor a pci address"))
}

#[derive(Debug, thiserror::Error)]
pub enum ClearError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Health(#[from] GpuError),
    #[error("{0} of the devices named could not be cleared")]
    Refused(usize),
    #[error("no state directory {}: give the plugin's --state-dir", .0.display())]
    NoStateDir(std::path::PathBuf),
    #[error(transparent)]
    Stdout(#[from] super::StdoutError),
}

/// What clearing one device did, or why it could not.
type Outcome = Result<Vec<String>, String>;

pub fn run(args: ClearArgs) -> Result<(), ClearError> {
    let config = Config::load(&args.config)?;
    let health_dir = args
        .health_dir
        .clone()
        .unwrap_or_else(|| config.gpu.health_dir.clone());
    let health = HealthStore::new(&health_dir);
    // Opening makes the directory: a mistyped one would report "nothing to
    // clear" for a quarantine that stays.
    if !args.state_dir.is_dir() {
        return Err(ClearError::NoStateDir(args.state_dir.clone()));
    }
    let ledger = Ledger::open(&args.state_dir)?;
    let mut refused = 0;
    let mut unreported = None;
    // Read once, and only for a device with nothing to clear.
    let mut inventory = None;
    for target in &args.devices {
        let (name, outcome) = match target {
            Target::Gpu(uuid) => (
                format!("gpu {uuid}"),
                clear_gpu(&args, &config, &ledger, &health, uuid),
            ),
            Target::Nic(addr) => (addr.to_string(), clear_nic(&args, &ledger, *addr)),
        };
        // A device whose state could not be read or written is one line
        // like any other refusal: the devices after it still get theirs.
        let mut outcome = outcome.unwrap_or_else(|e| Err(e.to_string()));
        if outcome.as_ref().is_ok_and(Vec::is_empty) {
            let inventory =
                inventory.get_or_insert_with(|| crate::inventory::discover(&args.host_root));
            // Like any other refusal, a read that fails here is this
            // device's line: the devices after it still get theirs.
            match known(target, &ledger, &health, inventory) {
                Ok(true) => {}
                Ok(false) => outcome = Err(UNKNOWN.to_string()),
                Err(e) => outcome = Err(e.to_string()),
            }
        }
        let line = match outcome {
            Ok(done) if done.is_empty() => format!("{name}: nothing to clear\n"),
            Ok(done) => format!("{name}: {}\n", done.join("; ")),
            Err(why) => {
                refused += 1;
                format!("{name}: not cleared: {why}\n")
            }
        };
        // The devices after it are still cleared, as asked; the failed
        // report is the command's error.
        if let Err(e) = super::to_stdout(&line) {
            unreported.get_or_insert(e);
        }
    }
    match (refused, unreported) {
        (0, None) => Ok(()),
        (0, Some(e)) => Err(e.into()),
        (n, _) => Err(ClearError::Refused(n)),
    }
}

/// The plugin that last configured itself, while it still runs (connected
/// or not, its config valid or not): its NVML keeps every GPU open, and is
/// no user of any. Known by the pid and start time it recorded, never by a
/// name a pod's process could take.
fn running_plugin(state_dir: &Path) -> Option<u32> {
    let record = super::ready::recorded_and_running(state_dir, Path::new("/proc")).ok()?;
    record.plugin.map(|p| p.pid)
}

/// Why a device with nothing to clear is refused when nothing knows it: a
/// typo, or a MIG instance, would otherwise read as done.
const UNKNOWN: &str =
    "unknown device: not in this node's inventory, ledger or gpu health (gpus by their GPU- uuid)";

/// Whether the node has `target`: its inventory, ledger or GPU health names it.
fn known(
    target: &Target,
    ledger: &Ledger,
    health: &HealthStore,
    inventory: &crate::inventory::Inventory,
) -> Result<bool, ClearError> {
    let state = ledger.snapshot()?;
    Ok(match target {
        Target::Gpu(uuid) => {
            state
                .devices
                .contains_key(&DeviceId::Gpu(uuid.clone()).to_string())
                || health.snapshot()?.gpus.contains_key(uuid)
                || inventory.gpus.iter().any(|g| g.uuid == *uuid)
        }
        Target::Nic(addr) => {
            [DeviceId::Vf(*addr), DeviceId::Pf(*addr)]
                .iter()
                .any(|d| state.devices.contains_key(&d.to_string()))
                || inventory
                    .rdma
                    .iter()
                    .any(|pf| pf.bus_id == *addr || pf.vfs.iter().any(|vf| vf.bus_id == *addr))
        }
    })
}

/// The pods holding `device`, when any do.
fn holders(state: &LedgerState, device: &DeviceId) -> Option<String> {
    let rec = state.devices.get(&device.to_string())?;
    let pods: Vec<String> = rec
        .holders
        .iter()
        .map(|h| state.holder_name(&h.sandbox_id))
        .collect();
    (!pods.is_empty()).then(|| pods.join(", "))
}

fn quarantine_of(state: &LedgerState, device: &DeviceId) -> Option<String> {
    let rec = state.devices.get(&device.to_string())?;
    rec.quarantine.as_ref().map(|q| q.reason.clone())
}

fn clear_gpu(
    args: &ClearArgs,
    config: &Config,
    ledger: &Ledger,
    health: &HealthStore,
    uuid: &str,
) -> Result<Outcome, ClearError> {
    let mut done = Vec::new();
    if let Some(fault) = health
        .snapshot()?
        .gpus
        .get(uuid)
        .and_then(|g| g.unhealthy.clone())
    {
        health.clear(uuid)?;
        done.push(format!("health mark cleared (was: {})", fault.reason()));
    }
    // What failed after the mark was cleared is said after that change.
    Ok(
        clear_gpu_quarantine(args, config, ledger, uuid, done.clone())
            .unwrap_or_else(|e| Err(prefixed(&done, &e.to_string()))),
    )
}

/// The quarantine part of [`clear_gpu`], `done` what it did before.
fn clear_gpu_quarantine(
    args: &ClearArgs,
    config: &Config,
    ledger: &Ledger,
    uuid: &str,
    mut done: Vec<String>,
) -> Result<Outcome, ClearError> {
    let device = DeviceId::Gpu(uuid.to_string());
    let state = ledger.snapshot()?;
    let Some(reason) = quarantine_of(&state, &device) else {
        return Ok(Ok(done));
    };
    if let Some(pods) = holders(&state, &device) {
        return Ok(Err(held(&done, &pods)));
    }
    if args.force {
        ledger.clear_quarantine(&device)?;
        done.push(format!("quarantine cleared unchecked (was: {reason})"));
        return Ok(Ok(done));
    }
    let inventory = gpu::discover_node(&args.host_root, &config.gpu);
    let teardown = gpu::GpuTeardown::for_node(inventory, config.gpu.clone(), ledger.clone())
        .skipping(running_plugin(&args.state_dir))
        .with_known_pods(std::sync::Arc::new(gpu::KnownPods::load_daemons(
            &args.state_dir.join(gpu::DAEMON_PODS_FILE),
        )));
    Ok(match teardown.retry_one(ledger, uuid)? {
        Retried::Cleared => {
            done.push(format!("cleaned, quarantine cleared (was: {reason})"));
            Ok(done)
        }
        Retried::Skipped => Ok(done),
        Retried::Dirty(why) => Err(prefixed(&done, &format!("still quarantined: {why}"))),
    })
}

fn clear_nic(args: &ClearArgs, ledger: &Ledger, addr: PciAddr) -> Result<Outcome, ClearError> {
    let state = ledger.snapshot()?;
    let Some((device, reason)) = [DeviceId::Vf(addr), DeviceId::Pf(addr)]
        .into_iter()
        .find_map(|d| quarantine_of(&state, &d).map(|r| (d, r)))
    else {
        return Ok(Ok(Vec::new()));
    };
    if let Some(pods) = holders(&state, &device) {
        return Ok(Err(held(&[], &pods)));
    }
    // The saved state of a VF whose restore failed: it may still be in a
    // pod's netns, configured for it.
    let saved = SavedStore::new(&args.state_dir).load(addr);
    if !args.force && !matches!(saved, Ok(None)) {
        return Ok(Err(format!(
            "its saved vf state is still there ({}): it may sit configured in a pod; \
             restore it first, or pass --force",
            match saved {
                Ok(_) => "a restore has not run".to_string(),
                Err(e) => e.to_string(),
            }
        )));
    }
    ledger.clear_quarantine(&device)?;
    Ok(Ok(vec![format!("quarantine cleared (was: {reason})")]))
}

fn held(done: &[String], pods: &str) -> String {
    prefixed(
        done,
        &format!("held by {pods}: its release retries the teardown and ends the quarantine"),
    )
}

/// `why`, after what was done before the refusal.
fn prefixed(done: &[String], why: &str) -> String {
    if done.is_empty() {
        why.to_string()
    } else {
        format!("{}; {why}", done.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_gpu_uuids_or_pci_addresses() {
        let uuid = "GPU-8beb1b46-e182-bed9-588e-9531af0df695";
        assert_eq!(parse_target(uuid), Ok(Target::Gpu(uuid.to_string())));
        assert_eq!(
            parse_target("0000:3b:02.3"),
            Ok(Target::Nic("0000:3b:02.3".parse().unwrap()))
        );
        for bad in [
            "GPU-../x",
            "gpu0",
            "",
            "3b:02",
            &format!("GPU-{}", "a".repeat(80)),
        ] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }
}
