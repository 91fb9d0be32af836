//! A recording NVML for tests: canned processes, events and readings; every change
//! it is asked for lands in `calls`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use super::{
    ComputeMode, EventWait, GpuEvent, MemoryHealth, MigDestroyed, Nvml, NvmlError, Unwatched,
};

/// One change requested of the fake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    ResetApplicationClocks(String),
    ResetLockedClocks(String),
    SetComputeMode(String, ComputeMode),
    SetPersistence(String, bool),
    DestroyMig(String),
}

#[derive(Default)]
pub struct FakeNvml {
    pub calls: Mutex<Vec<Call>>,
    pub processes: Mutex<BTreeMap<String, Vec<u32>>>,
    pub mig: Mutex<BTreeSet<String>>,
    /// Each `wait_events` call takes the next batch.
    pub events: Mutex<VecDeque<Vec<GpuEvent>>>,
    pub health: Mutex<BTreeMap<String, MemoryHealth>>,
    /// GPUs whose changes fail.
    pub failing: Mutex<BTreeSet<String>>,
    /// GPUs NVML reports as lost (`GPU_IS_LOST`) to every memory reading and
    /// process listing.
    pub lost: Mutex<BTreeSet<String>>,
    /// `processes` is not supported on any GPU.
    pub processes_unsupported: std::sync::atomic::AtomicBool,
    /// Every `wait_events` fails at once, as NVML without event support does.
    pub events_unsupported: std::sync::atomic::AtomicBool,
    /// GPUs every wait reports as not registered for events.
    pub unwatched: Mutex<Vec<Unwatched>>,
    /// `wait_events` calls so far.
    pub waits: std::sync::atomic::AtomicUsize,
}

impl FakeNvml {
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn set_health(&self, uuid: &str, health: MemoryHealth) {
        self.health.lock().unwrap().insert(uuid.to_string(), health);
    }

    pub fn push_events(&self, events: Vec<GpuEvent>) {
        self.events.lock().unwrap().push_back(events);
    }

    /// `GPU_IS_LOST` (15) from `call` for a GPU in [`Self::lost`].
    fn not_lost(&self, uuid: &str, call: &'static str) -> Result<(), NvmlError> {
        if !self.lost.lock().unwrap().contains(uuid) {
            return Ok(());
        }
        Err(NvmlError::Call {
            call,
            uuid: uuid.to_string(),
            code: super::GPU_IS_LOST,
            reason: "gpu is lost",
        })
    }

    fn record(&self, uuid: &str, call: &'static str, c: Call) -> Result<(), NvmlError> {
        if self.failing.lock().unwrap().contains(uuid) {
            return Err(NvmlError::Call {
                call,
                uuid: uuid.to_string(),
                code: 4,
                reason: "no permission",
            });
        }
        self.calls.lock().unwrap().push(c);
        Ok(())
    }
}

impl Nvml for FakeNvml {
    fn present(&self) -> bool {
        true
    }
    fn processes(&self, uuid: &str) -> Result<Vec<u32>, NvmlError> {
        self.not_lost(uuid, "nvmlDeviceGetComputeRunningProcesses")?;
        if self
            .processes_unsupported
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(NvmlError::NotSupported {
                call: "nvmlDeviceGetComputeRunningProcesses",
                uuid: uuid.to_string(),
            });
        }
        Ok(self
            .processes
            .lock()
            .unwrap()
            .get(uuid)
            .cloned()
            .unwrap_or_default())
    }
    fn reset_application_clocks(&self, uuid: &str) -> Result<(), NvmlError> {
        let call = Call::ResetApplicationClocks(uuid.to_string());
        self.record(uuid, "nvmlDeviceResetApplicationsClocks", call)
    }
    fn reset_locked_clocks(&self, uuid: &str) -> Result<(), NvmlError> {
        let call = Call::ResetLockedClocks(uuid.to_string());
        self.record(uuid, "nvmlDeviceResetGpuLockedClocks", call)
    }
    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), NvmlError> {
        let call = Call::SetComputeMode(uuid.to_string(), mode);
        self.record(uuid, "nvmlDeviceSetComputeMode", call)
    }
    fn set_persistence(&self, uuid: &str, enabled: bool) -> Result<(), NvmlError> {
        let call = Call::SetPersistence(uuid.to_string(), enabled);
        self.record(uuid, "nvmlDeviceSetPersistenceMode", call)
    }
    fn mig_enabled(&self, uuid: &str) -> Result<bool, NvmlError> {
        Ok(self.mig.lock().unwrap().contains(uuid))
    }
    fn destroy_mig_instances(&self, uuid: &str) -> Result<MigDestroyed, NvmlError> {
        self.record(
            uuid,
            "nvmlGpuInstanceDestroy",
            Call::DestroyMig(uuid.to_string()),
        )?;
        Ok(MigDestroyed {
            compute_instances: 2,
            gpu_instances: 1,
        })
    }
    fn wait_events(&self, _timeout: Duration) -> Result<EventWait, NvmlError> {
        use std::sync::atomic::Ordering::Relaxed;
        self.waits.fetch_add(1, Relaxed);
        if self.events_unsupported.load(Relaxed) {
            return Err(NvmlError::Events {
                call: "nvmlEventSetCreate",
                code: 3,
                reason: "not supported",
            });
        }
        Ok(EventWait {
            events: self.events.lock().unwrap().pop_front().unwrap_or_default(),
            unwatched: self.unwatched.lock().unwrap().clone(),
        })
    }
    fn memory_health(&self, uuid: &str) -> Result<MemoryHealth, NvmlError> {
        self.not_lost(uuid, "nvmlDeviceGetHandleByUUID")?;
        Ok(self
            .health
            .lock()
            .unwrap()
            .get(uuid)
            .copied()
            .unwrap_or_default())
    }
}
