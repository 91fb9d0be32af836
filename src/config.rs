//! Node configuration (`/etc/devgate/config.toml`). A missing file means defaults.
//!
//! Every key has a default, so an empty file is a valid config. Unknown keys are
//! rejected so that a typo does not silently fall back to a default.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod vf;
pub use vf::{MacPolicy, VfConfig, VfLinkState, VfSettingName, VfSettings};

pub mod comm_env;
mod gpu;
mod nvml;
mod pci_keys;
pub mod sriov;
pub use comm_env::{CommEnvConfig, CommVar, GidFamily, VarSetting};
pub use gpu::{GpuComputeMode, GpuConfig, GpuPersistence};
pub use nvml::NvmlLibraries;
pub use sriov::SriovConfig;
mod toml_error;
pub use toml_error::toml_error;
mod validate;

/// Default location of the config file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/devgate/config.toml";
/// Upper bound on the config size: the runtime passes pre-installed plugin config inline.
pub const MAX_CONFIG_BYTES: usize = 256 * 1024;
/// The longest `hook_timeout_secs`: an hour, far past any VF move.
pub const MAX_HOOK_TIMEOUT_SECS: i64 = 3600;

/// A pod the namespace rules give no devices, as the plugin, the hook in
/// hooks-only mode and `devgate plan` all refuse it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}: pod {pod}: namespace {namespace} {rule}",
    crate::allocation::DEVICE_ALLOCATED
)]
pub struct NamespaceRefused {
    /// `<namespace>/<name>`.
    pub pod: String,
    /// The pod's namespace; `(none)` for a container no Kubernetes pod stands
    /// behind (podman in hooks-only mode).
    pub namespace: String,
    pub rule: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {origin} is larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge { origin: String },
    #[error("parse config {origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("config key {key}: {reason}")]
    Invalid { key: String, reason: String },
}

/// What to do when an allocation cannot be applied exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Refuse the container (default, safe).
    #[default]
    Fail,
    /// Koordinator's behaviour: log and start the container without devices. Unsafe.
    Ignore,
}

/// The whole node config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Log format for `devgate nri`: "text" or "json".
    pub log_format: LogFormat,
    pub failure_policy: FailurePolicy,
    /// Mode of injected device nodes.
    pub device_file_mode: u32,
    /// Path of `devgate-hook`; empty = the `devgate-hook` next to the running `devgate`.
    pub hook_path: String,
    /// Seconds the runtime gives the hook before killing it.
    pub hook_timeout_secs: i64,
    /// `--state-dir` given to the hook, as the host sees it (runc runs the hook
    /// on the host); empty = the plugin's own `--state-dir`.
    pub hook_state_dir: String,
    pub rdma: RdmaConfig,
    pub hami: HamiConfig,
    pub gpu: GpuConfig,
    pub vf: VfConfig,
    /// Grant only what the pod's containers request (`crate::grant`). Unset:
    /// `requests` when an API server is configured or found in-cluster, else `off`.
    pub grant_check: Option<crate::grant::GrantCheck>,
    /// When not empty, only pods in these namespaces get devices.
    pub allowed_namespaces: Vec<String>,
    /// Pods in these namespaces never get devices.
    pub denied_namespaces: Vec<String>,
    /// Milliseconds CreateContainer waits for a pod the API watch has not delivered yet.
    pub grant_wait_ms: u64,
    pub kube_api: crate::grant::KubeApiConfig,
    /// VF counts the node should have (bootstrap creates them, doctor checks).
    pub sriov: SriovConfig,
    pub comm_env: CommEnvConfig,
    /// How the adjustment names devices: raw nodes, or CDI names where the
    /// runtime injects them.
    pub device_mode: DeviceMode,
    /// Whether the runtime injects CDI devices named in an adjustment, where the
    /// plugin cannot tell from ConfigureRequest (containerd 1.7's `enable_cdi`).
    pub runtime_cdi: RuntimeCdi,
    /// The runtime's CDI spec directories, lowest priority first (CDI's
    /// default and containerd's `cdi_spec_dirs`): with `device_mode = "cdi"`
    /// the plugin checks there that the spec gives what the plan does.
    pub cdi_spec_dirs: Vec<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            log_format: LogFormat::Text,
            failure_policy: FailurePolicy::Fail,
            device_file_mode: 0o666,
            hook_path: String::new(),
            hook_timeout_secs: 10,
            hook_state_dir: String::new(),
            rdma: RdmaConfig::default(),
            hami: HamiConfig::default(),
            gpu: GpuConfig::default(),
            vf: VfConfig::default(),
            grant_check: None,
            allowed_namespaces: Vec::new(),
            denied_namespaces: Vec::new(),
            grant_wait_ms: crate::grant::DEFAULT_WAIT_MS,
            kube_api: crate::grant::KubeApiConfig::default(),
            sriov: SriovConfig::default(),
            comm_env: CommEnvConfig::default(),
            device_mode: DeviceMode::Nodes,
            runtime_cdi: RuntimeCdi::Auto,
            cdi_spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
        }
    }
}

/// How a container's devices appear in the NRI adjustment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeviceMode {
    /// `linux.devices` with numbers from sysfs (every runtime).
    #[default]
    Nodes,
    /// CDI names (`devgate.io/gpu=<uuid>`, `devgate.io/rdma=<bdf>`) from the spec
    /// `devgate cdi generate` writes, where the runtime injects CDI devices;
    /// raw nodes elsewhere.
    Cdi,
}

impl DeviceMode {
    /// As the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceMode::Nodes => "nodes",
            DeviceMode::Cdi => "cdi",
        }
    }
}

/// What the operator states about the runtime's CDI injection (`runtime_cdi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeCdi {
    /// From the runtime's name and version: containerd >= 2.1, CRI-O >= 1.34.
    #[default]
    Auto,
    /// The runtime's CDI injection is enabled (containerd 1.7.30+ with
    /// `enable_cdi = true`); honoured only by releases that inject when enabled.
    On,
    /// Never name CDI devices (the spec is not in the runtime's CDI directories).
    Off,
}

impl RuntimeCdi {
    /// As the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeCdi::Auto => "auto",
            RuntimeCdi::On => "on",
            RuntimeCdi::Off => "off",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The kernel's RDMA netns mode (`rdma system set netns`), as the node is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RdmaNetnsMode {
    /// Kernel default: RDMA devices are visible in every netns; no move,
    /// unless the kernel is found exclusive (`plan::rdma::moves_rdma`).
    #[default]
    Shared,
    /// `ib_core netns_mode=0`: the RDMA device must be moved into the pod netns.
    Exclusive,
}

impl RdmaNetnsMode {
    /// As the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RdmaNetnsMode::Shared => "shared",
            RdmaNetnsMode::Exclusive => "exclusive",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RdmaConfig {
    pub netns_mode: RdmaNetnsMode,
    /// Also inject `issmN` nodes (subnet-manager access; off by default).
    pub allow_issm: bool,
    /// Prefix of container interface names for moved VF netdevs: net1, net2, ...
    pub ifname_prefix: String,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            netns_mode: RdmaNetnsMode::Shared,
            allow_issm: false,
            ifname_prefix: "net".to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HamiConfig {
    /// Host path of HAMi-core's libvgpu.so; mounted at the same path in the container.
    pub library_path: String,
    /// HAMi-core's lock directory in the container, shared by every
    /// HAMi-core container on the node.
    pub lock_dir: String,
    /// The host directory bound there: devgate's own (see
    /// [`crate::plan::ensure_hami_lock_dir`]), never one any user could make
    /// first, such as a host `/tmp` path a user could turn into a link to a
    /// directory of theirs, which runc's bind would follow.
    pub host_lock_dir: String,
}

impl Default for HamiConfig {
    fn default() -> Self {
        HamiConfig {
            library_path: "/usr/local/vgpu/libvgpu.so".to_string(),
            lock_dir: "/tmp/vgpulock".to_string(),
            host_lock_dir: "/run/devgate/vgpulock".to_string(),
        }
    }
}

impl Config {
    /// Refuses pod `name` of `namespace` where a namespace rule says so:
    /// devices go to no pod in `denied_namespaces` and, where
    /// `allowed_namespaces` is set, only to pods in it. Both modes apply it:
    /// the plugin's grant check and the hook in hooks-only mode.
    pub fn check_namespace(&self, namespace: &str, name: &str) -> Result<(), NamespaceRefused> {
        let rule = if self.denied_namespaces.iter().any(|n| n == namespace) {
            "is in denied_namespaces"
        } else if !self.allowed_namespaces.is_empty()
            && !self.allowed_namespaces.iter().any(|n| n == namespace)
        {
            "is not in allowed_namespaces"
        } else {
            return Ok(());
        };
        let namespace = match namespace {
            "" => "(none)",
            ns => ns,
        };
        Err(NamespaceRefused {
            pod: format!("{namespace}/{name}"),
            namespace: namespace.to_string(),
            rule,
        })
    }

    /// Parse config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        if text.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge {
                origin: origin.to_string(),
            });
        }
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_string(),
            message: toml_error(text, &e),
        })?;
        config.vf.validate()?;
        validate::mode_written_in_octal(text)?;
        config.validate_plan_values()?;
        crate::grant::validate(&config)?;
        config.sriov.validate()?;
        config.comm_env.validate()?;
        config.gpu.nvml_library.validate()?;
        config.validate_hook_paths()?;
        Ok(config)
    }

    /// Load from a file; a missing file gives the defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        use crate::fsutil::BoundedError;
        let origin = || path.display().to_string();
        let read = |source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        };
        let text = match crate::fsutil::read_text_bounded(path, MAX_CONFIG_BYTES as u64) {
            Ok(text) => text,
            Err(e) if e.is_not_found() => return Ok(Config::default()),
            Err(BoundedError::Io(source)) => return Err(read(source)),
            Err(BoundedError::TooLarge { .. }) => {
                return Err(ConfigError::TooLarge { origin: origin() })
            }
        };
        Config::parse(&text, &origin())
    }
}

#[cfg(test)]
mod tests;
