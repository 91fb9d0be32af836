//! `devgate status`: devices, holders and state from the ledger, and how each
//! pod's GPUs and NICs connect.
mod devices;
mod pairs;
mod runtime;
mod unapplied;
mod vfs;

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

use crate::gpu::{GpuError, HealthState, HealthStore};
use crate::ledger::{Ledger, LedgerError, LedgerState, Share};
pub use pairs::{pod_pairs, Pair, PodPairs};
pub use vfs::{RdmaPlacement, VfView};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    #[arg(long, default_value = "/run/devgate")]
    pub state_dir: PathBuf,
    /// GPU health that survives reboots (`[gpu] health_dir` of the config
    /// when not given).
    #[arg(long)]
    pub health_dir: Option<PathBuf>,
    /// The config naming `[gpu] health_dir`.
    #[arg(long, default_value = crate::config::DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    /// Root holding the host's `sys/`, for the PCIe placement of held
    /// devices; default: the plugin's `--host-root`, from its runtime record,
    /// where this machine has that root's `sys/`, else `/`.
    #[arg(long)]
    pub host_root: Option<PathBuf>,
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
    #[error(transparent)]
    Runtime(#[from] crate::plugin::features::FeaturesError),
    #[error(transparent)]
    Grants(#[from] crate::grant::audit::AuditError),
    #[error(transparent)]
    Stdout(#[from] super::StdoutError),
}

/// `-o json`: the ledger's devices and pods, and GPU health.
#[derive(Serialize)]
struct StatusView<'a> {
    /// The ledger's document, each device with its state and each holder
    /// with its pod ([`devices::json`]).
    #[serde(flatten)]
    ledger: &'a serde_json::Map<String, serde_json::Value>,
    gpu_health: &'a HealthState,
    /// Where GPU health was read, and why from the default when the config
    /// did not load.
    gpu_health_dir: &'a std::path::Path,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_health_dir_error: Option<&'a str>,
    gpu_nic_pairs: &'a [PodPairs],
    /// The runtime devgate was last configured by, and the features in use.
    runtime: Option<&'a crate::plugin::features::RuntimeRecord>,
    /// Whether the plugin process that wrote `runtime` still runs; absent
    /// where the record names none or its process cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_plugin_running: Option<bool>,
    /// Grant check decisions: granted, refused and why.
    grants: &'a crate::grant::GrantCounters,
    /// VFs in pods, and where their RDMA devices are.
    vfs: &'a [VfView],
    /// Containers running without their allocation: created while devgate
    /// was not connected, found by the last Synchronize.
    unapplied_containers: &'a [crate::plugin::unapplied_record::Unapplied],
    /// Why the VFs' saved state could not be read, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    vf_state_error: Option<&'a str>,
    /// Why GPU health, the runtime record or the grant counters could not be
    /// read, when they could not (then shown empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_health_error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grants_error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unapplied_error: Option<&'a str>,
}

/// The value, or its default and why it could not be had.
fn or_said<T: Default, E: std::error::Error>(read: Result<T, E>) -> (T, Option<String>) {
    match read {
        Ok(value) => (value, None),
        Err(e) => (T::default(), Some(nri::ErrorChain(&e).to_string())),
    }
}

/// `--health-dir`, else the config's: the one the plugin and the hook mark.
/// A config that does not load (the moment status is most needed) leaves the
/// default, said on stderr, and the rest of the report as it is.
fn health_dir(args: &StatusArgs) -> (PathBuf, Option<String>) {
    if let Some(dir) = &args.health_dir {
        return (dir.clone(), None);
    }
    let (gpu, error) = super::gpu_or_default(&args.config);
    let why = error.map(|e| {
        let why = format!("{e}; gpu health read from {}", gpu.health_dir.display());
        eprintln!("devgate status: {why}");
        why
    });
    (gpu.health_dir, why)
}

pub fn run(args: StatusArgs) -> Result<(), StatusCmdError> {
    // Reads as a ledger with nothing held; a mistyped directory must not pass
    // for an idle node unsaid (stderr: the output stays a report).
    if !args.state_dir.exists() {
        eprintln!(
            "devgate status: no state directory {}: nothing is held there (give the plugin's --state-dir)",
            args.state_dir.display()
        );
    }
    let state = Ledger::read(&args.state_dir)?;
    let (health_dir, health_dir_error) = health_dir(&args);
    // A file beside the ledger that cannot be read is said, not allowed to
    // hide the ledger's holders and quarantines.
    let (health, gpu_health_error) = or_said(HealthStore::new(&health_dir).snapshot());
    let (runtime_record, runtime_error) = or_said(crate::plugin::features::RuntimeRecord::load(
        &args.state_dir,
    ));
    let plugin_running = runtime_record.as_ref().and_then(|r| {
        match super::ready::writer_runs(r, std::path::Path::new("/proc")) {
            Ok(()) => Some(true),
            Err(super::ready::ReadyError::Gone(_)) => Some(false),
            Err(_) => None,
        }
    });
    let (grants, grants_error) = or_said(crate::grant::audit::read_counters(&args.state_dir));
    let (unapplied, unapplied_error) =
        or_said(crate::plugin::unapplied_record::load(&args.state_dir));
    let unreadable = [
        ("gpu health", &gpu_health_error),
        ("runtime record", &runtime_error),
        ("grant counters", &grants_error),
        ("unapplied containers", &unapplied_error),
    ];
    // A VF record that cannot be read is shown, not allowed to hide the rest.
    let (vfs, vf_state_error): (Vec<VfView>, Option<String>) =
        match crate::netdev::SavedStore::new(&args.state_dir).readable() {
            Ok((saved, bad)) => {
                let errors: Vec<String> = bad.iter().map(ToString::to_string).collect();
                (
                    saved.iter().map(VfView::of).collect(),
                    (!errors.is_empty()).then(|| errors.join("; ")),
                )
            }
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
    // Discovery only when some pod holds both kinds: it is the slow part.
    let pairs = if state.pods.values().any(holds_gpu_and_nic) {
        let root = host_root(args.host_root.as_deref(), runtime_record.as_ref());
        pod_pairs(&state, &crate::inventory::discover(&root))
    } else {
        Vec::new()
    };
    let text = match args.output {
        StatusFormat::Json => {
            let ledger = devices::json(&state)?;
            let view = StatusView {
                ledger: &ledger,
                gpu_health: &health,
                gpu_health_dir: &health_dir,
                gpu_health_dir_error: health_dir_error.as_deref(),
                gpu_nic_pairs: &pairs,
                runtime: runtime_record.as_ref(),
                runtime_plugin_running: plugin_running,
                grants: &grants,
                vfs: &vfs,
                unapplied_containers: &unapplied,
                vf_state_error: vf_state_error.as_deref(),
                gpu_health_error: gpu_health_error.as_deref(),
                runtime_error: runtime_error.as_deref(),
                grants_error: grants_error.as_deref(),
                unapplied_error: unapplied_error.as_deref(),
            };
            serde_json::to_string_pretty(&view)? + "\n"
        }
        StatusFormat::Table => {
            let mut out = runtime::table(runtime_record.as_ref(), plugin_running);
            out.push('\n');
            out.push_str(&table(&state));
            let _ = write!(out, "\n{}", crate::gpu::health::table(&health));
            let _ = write!(out, "\n{}", crate::grant::audit::table(&grants));
            if !vfs.is_empty() {
                let _ = write!(out, "\n{}", vfs::table(&vfs));
            }
            if let Some(e) = &vf_state_error {
                let _ = writeln!(out, "\nVFS: saved state unreadable: {e}");
            }
            if !pairs.is_empty() {
                let _ = write!(out, "\n{}", pairs::table(&pairs));
            }
            if !unapplied.is_empty() {
                let _ = write!(out, "\n{}", unapplied::table(&unapplied));
            }
            for (what, e) in unreadable {
                if let Some(e) = e {
                    let _ = writeln!(out, "\n{}: unreadable: {e}", what.to_uppercase());
                }
            }
            out
        }
    };
    super::to_stdout(&text)?;
    Ok(())
}

/// `--host-root`, else the one the plugin runs with: the placement it
/// planned with. A recorded root this machine lacks (the record of a plugin
/// in a container, read from the host) leaves `/`.
fn host_root(
    given: Option<&std::path::Path>,
    record: Option<&crate::plugin::features::RuntimeRecord>,
) -> PathBuf {
    if let Some(root) = given {
        return root.to_path_buf();
    }
    record
        .and_then(|r| r.host_root.as_ref())
        .filter(|root| root.join("sys").is_dir())
        .cloned()
        .unwrap_or_else(|| PathBuf::from("/"))
}

fn holds_gpu_and_nic(pod: &crate::ledger::PodRecord) -> bool {
    use crate::ledger::DeviceId;
    let gpu = pod
        .claims
        .iter()
        .any(|c| matches!(c.device, DeviceId::Gpu(_)));
    let nic = pod
        .claims
        .iter()
        .any(|c| !matches!(c.device, DeviceId::Gpu(_)));
    gpu && nic
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
            .unwrap_or_else(|| devices::state(rec).to_string());
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
            let holder = state.holder_name(&h.sandbox_id);
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

#[cfg(test)]
mod host_root_tests {
    use super::*;
    use crate::config::{DeviceMode, RuntimeCdi};
    use crate::plugin::features::RuntimeRecord;

    fn record(host_root: Option<&std::path::Path>) -> RuntimeRecord {
        let mut r = RuntimeRecord::new(
            &nri::RuntimeInfo::default(),
            Default::default(),
            DeviceMode::Nodes,
            RuntimeCdi::Auto,
            std::path::Path::new("/"),
        );
        r.host_root = host_root.map(std::path::Path::to_path_buf);
        r
    }

    /// `--host-root` wins; else the plugin's, where it holds `sys/`; else `/`.
    #[test]
    fn the_given_root_then_the_plugins_then_slash() {
        let dir = tempfile::tempdir().unwrap();
        let with_sys = dir.path().join("host");
        std::fs::create_dir_all(with_sys.join("sys")).unwrap();
        let without_sys = dir.path().join("elsewhere");
        let given = std::path::Path::new("/given");
        let cases = [
            (
                Some(given),
                Some(record(Some(&with_sys))),
                given.to_path_buf(),
            ),
            (None, Some(record(Some(&with_sys))), with_sys.clone()),
            (None, Some(record(Some(&without_sys))), PathBuf::from("/")),
            (None, Some(record(None)), PathBuf::from("/")),
            (None, None, PathBuf::from("/")),
        ];
        for (given, rec, want) in cases {
            assert_eq!(host_root(given, rec.as_ref()), want, "{given:?} {rec:?}");
        }
    }
}
