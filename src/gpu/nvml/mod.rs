//! NVML behind a narrow trait. A node without the NVIDIA driver has no NVML; that is
//! normal, and [`NoNvml`] stands in. [`load`] picks libnvidia-ml.so.1 at run time,
//! on first use, so a process that never tears a GPU down never loads it.

mod dl;

pub use dl::NvmlGpuLibrary;
#[cfg(test)]
pub mod fake;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::config::GpuComputeMode;

/// The library NVIDIA installs with the driver (k8s-device-plugin and the container
/// toolkit open the same soname).
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// `NVML_ERROR_GPU_IS_LOST`: the GPU fell off the bus (XID 79).
pub const GPU_IS_LOST: i32 = 15;
/// `NVML_ERROR_RESET_REQUIRED`: the GPU needs a reset before further use.
pub const RESET_REQUIRED: i32 = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlError {
    #[error("nvml {call} on gpu {uuid} failed: {reason} (code {code})")]
    Call {
        call: &'static str,
        uuid: String,
        code: i32,
        reason: &'static str,
    },
    #[error("nvml {call} is not supported on gpu {uuid}")]
    NotSupported { call: &'static str, uuid: String },
    #[error("nvml {call} failed: {reason} (code {code})")]
    Events {
        call: &'static str,
        code: i32,
        reason: &'static str,
    },
    #[error("load nvml from {library}: {reason}")]
    Load { library: String, reason: String },
    #[error("mig: {left} gpu instances are still on gpu {uuid} after each was destroyed")]
    MigLeft { uuid: String, left: usize },
}

impl NvmlError {
    /// NVML's word that events cannot be had at all on this node (an event
    /// set NOT_SUPPORTED, or a library without the calls): lasting, not a
    /// fault, so memory readings are all there is to know.
    pub fn events_unsupported(&self) -> bool {
        matches!(
            self,
            NvmlError::Events { code: 3 | 13, .. } | NvmlError::NotSupported { .. }
        )
    }
}

/// nvmlComputeMode_t values (nvml.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    Default = 0,
    Prohibited = 2,
    ExclusiveProcess = 3,
}

impl From<GpuComputeMode> for ComputeMode {
    fn from(mode: GpuComputeMode) -> Self {
        match mode {
            GpuComputeMode::Default => ComputeMode::Default,
            GpuComputeMode::Prohibited => ComputeMode::Prohibited,
            GpuComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
        }
    }
}

/// What an NVML event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// `nvmlEventTypeXidCriticalError`; 999 is an XID NVML does not know.
    Xid(u64),
    DoubleBitEcc,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuEvent {
    pub uuid: String,
    pub kind: EventKind,
}

/// What one wait for events saw.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventWait {
    pub events: Vec<GpuEvent>,
    /// GPUs that report events but could not be registered for them (each
    /// wait tries again): what befell them may be missing from `events`.
    pub unwatched: Vec<Unwatched>,
}

/// A GPU missing from an event set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unwatched {
    Gpu(String),
    /// NVML says the GPU is lost (GPU_IS_LOST) and cannot name it: the lost
    /// GPU's own memory reading says so too (`Fault::Lost`), which keeps it
    /// out; the others' events are whole.
    Lost,
    /// NVML could not name it: it may be any GPU.
    Unnamed,
}

impl EventWait {
    /// Whether the events cover GPU `uuid`.
    pub fn watches(&self, uuid: &str) -> bool {
        self.unwatched.iter().all(|u| match u {
            Unwatched::Gpu(other) => other != uuid,
            Unwatched::Lost => true,
            Unwatched::Unnamed => false,
        })
    }
}

impl NvmlError {
    /// NVML's GPU_IS_LOST, from any call.
    pub fn gpu_lost(&self) -> bool {
        matches!(
            self,
            NvmlError::Events {
                code: GPU_IS_LOST,
                ..
            } | NvmlError::Call {
                code: GPU_IS_LOST,
                ..
            }
        )
    }
}

/// Memory readings; `None` where the device does not support one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryHealth {
    /// Volatile uncorrected (double-bit) ECC errors since the driver loaded.
    pub dbe_volatile: Option<u64>,
    /// Pages waiting to be retired at the next reset (nvidia-smi `retired_pages.pending`).
    pub retired_pages_pending: Option<bool>,
    /// Row remappings waiting for a reset (Ampere and later).
    pub remap_pending: Option<bool>,
    /// A row remapping failed: the GPU needs service.
    pub remap_failed: Option<bool>,
}

/// MIG instances destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MigDestroyed {
    pub compute_instances: u32,
    pub gpu_instances: u32,
}

/// The NVML calls devgate makes. GPUs are named by UUID.
pub trait Nvml: Send + Sync {
    /// Whether a library answered.
    fn present(&self) -> bool;
    /// Pids with a compute or graphics context (host pid namespace).
    fn processes(&self, uuid: &str) -> Result<Vec<u32>, NvmlError>;
    /// nvidia-smi `-rac`.
    fn reset_application_clocks(&self, uuid: &str) -> Result<(), NvmlError>;
    /// nvidia-smi `-rgc` and `-rmc`.
    fn reset_locked_clocks(&self, uuid: &str) -> Result<(), NvmlError>;
    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), NvmlError>;
    fn set_persistence(&self, uuid: &str, enabled: bool) -> Result<(), NvmlError>;
    fn mig_enabled(&self, uuid: &str) -> Result<bool, NvmlError>;
    /// Compute instances first, then GPU instances (nvidia-smi `mig -dci`, `-dgi`).
    fn destroy_mig_instances(&self, uuid: &str) -> Result<MigDestroyed, NvmlError>;
    /// XID and double-bit ECC events of every GPU, waiting up to `timeout` for the first.
    fn wait_events(&self, timeout: Duration) -> Result<EventWait, NvmlError>;
    fn memory_health(&self, uuid: &str) -> Result<MemoryHealth, NvmlError>;
}

/// No NVML on this node: nothing to reset, nothing to report.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoNvml;

impl Nvml for NoNvml {
    fn present(&self) -> bool {
        false
    }
    fn processes(&self, _uuid: &str) -> Result<Vec<u32>, NvmlError> {
        Ok(Vec::new())
    }
    fn reset_application_clocks(&self, _uuid: &str) -> Result<(), NvmlError> {
        Ok(())
    }
    fn reset_locked_clocks(&self, _uuid: &str) -> Result<(), NvmlError> {
        Ok(())
    }
    fn set_compute_mode(&self, _uuid: &str, _mode: ComputeMode) -> Result<(), NvmlError> {
        Ok(())
    }
    fn set_persistence(&self, _uuid: &str, _enabled: bool) -> Result<(), NvmlError> {
        Ok(())
    }
    fn mig_enabled(&self, _uuid: &str) -> Result<bool, NvmlError> {
        Ok(false)
    }
    fn destroy_mig_instances(&self, _uuid: &str) -> Result<MigDestroyed, NvmlError> {
        Ok(MigDestroyed::default())
    }
    fn wait_events(&self, _timeout: Duration) -> Result<EventWait, NvmlError> {
        Ok(EventWait::default())
    }
    fn memory_health(&self, _uuid: &str) -> Result<MemoryHealth, NvmlError> {
        Ok(MemoryHealth::default())
    }
}

/// NVML from the first of `libraries` that opens and initialises, on first use;
/// [`NoNvml`] while none does. A failed load is tried again after
/// [`LazyNvml::RETRY`]: the driver may be loading, or its user-space library
/// just upgraded (`nvmlInit` fails with a version mismatch until the module
/// matches), and one early failure must not leave the node without NVML.
pub struct LazyNvml {
    libraries: Vec<String>,
    inner: OnceLock<Box<dyn Nvml>>,
    next_try: std::sync::Mutex<Option<std::time::Instant>>,
    retry: Duration,
}

static NO_NVML: NoNvml = NoNvml;

impl LazyNvml {
    pub const RETRY: Duration = Duration::from_secs(30);

    pub fn new(libraries: &[String]) -> LazyNvml {
        LazyNvml::with_retry(libraries, Self::RETRY)
    }

    /// [`LazyNvml::new`], trying a failed load again after `retry`.
    pub fn with_retry(libraries: &[String], retry: Duration) -> LazyNvml {
        LazyNvml {
            libraries: libraries.to_vec(),
            inner: OnceLock::new(),
            next_try: std::sync::Mutex::new(None),
            retry,
        }
    }

    fn get(&self) -> &dyn Nvml {
        if let Some(nvml) = self.inner.get() {
            return nvml.as_ref();
        }
        let mut next = self.next_try.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if next.is_some_and(|at| now < at) {
            return &NO_NVML;
        }
        match self.open_first() {
            Some(nvml) => {
                drop(next);
                self.inner.get_or_init(|| nvml).as_ref()
            }
            None => {
                *next = Some(now + self.retry);
                &NO_NVML
            }
        }
    }

    fn open_first(&self) -> Option<Box<dyn Nvml>> {
        let mut errors = Vec::new();
        for library in &self.libraries {
            match dl::DlNvml::open(library) {
                Ok(nvml) => {
                    tracing::info!(%library, "nvml loaded");
                    return Some(Box::new(nvml));
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        tracing::info!(errors = ?errors, "nvml absent, gpu clocks, modes and mig left alone");
        None
    }
}

impl Nvml for LazyNvml {
    fn present(&self) -> bool {
        self.get().present()
    }
    fn processes(&self, uuid: &str) -> Result<Vec<u32>, NvmlError> {
        self.get().processes(uuid)
    }
    fn reset_application_clocks(&self, uuid: &str) -> Result<(), NvmlError> {
        self.get().reset_application_clocks(uuid)
    }
    fn reset_locked_clocks(&self, uuid: &str) -> Result<(), NvmlError> {
        self.get().reset_locked_clocks(uuid)
    }
    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), NvmlError> {
        self.get().set_compute_mode(uuid, mode)
    }
    fn set_persistence(&self, uuid: &str, enabled: bool) -> Result<(), NvmlError> {
        self.get().set_persistence(uuid, enabled)
    }
    fn mig_enabled(&self, uuid: &str) -> Result<bool, NvmlError> {
        self.get().mig_enabled(uuid)
    }
    fn destroy_mig_instances(&self, uuid: &str) -> Result<MigDestroyed, NvmlError> {
        self.get().destroy_mig_instances(uuid)
    }
    fn wait_events(&self, timeout: Duration) -> Result<EventWait, NvmlError> {
        self.get().wait_events(timeout)
    }
    fn memory_health(&self, uuid: &str) -> Result<MemoryHealth, NvmlError> {
        self.get().memory_health(uuid)
    }
}

/// The NVML a node agent uses: the first of `libraries` (`[gpu] nvml_library`)
/// that loads, lazily, when `enabled`; else none.
pub fn load(enabled: bool, libraries: &crate::config::NvmlLibraries) -> Arc<dyn Nvml> {
    if enabled {
        Arc::new(LazyNvml::new(libraries.candidates()))
    } else {
        Arc::new(NoNvml)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NvmlLibraries;

    const MISSING: &str = "libdevgate-no-such-nvml.so.1";

    #[test]
    fn a_missing_library_is_no_nvml() {
        let nvml = LazyNvml::new(&[MISSING.to_string()]);
        assert!(!nvml.present());
        assert_eq!(nvml.processes("GPU-x").unwrap(), Vec::<u32>::new());
        assert_eq!(
            dl::DlNvml::open(MISSING)
                .err()
                .map(|e| matches!(e, NvmlError::Load { .. })),
            Some(true)
        );
    }

    #[test]
    fn the_first_library_that_loads_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let lib = crate::fixture::build_nvml_stand_in(dir.path()).unwrap();
        let lib = lib.to_str().unwrap();
        let absent = "/nonexistent/libnvidia-ml.so.1";
        let nvml = load(true, &NvmlLibraries::new(&[MISSING, absent, lib]));
        assert!(nvml.present());
        // The stand-in has no device calls: each one says so instead of failing hard.
        assert!(matches!(
            nvml.processes("GPU-x"),
            Err(NvmlError::NotSupported { .. })
        ));
        assert!(!load(true, &NvmlLibraries::new(&[MISSING, absent])).present());
        assert!(!load(false, &NvmlLibraries::new(&[lib])).present());
    }

    /// A library that appears after a failed load (a driver installed or
    /// upgraded meanwhile) is loaded at the next try, not never.
    #[test]
    fn a_library_that_appears_later_is_loaded_at_the_next_try() {
        let dir = tempfile::tempdir().unwrap();
        let later = dir.path().join("later");
        std::fs::create_dir(&later).unwrap();
        let path = later.join("libnvidia-ml.so.1");
        let nvml = LazyNvml::with_retry(&[path.display().to_string()], Duration::ZERO);
        assert!(!nvml.present());
        crate::fixture::build_nvml_stand_in(&later).unwrap();
        assert!(nvml.present(), "loaded once it is there");
        let slow = LazyNvml::with_retry(&[MISSING.to_string()], Duration::from_secs(3600));
        assert!(
            !slow.present() && !slow.present(),
            "not tried again before the retry"
        );
    }
}
