//! What inventory takes from NVML: the device index (`NVIDIA_VISIBLE_DEVICES`
//! integers and CUDA ordinals follow it, and it need not equal the minor) and the
//! total memory (Koordinator's `gpu-memory`).

use std::ffi::{c_char, c_uint, CString};

use super::{check, DlNvml, Handle, Ret};
use crate::gpu::nvml::NvmlError;
use crate::inventory::{GpuFacts, GpuLibrary, PciAddr};

/// `nvmlMemory_t` (nvml.h): total, free and used bytes.
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

impl DlNvml {
    /// NVML's index and total memory of the GPU at PCI address `bus`.
    pub fn gpu_facts(&self, bus: &str) -> Result<(u32, u64), NvmlError> {
        let by_bus: unsafe extern "C" fn(*const c_char, *mut Handle) -> Ret =
            self.sym(c"nvmlDeviceGetHandleByPciBusId_v2", bus)?;
        let text = CString::new(bus).map_err(|_| NvmlError::Call {
            call: "nvmlDeviceGetHandleByPciBusId_v2",
            uuid: bus.to_string(),
            code: 2,
            reason: "invalid argument",
        })?;
        let mut dev: Handle = std::ptr::null_mut();
        // SAFETY: a valid C string and out pointer.
        check("nvmlDeviceGetHandleByPciBusId_v2", bus, unsafe {
            by_bus(text.as_ptr(), &mut dev)
        })?;
        let get_index: unsafe extern "C" fn(Handle, *mut c_uint) -> Ret =
            self.sym(c"nvmlDeviceGetIndex", bus)?;
        let mut index: c_uint = 0;
        // SAFETY: a handle from NVML and an out pointer.
        check("nvmlDeviceGetIndex", bus, unsafe {
            get_index(dev, &mut index)
        })?;
        let get_memory: unsafe extern "C" fn(Handle, *mut Memory) -> Ret =
            self.sym(c"nvmlDeviceGetMemoryInfo", bus)?;
        let mut memory = Memory::default();
        // SAFETY: a handle from NVML and an out pointer to nvmlMemory_t.
        check("nvmlDeviceGetMemoryInfo", bus, unsafe {
            get_memory(dev, &mut memory)
        })?;
        Ok((index, memory.total))
    }
}

/// NVML as inventory's GPU library. Opened only for the machine's own root: a
/// simulated host root must never be mixed with the real driver's view.
pub struct NvmlGpuLibrary(DlNvml);

impl NvmlGpuLibrary {
    /// The first of `libraries` that loads, when `host_root` is `/`; `None`
    /// otherwise (absent is normal on nodes without the driver).
    pub fn for_root(host_root: &std::path::Path, libraries: &[String]) -> Option<NvmlGpuLibrary> {
        if host_root != std::path::Path::new("/") {
            return None;
        }
        libraries.iter().find_map(|library| {
            DlNvml::open(library)
                .map(NvmlGpuLibrary)
                .map_err(|e| tracing::debug!(error = %nri::ErrorChain(&e), "no nvml for inventory"))
                .ok()
        })
    }
}

impl GpuLibrary for NvmlGpuLibrary {
    fn gpu(&self, bus_id: PciAddr) -> Option<GpuFacts> {
        match self.0.gpu_facts(&bus_id.to_string()) {
            Ok((index, total)) => Some(GpuFacts {
                index: Some(index),
                memory_bytes: Some(total),
                health: None,
            }),
            Err(e) => {
                tracing::warn!(gpu = %bus_id, error = %nri::ErrorChain(&e), "nvml does not know this gpu");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library that loads: the fixture's NVML stand-in, then a missing one.
    fn libraries(dir: &std::path::Path) -> Vec<String> {
        let lib = crate::fixture::build_nvml_stand_in(dir).unwrap();
        vec![
            "/nonexistent/libnvidia-ml.so.1".to_string(),
            lib.to_string_lossy().into_owned(),
        ]
    }

    /// The first library that loads, for the machine's own root only: a
    /// simulated root is never mixed with the real driver's view.
    #[test]
    fn only_the_real_root_loads_a_library() {
        let dir = tempfile::tempdir().unwrap();
        let libraries = libraries(dir.path());
        let root = std::path::Path::new;
        assert!(NvmlGpuLibrary::for_root(root("/tmp/host"), &libraries).is_none());
        assert!(NvmlGpuLibrary::for_root(root("/"), &libraries).is_some());
        assert!(NvmlGpuLibrary::for_root(root("/"), &libraries[..1]).is_none());
    }
}
