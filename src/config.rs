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
pub mod sriov;
pub use comm_env::{CommEnvConfig, CommVar, GidFamily, VarSetting};
pub use gpu::{GpuComputeMode, GpuConfig, GpuPersistence};
pub use nvml::NvmlLibraries;
pub use sriov::SriovConfig;

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

/// A TOML error of `text` on one line: where (line and column, and the key
/// the line begins with, if it begins with one) and why, without the value
/// (a containerd config may hold registry credentials). toml's own display
/// takes five lines and quotes the line whole.
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let why = without_value(&e.message().lines().collect::<Vec<_>>().join("; "));
    let Some(at) = e.span().map(|s| s.start.min(text.len())) else {
        return why;
    };
    let before = &text.as_bytes()[..at];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
    let written = text[start..].lines().next().unwrap_or_default();
    match leading_key(written) {
        Some(key) => format!("line {line}, column {column}, at {key}: {why}"),
        None => format!("line {line}, column {column}: {why}"),
    }
}

/// The key a TOML line begins with (`key =`, dotted, bare or quoted), bounded;
/// `None` for any other line (a value continued from the line before, a
/// table header).
fn leading_key(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    let bare = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ');
    let quoted = key.len() >= 2
        && key.starts_with('"')
        && key.ends_with('"')
        && !key[1..key.len() - 1].contains(['"', '\\']);
    let ok = !key.is_empty() && key.len() <= 64 && (key.chars().all(bare) || quoted);
    ok.then_some(key)
}

/// serde's "invalid type: string \"secret\", expected u64" without the value:
/// "invalid type: string, expected u64". The kind ends where the value's
/// quotes begin ("floating point `1.5`"); what is expected is the last
/// ", expected" (a value may hold the words).
fn without_value(why: &str) -> String {
    for lead in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = why.strip_prefix(lead) {
            let kind = rest
                .split(['`', '"', ','])
                .next()
                .unwrap_or_default()
                .trim();
            let expected = rest.rfind(", expected").map_or("", |i| &rest[i..]);
            return format!("{lead}{kind}{expected}");
        }
    }
    why.to_string()
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
    /// Kernel default: RDMA devices are visible in every netns; no move.
    #[default]
    Shared,
    /// `ib_core netns_mode=0`: the RDMA device must be moved into the pod netns.
    Exclusive,
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
    /// Host lock directory HAMi-core needs shared across containers.
    pub lock_dir: String,
}

impl Default for HamiConfig {
    fn default() -> Self {
        HamiConfig {
            library_path: "/usr/local/vgpu/libvgpu.so".to_string(),
            lock_dir: "/tmp/vgpulock".to_string(),
        }
    }
}

/// Entries of `cdi_spec_dirs`.
const MAX_CDI_SPEC_DIRS: usize = 8;
/// Entries of `gpu.ignored_pods`.
const MAX_IGNORED_PODS: usize = 64;

/// `<namespace>/<pod-name-prefix>`: a namespace name (RFC 1123 label) and a
/// non-empty prefix of pod-name characters. An empty prefix would take in
/// every pod of the namespace, which no daemon's name needs.
fn is_pod_pattern(p: &str) -> bool {
    let Some((ns, prefix)) = p.split_once('/') else {
        return false;
    };
    let name_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.';
    crate::allocation::is_dns_label(ns)
        && (1..=253).contains(&prefix.len())
        && prefix.bytes().all(name_char)
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

    /// runc runs a hook only by an absolute path (runtime-spec config.md, "POSIX-
    /// platform Hooks"), and a relative state directory would be taken from the
    /// hook's working directory, the bundle: refuse both at start, not at the
    /// first container with a VF. So are the GPU health directory and a full
    /// reset without a command.
    fn validate_hook_paths(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("hook_path", &self.hook_path),
            ("hook_state_dir", &self.hook_state_dir),
        ] {
            if !value.is_empty() && !value.starts_with('/') {
                return Err(ConfigError::Invalid {
                    key: key.to_string(),
                    reason: format!("a path must be absolute: {value:?}"),
                });
            }
        }
        // The health marks are read by the hook too, whose working directory
        // is the bundle: a relative directory would be a different one there.
        if !self.gpu.health_dir.is_absolute() {
            return Err(ConfigError::Invalid {
                key: "gpu.health_dir".to_string(),
                reason: format!("a path must be absolute: {:?}", self.gpu.health_dir),
            });
        }
        if self.gpu.ignored_pods.len() > MAX_IGNORED_PODS
            || !self.gpu.ignored_pods.iter().all(|p| is_pod_pattern(p))
        {
            return Err(ConfigError::Invalid {
                key: "gpu.ignored_pods".to_string(),
                reason: format!(
                    "at most {MAX_IGNORED_PODS} entries of <namespace>/<daemonset-name>"
                ),
            });
        }
        for entry in &self.gpu.ignored_cgroups {
            if let Some(reason) = crate::gpu::ignored_cgroup_problem(entry) {
                return Err(ConfigError::Invalid {
                    key: "gpu.ignored_cgroups".to_string(),
                    reason: format!("{entry:?}: {reason}"),
                });
            }
        }
        if self.cdi_spec_dirs.len() > MAX_CDI_SPEC_DIRS
            || !self.cdi_spec_dirs.iter().all(|d| d.is_absolute())
        {
            return Err(ConfigError::Invalid {
                key: "cdi_spec_dirs".to_string(),
                reason: format!("at most {MAX_CDI_SPEC_DIRS} absolute paths"),
            });
        }
        // Every release would fail on it and quarantine its GPU for good.
        if self.gpu.full_reset && self.gpu.reset_command.first().is_none_or(|c| c.is_empty()) {
            return Err(ConfigError::Invalid {
                key: "gpu.reset_command".to_string(),
                reason: "gpu.full_reset needs a command".to_string(),
            });
        }
        Ok(())
    }

    /// The values the plan and the hook take as paths, names, modes and
    /// times: checked when the config is parsed, so that a bad one fails the
    /// config (and `devgate doctor`) instead of every container that needs
    /// devgate; the plan checks them again for a config built in memory.
    pub fn validate_plan_values(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| ConfigError::Invalid {
            key: key.to_string(),
            reason: reason.to_string(),
        };
        for (key, path) in [
            ("hami.library_path", &self.hami.library_path),
            ("hami.lock_dir", &self.hami.lock_dir),
        ] {
            let p = Path::new(path);
            if !p.is_absolute()
                || p.components().any(|c| c == std::path::Component::ParentDir)
                || path.contains('\0')
            {
                return Err(invalid(key, "must be an absolute path without .."));
            }
        }
        let prefix = &self.rdma.ifname_prefix;
        // IFNAMSIZ is 16 with the NUL: leave room for 4 digits.
        if prefix.is_empty()
            || prefix.len() > 11
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(invalid(
                "rdma.ifname_prefix",
                "must be 1 to 11 characters of [A-Za-z0-9_-]",
            ));
        }
        if self.device_file_mode > 0o777 {
            return Err(invalid(
                "device_file_mode",
                "must be at most 0o777 (write it in octal: 0o666; 666 is decimal)",
            ));
        }
        // The OCI runtime spec: a hook's timeout must be greater than zero.
        if !(1..=MAX_HOOK_TIMEOUT_SECS).contains(&self.hook_timeout_secs) {
            return Err(invalid(
                "hook_timeout_secs",
                "must be 1 to 3600 (runc kills a hook at once with 0)",
            ));
        }
        Ok(())
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
