//! `[gpu]`: what happens to a GPU when its last claim goes, and how its
//! health is judged.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::NvmlLibraries;

/// Compute mode restored when a GPU is released (nvidia-smi(1) `-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GpuComputeMode {
    /// Several contexts per device (the driver's default after a reboot).
    #[default]
    Default,
    ExclusiveProcess,
    Prohibited,
}

/// Persistence mode set when a GPU is released (nvidia-smi(1) `-pm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GpuPersistence {
    /// Leave it as it is (nvidia-persistenced usually owns it).
    #[default]
    Keep,
    On,
    Off,
}

/// `[gpu]`: what happens to a GPU when its last claim goes, and how health is judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuConfig {
    /// Directory of `health.json`. Not under /run: health must outlive a reboot.
    pub health_dir: PathBuf,
    /// Milliseconds a leftover process of the released pod gets between SIGTERM and SIGKILL.
    /// Teardown may run inside an NRI request (2 s deadline by default), so keep it short.
    pub kill_grace_ms: u64,
    /// Milliseconds to wait for SIGKILLed processes to go before the teardown fails.
    pub kill_wait_ms: u64,
    /// Cgroups of node daemons that keep GPUs open and are no tenant (a systemd unit
    /// name, or an absolute cgroup path prefix); they neither block nor get killed.
    /// NVML keeps every GPU open while loaded: list devgate's own cgroup here when
    /// teardown runs in a process other than the one watching health.
    pub ignored_cgroups: Vec<String>,
    /// Pods of node daemons that keep GPUs open (NVML-based agents run as
    /// DaemonSets), as `namespace/daemonset-name`: namespaces only the
    /// cluster's operators create pods in. NRI mode only (the plugin learns
    /// pods from the runtime).
    pub ignored_pods: Vec<String>,
    /// Load NVML when present. Off: clocks, modes and MIG are left alone.
    pub nvml: bool,
    /// The NVML library: a soname the dynamic loader searches for, or an absolute
    /// path, such as the host's driver library where a DaemonSet mounts it; or a
    /// list of them, tried in order.
    pub nvml_library: NvmlLibraries,
    /// Reset application and locked clocks (nvidia-smi `-rac`, `-rgc`, `-rmc`).
    pub reset_clocks: bool,
    /// The node's compute mode, restored on release.
    pub compute_mode: GpuComputeMode,
    pub persistence: GpuPersistence,
    /// Destroy MIG compute and GPU instances when the pod held the whole GPU.
    pub destroy_mig: bool,
    /// Run `reset_command` after release. Never by default: nvidia-smi(1) calls a reset
    /// "not recommended for production", and it needs every GPU it touches idle.
    pub full_reset: bool,
    /// The reset, `{bus_id}` and `{uuid}` replaced by the GPU's.
    pub reset_command: Vec<String>,
    /// XIDs that are application errors, not device faults (k8s-device-plugin health.go).
    pub ignored_xids: Vec<u64>,
    /// Consecutive clean health checks before an unhealthy GPU returns to service.
    pub recovery_clean_checks: u32,
    /// Seconds without a new fault before an unhealthy GPU returns to service.
    pub recovery_quiet_secs: u64,
    /// Seconds between health checks (also the NVML event wait).
    pub health_interval_secs: u64,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            health_dir: PathBuf::from("/var/lib/devgate"),
            kill_grace_ms: 1000,
            kill_wait_ms: 500,
            ignored_cgroups: [
                "nvidia-persistenced.service",
                "nvidia-fabricmanager.service",
                "nvidia-dcgm.service",
                "devgate.service",
            ]
            .map(String::from)
            .to_vec(),
            ignored_pods: [
                "koordinator-system/koordlet",
                "gpu-operator/nvidia-device-plugin-daemonset",
                "gpu-operator/nvidia-dcgm",
                "gpu-operator/nvidia-dcgm-exporter",
                "gpu-operator/nvidia-driver-daemonset",
                "kube-system/nvidia-device-plugin-daemonset",
            ]
            .map(String::from)
            .to_vec(),
            nvml: true,
            nvml_library: NvmlLibraries::default(),
            reset_clocks: true,
            compute_mode: GpuComputeMode::Default,
            persistence: GpuPersistence::Keep,
            destroy_mig: true,
            full_reset: false,
            reset_command: ["nvidia-smi", "--gpu-reset", "-i", "{bus_id}"]
                .map(String::from)
                .to_vec(),
            ignored_xids: vec![13, 31, 43, 45, 68, 109],
            recovery_clean_checks: 3,
            recovery_quiet_secs: 600,
            health_interval_secs: 30,
        }
    }
}
