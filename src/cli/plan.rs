//! `devgate plan`: show what a pod's container would get.
//!
//! Reads a Kubernetes Pod object (`kubectl get pod -o json` or YAML): its
//! annotations, labels and container names. Nothing is changed on the node.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::allocation::{parse_pod, AllocationError};
use crate::config::Config;
use crate::fsutil::BoundedError;
use crate::inventory;
use crate::ledger::{Claim, Ledger, LedgerState, Share};
use crate::plan::{self, Plan, PlanError};

/// Largest pod file accepted; a Pod object is far smaller (etcd caps objects at 1.5 MiB).
pub const MAX_POD_BYTES: u64 = 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    Json,
    Table,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// A Kubernetes Pod object (JSON or YAML), or `-` for stdin.
    #[arg(long)]
    pub pod: String,
    /// Container name; default: the first app container.
    #[arg(long)]
    pub container: Option<String>,
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// Ledger directory: devices held by other pods are reported as warnings.
    #[arg(long, default_value = "/run/devgate")]
    pub state_dir: PathBuf,
    /// Node config file; a missing file means defaults.
    #[arg(long, default_value = crate::config::DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    #[arg(short = 'o', long = "output", value_enum, default_value = "json")]
    pub output: PlanFormat,
}

/// Why `devgate plan` failed; `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum PlanCmdError {
    #[error("read pod {origin}")]
    Read {
        origin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("pod {origin}: larger than {MAX_POD_BYTES} bytes")]
    TooLarge { origin: String },
    #[error("pod {origin}: not a pod object: {reason}")]
    Parse { origin: String, reason: String },
    #[error("pod {origin}: no container {name:?} in spec.containers or spec.initContainers")]
    NoSuchContainer { origin: String, name: String },
    #[error("pod {origin}: no containers in spec.containers")]
    NoContainers { origin: String },
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Namespace(#[from] crate::config::NamespaceRefused),
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("encode plan: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(transparent)]
    Stdout(#[from] super::StdoutError),
}

/// The parts of a Pod object devgate reads; everything else is ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PodObject {
    pub metadata: PodMeta,
    pub spec: PodSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PodMeta {
    pub name: String,
    pub namespace: String,
    /// Tells this pod from an earlier one of the same name (a StatefulSet's
    /// pod made again) whose sandbox still holds its devices.
    pub uid: String,
    pub annotations: Option<BTreeMap<String, String>>,
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodSpec {
    pub containers: Option<Vec<ContainerName>>,
    pub init_containers: Option<Vec<ContainerName>>,
    /// Whether the pod runs in the host's network namespace; the runtime
    /// gives any other pod one of its own, which decides a whole PF's fate
    /// in exclusive RDMA netns mode as it does at creation.
    pub host_network: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ContainerName {
    pub name: String,
    /// The container's own variables: a communication variable set here wins.
    pub env: Option<Vec<EnvVar>>,
}

/// One `env` entry; `valueFrom` entries count as set, their value unknown here.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct EnvVar {
    pub name: String,
    pub value: Option<String>,
}

impl PodObject {
    /// `NAME=value` for each variable `container` sets in the pod spec, as the
    /// runtime passes a container's env. The image's variables are not known here.
    pub fn container_env(&self, container: &str) -> Vec<String> {
        let apps = self.spec.containers.as_deref().unwrap_or_default();
        let inits = self.spec.init_containers.as_deref().unwrap_or_default();
        let found = apps.iter().chain(inits).find(|c| c.name == container);
        let vars = found.and_then(|c| c.env.as_deref()).unwrap_or_default();
        vars.iter()
            .map(|v| format!("{}={}", v.name, v.value.as_deref().unwrap_or_default()))
            .collect()
    }
}

pub fn run(args: PlanArgs) -> Result<(), PlanCmdError> {
    let origin = if args.pod == "-" {
        "<stdin>".to_string()
    } else {
        args.pod.clone()
    };
    let text = read_bounded(&args.pod, &origin)?;
    let mut pod = parse_pod_object(&text, &origin)?;
    // A pod file without a namespace is created in `default`.
    if pod.metadata.namespace.is_empty() {
        pod.metadata.namespace = "default".to_string();
    }
    let container = choose_container(&pod, args.container.as_deref(), &origin)?;
    let config = Config::load(&args.config).map_err(|e| PlanCmdError::Config(e.to_string()))?;
    let plan = plan_pod(&pod, &container, &args.host_root, &config)?;
    let plan = with_ledger_warnings(plan, &args.state_dir, &pod.metadata);
    let text = match args.output {
        PlanFormat::Json => serde_json::to_string_pretty(&plan)? + "\n",
        PlanFormat::Table => table(&plan),
    };
    Ok(super::to_stdout(&text)?)
}

/// Parses a Pod object: JSON when it looks like JSON, YAML otherwise.
pub fn parse_pod_object(text: &str, origin: &str) -> Result<PodObject, PlanCmdError> {
    let parsed = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    };
    parsed.map_err(|reason| PlanCmdError::Parse {
        origin: origin.to_string(),
        reason: one_line(&reason),
    })
}

/// The plan of `container` in `pod`, against the inventory of `host_root`.
pub fn plan_pod(
    pod: &PodObject,
    container: &str,
    host_root: &Path,
    config: &Config,
) -> Result<Plan, PlanCmdError> {
    let empty = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let devices = parse_pod(annotations, labels)?;
    // The plugin refuses such a pod before it plans (the grant check's first
    // rule), so the plan would show what the container never gets.
    let meta = &pod.metadata;
    if !devices.allocation.is_empty() {
        config.check_namespace(&meta.namespace, &meta.name)?;
    }
    // Discovery is skipped for a pod without devices: its plan is empty on any
    // node. Otherwise the node as the plugin sees it (NVML's indices and
    // memory where the driver is), with GPU health as warnings.
    let inventory = if devices.allocation.is_empty() {
        inventory::Inventory::default()
    } else {
        crate::gpu::discover_node_with_health(host_root, &config.gpu, &config.gpu.health_dir)
    };
    let env = pod.container_env(container);
    let ctx = plan::ContainerContext {
        env: &env,
        gids: &plan::HostGids { root: host_root },
        network: match pod.spec.host_network {
            Some(true) => plan::PodNetwork::Host,
            _ => plan::PodNetwork::Own,
        },
    };
    Ok(plan::build_for(
        &inventory, &devices, container, config, &ctx,
    )?)
}

fn read_bounded(path: &str, origin: &str) -> Result<String, PlanCmdError> {
    let read_err = |source| PlanCmdError::Read {
        origin: origin.to_string(),
        source,
    };
    let reader: Box<dyn Read> = if path == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).map_err(read_err)?)
    };
    let mut bytes = Vec::new();
    match crate::fsutil::read_bounded(reader, MAX_POD_BYTES, &mut bytes) {
        Ok(()) => {}
        Err(BoundedError::Io(source)) => return Err(read_err(source)),
        Err(BoundedError::TooLarge { .. }) => {
            return Err(PlanCmdError::TooLarge {
                origin: origin.to_string(),
            })
        }
    }
    String::from_utf8(bytes).map_err(|_| PlanCmdError::Parse {
        origin: origin.to_string(),
        reason: "not utf-8".to_string(),
    })
}

fn choose_container(
    pod: &PodObject,
    wanted: Option<&str>,
    origin: &str,
) -> Result<String, PlanCmdError> {
    let apps = pod.spec.containers.as_deref().unwrap_or_default();
    let inits = pod.spec.init_containers.as_deref().unwrap_or_default();
    match wanted {
        Some(name) if apps.iter().chain(inits).any(|c| c.name == name) => Ok(name.to_string()),
        Some(name) => Err(PlanCmdError::NoSuchContainer {
            origin: origin.to_string(),
            name: name.chars().take(64).collect(),
        }),
        None => apps
            .first()
            .map(|c| c.name.clone())
            .ok_or_else(|| PlanCmdError::NoContainers {
                origin: origin.to_string(),
            }),
    }
}

/// Adds a warning per claimed device that another pod holds in the ledger. The
/// ledger is only read, and only when the directory exists: `plan` changes nothing.
fn with_ledger_warnings(mut plan: Plan, state_dir: &Path, me: &PodMeta) -> Plan {
    if plan.claims.is_empty() || !state_dir.is_dir() {
        return plan;
    }
    match Ledger::open(state_dir).and_then(|l| l.snapshot()) {
        Ok(state) => {
            for claim in &plan.claims {
                plan.warnings.extend(quarantined(&state, claim));
                plan.warnings.extend(held_by_others(&state, claim, me));
                plan.warnings.extend(pf_vf_warning(&state, claim, me));
            }
        }
        Err(e) => plan
            .warnings
            .push(format!("ledger not read: {}", one_line(&e.to_string()))),
    }
    plan
}

fn held_by_others(state: &LedgerState, claim: &Claim, me: &PodMeta) -> Option<String> {
    let record = state.devices.get(&claim.device.to_string())?;
    let others: Vec<String> = record
        .holders
        .iter()
        .filter_map(|h| state.pods.get(&h.sandbox_id).map(|p| (p, h)))
        .filter(|(p, _)| !same_pod(&p.pod, me))
        .map(|(p, h)| format!("{} ({})", p.pod, share_text(&h.share)))
        .collect();
    (!others.is_empty()).then(|| format!("{} is held by {}", claim.device, others.join(", ")))
}

/// Whether the ledger's `pod` is `me`: by name, and by UID where both
/// know it.
fn same_pod(pod: &crate::ledger::PodRef, me: &PodMeta) -> bool {
    let uid_agrees = pod.uid.is_empty() || me.uid.is_empty() || pod.uid == me.uid;
    pod.name == me.name && pod.namespace == me.namespace && uid_agrees
}

/// A quarantined device is given to no pod: the plugin refuses the claim.
fn quarantined(state: &LedgerState, claim: &Claim) -> Option<String> {
    let record = state.devices.get(&claim.device.to_string())?;
    let q = record.quarantine.as_ref()?;
    Some(format!(
        "{} is quarantined: {}",
        claim.device,
        one_line(&q.reason)
    ))
}

/// A PF held whole beside a VF of it, held by a pod other than this one.
fn pf_vf_warning(state: &LedgerState, claim: &Claim, me: &PodMeta) -> Option<String> {
    let err = crate::ledger::pf_vf_conflict(state, claim)?;
    if let crate::ledger::LedgerError::HeldWithPf { other, .. } = &err {
        let holders = state
            .devices
            .get(&other.to_string())
            .map(|r| r.holders.as_slice())
            .unwrap_or_default();
        let mine = !holders.is_empty()
            && holders.iter().all(|h| {
                state
                    .pods
                    .get(&h.sandbox_id)
                    .is_some_and(|p| same_pod(&p.pod, me))
            });
        if mine {
            return None;
        }
    }
    Some(err.to_string())
}

fn share_text(share: &Share) -> String {
    match share {
        Share::Exclusive => "exclusive".to_string(),
        Share::Shared { core, memory_ratio } => format!("core {core}%, memory {memory_ratio}%"),
    }
}

fn one_line(s: &str) -> String {
    crate::untrusted::one_line(s, 300)
}

/// A people-readable view of a plan.
pub fn table(plan: &Plan) -> String {
    let mut out = String::new();
    let selected = if plan.selected {
        ""
    } else {
        " (not selected: gets nothing)"
    };
    let _ = writeln!(out, "CONTAINER {}{selected}", plan.container);
    if !plan.devices.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<32} {:<5} {:<12} MODE",
            "DEVICE", "TYPE", "NUMBER"
        );
        for d in &plan.devices {
            let number = format!("{}:{}", d.major, d.minor);
            let _ = writeln!(
                out,
                "{:<32} {:<5} {:<12} {:04o}",
                d.path, "c", number, d.file_mode
            );
        }
    }
    if !plan.env.is_empty() {
        let _ = writeln!(out, "\nENV");
        for (k, v) in &plan.env {
            let _ = writeln!(out, "{k}={v}");
        }
    }
    if !plan.mounts.is_empty() {
        let _ = writeln!(out, "\nMOUNT");
        for m in &plan.mounts {
            let _ = writeln!(
                out,
                "{} -> {} ({})",
                m.source,
                m.destination,
                m.options.join(",")
            );
        }
    }
    if !plan.network.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<14} {:<4} {:<14} {:<16} {:<12} IFNAME",
            "PF", "VF", "VF BUS", "NETDEV", "RDMA"
        );
        for n in &plan.network {
            let dash = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".to_string());
            let _ = writeln!(
                out,
                "{:<14} {:<4} {:<14} {:<16} {:<12} {}",
                n.pf.to_string(),
                n.vf_index,
                n.vf_bus_id.to_string(),
                dash(&n.netdev),
                dash(&n.rdma_device),
                n.container_ifname
            );
        }
    }
    if !plan.claims.is_empty() {
        let _ = writeln!(out, "\nCLAIM");
        for c in &plan.claims {
            let _ = writeln!(out, "{} {}", c.device, share_text(&c.share));
        }
    }
    for (title, list) in [
        ("IGNORED TYPES", &plan.ignored_types),
        ("WARNINGS", &plan.warnings),
        ("NOTES", &plan.notes),
    ] {
        if !list.is_empty() {
            let _ = writeln!(out, "\n{title}");
            for item in list {
                let _ = writeln!(out, "{item}");
            }
        }
    }
    out
}
