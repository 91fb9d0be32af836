//! `devgate inventory`: show the devices of a host root.
//!
//! `-o table` is for people; `-o json` prints [`InventoryView`] (a stable contract, see
//! `inventory::view`); `-o device-cr` prints the Koordinator `Device` object as YAML (see
//! `inventory::device_cr`). Warnings go to stderr, one line each, never to stdout.

mod table;

use std::io::{self, Write};
use std::path::PathBuf;

use crate::inventory::device_cr::device_cr;
use crate::inventory::view::InventoryView;
use crate::inventory::{host_name, Inventory, InventoryError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InventoryFormat {
    Table,
    Json,
    DeviceCr,
}

#[derive(Debug, Clone, clap::Args)]
pub struct InventoryArgs {
    /// Root holding the host's `sys/` and `proc/`.
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: InventoryFormat,
    /// Node name for `-o device-cr`; default: `$NODE_NAME` (a DaemonSet's or
    /// Job's downward API), else the host root's `proc/sys/kernel/hostname`,
    /// lower-cased as the kubelet does.
    #[arg(long)]
    pub node_name: Option<String>,
    /// GPU health state, where unhealthy GPUs show with their reason;
    /// default: `[gpu] health_dir` of `--config`, as the plugin marks it.
    #[arg(long)]
    pub health_dir: Option<PathBuf>,
    /// Node config: its `[gpu]` section (health_dir, nvml, nvml_library); a
    /// missing file means defaults.
    #[arg(long, default_value = crate::config::DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryCmdError {
    #[error(transparent)]
    NoSysfs(#[from] super::NoSysfs),
    #[error("node name {name:?} is not a node's name (lower case, a DNS-1123 subdomain of at most 253 characters): pass --node-name or set NODE_NAME")]
    BadNodeName { name: String },
    #[error("this process's host name is not the host's (another UTS namespace): pass --node-name or set NODE_NAME")]
    OtherUts,
    #[error("no node name for the device object (pass --node-name)")]
    NodeName {
        #[source]
        source: InventoryError,
    },
    #[error("encode the inventory as {format}")]
    Encode {
        format: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Write(#[from] super::StdoutError),
}

pub fn run(args: InventoryArgs) -> Result<(), InventoryCmdError> {
    super::require_sysfs(&args.host_root)?;
    let mut stderr = io::stderr().lock();
    let (gpu, error) = super::gpu_or_default(&args.config);
    if let Some(e) = error {
        let _ = writeln!(
            stderr,
            "devgate: warning: {}; [gpu] defaults",
            nri::ErrorChain(&e)
        );
    }
    let health_dir = args
        .health_dir
        .clone()
        .unwrap_or_else(|| gpu.health_dir.clone());
    let inv = crate::gpu::discover_node_with_health(&args.host_root, &gpu, &health_dir);
    for warning in &inv.warnings {
        // Best effort: a closed stderr must not hide the inventory itself.
        let _ = writeln!(stderr, "devgate: warning: {warning}");
    }
    let text = render(&inv, &args)?;
    Ok(super::to_stdout(&text)?)
}

/// The text `run` prints for `inv`.
pub fn render(inv: &Inventory, args: &InventoryArgs) -> Result<String, InventoryCmdError> {
    match args.output {
        InventoryFormat::Table => Ok(table::render(inv)),
        InventoryFormat::Json => {
            let mut text = serde_json::to_string_pretty(&InventoryView::new(inv))
                .map_err(|e| encode_err("json", e))?;
            text.push('\n');
            Ok(text)
        }
        InventoryFormat::DeviceCr => {
            let from_env = || std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty());
            let name = match args.node_name.clone().or_else(from_env) {
                Some(name) => node_name(&name)?,
                None => node_name(&node_host_name(&args.host_root)?)?,
            };
            serde_yaml_ng::to_string(&device_cr(inv, &name)).map_err(|e| encode_err("yaml", e))
        }
    }
}

/// A node's name as the API server takes it: lower case, as kubelet makes
/// its host name and `--hostname-override` (`nodeutil.GetHostname`), then a
/// DNS-1123 subdomain (at most 253 characters of `a-z`, `0-9`, `-` and `.`,
/// starting and ending with a letter or digit). An object named otherwise
/// would be refused by the API server or name no node, and the scheduler
/// would never see the node's devices.
fn node_name(given: &str) -> Result<String, InventoryCmdError> {
    let name = given.trim().to_lowercase();
    if crate::grant::settings::valid_node_name(&name) {
        Ok(name)
    } else {
        Err(InventoryCmdError::BadNodeName {
            name: given.chars().take(256).collect(),
        })
    }
}

/// The node's name as kubelet takes it by default: the host name, lower
/// case. A host root without `proc/sys/kernel/hostname` (a copy that left
/// procfs out) is named after this machine, when this process shares the
/// machine's UTS namespace, with a warning.
fn node_host_name(host_root: &std::path::Path) -> Result<String, InventoryCmdError> {
    other_uts(host_root)?;
    let name = match host_name(host_root) {
        Ok(name) => name,
        Err(e) if e.is_not_found() => {
            // The initial UTS namespace itself, not init's: in a container
            // without the host's pid namespace, pid 1 is the container's.
            if !in_initial_uts() {
                return Err(InventoryCmdError::NodeName { source: e });
            }
            let machine = std::path::Path::new("/");
            let own =
                host_name(machine).map_err(|source| InventoryCmdError::NodeName { source })?;
            eprintln!(
                "devgate: warning: no proc/sys/kernel/hostname under {}: the device object is named after this machine ({own}); pass --node-name to name it",
                host_root.display()
            );
            own
        }
        Err(source) => return Err(InventoryCmdError::NodeName { source }),
    };
    Ok(name)
}

/// The initial UTS namespace's link, `PROC_UTS_INIT_INO`
/// (include/linux/proc_ns.h).
const INIT_UTS: &str = "uts:[4026531838]";

/// Whether this process is in the initial UTS namespace.
fn in_initial_uts() -> bool {
    std::fs::read_link("/proc/self/ns/uts").is_ok_and(|l| l == std::path::Path::new(INIT_UTS))
}

/// Fails where `proc/sys/kernel/hostname` under the host root is a procfs
/// file and this process is not in the host's UTS namespace (a pod without
/// `hostNetwork`): procfs shows the reader's own host name, whichever procfs
/// it is read through, so it would name the pod. A host root that is a copy
/// holds the node's name as a plain file.
fn other_uts(host_root: &std::path::Path) -> Result<(), InventoryCmdError> {
    use nix::sys::statfs::{statfs, PROC_SUPER_MAGIC};
    let file = host_root.join("proc/sys/kernel/hostname");
    if !statfs(&file).is_ok_and(|fs| fs.filesystem_type() == PROC_SUPER_MAGIC) {
        return Ok(());
    }
    // The host's namespace is its init's, where that link can be read (a
    // node that is itself a container, kind or LXD, has one of its own);
    // else the initial one. This process's own unreadable counts as another.
    let host = std::fs::read_link(host_root.join("proc/1/ns/uts"))
        .unwrap_or_else(|_| PathBuf::from(INIT_UTS));
    match std::fs::read_link("/proc/self/ns/uts") {
        Ok(own) if own == host => Ok(()),
        _ => Err(InventoryCmdError::OtherUts),
    }
}

fn encode_err(
    format: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> InventoryCmdError {
    InventoryCmdError::Encode {
        format,
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::node_name;

    #[test]
    fn node_names_are_lower_case_dns_subdomains() {
        for (given, want) in [
            ("node-a", Some("node-a")),
            ("Node-A.Example.COM", Some("node-a.example.com")),
            ("gpu-07\n", Some("gpu-07")),
            ("7", Some("7")),
            ("", None),
            ("node_a", None),
            ("node-", None),
            (".node", None),
            ("nöde", None),
        ] {
            assert_eq!(node_name(given).ok().as_deref(), want, "{given:?}");
        }
        assert!(node_name(&"a".repeat(253)).is_ok());
        assert!(node_name(&"a".repeat(254)).is_err());
    }
}
