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

/// What NVML says of the GPU at one PCI address.
struct BusFacts {
    uuid: String,
    index: u32,
    total: u64,
}

impl DlNvml {
    /// NVML's UUID, index and total memory of the GPU at PCI address `bus`.
    fn gpu_facts(&self, bus: &str) -> Result<BusFacts, NvmlError> {
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
        let uuid = self.uuid_of(dev)?;
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
        Ok(BusFacts {
            uuid,
            index,
            total: memory.total,
        })
    }
}

/// NVML as inventory's GPU library. It answers for a GPU only where NVML
/// names the GPU at that bus id as the host root does: the machine's own root
/// (`/`, or `/host` in the DaemonSet) agrees, and a simulated one read on a
/// machine with GPUs never takes the real driver's view.
pub struct NvmlGpuLibrary(DlNvml);

impl NvmlGpuLibrary {
    /// The first of `libraries` that loads; `None` when none does (absent is
    /// normal on nodes without the driver).
    pub fn open(libraries: &[String]) -> Option<NvmlGpuLibrary> {
        libraries.iter().find_map(|library| {
            DlNvml::open(library)
                .map(NvmlGpuLibrary)
                .map_err(|e| tracing::debug!(error = %nri::ErrorChain(&e), "no nvml for inventory"))
                .ok()
        })
    }
}

impl GpuLibrary for NvmlGpuLibrary {
    fn gpu(&self, bus_id: PciAddr, uuid: &str) -> Option<GpuFacts> {
        match self.0.gpu_facts(&bus_id.to_string()) {
            Ok(facts) if !facts.uuid.eq_ignore_ascii_case(uuid) => {
                tracing::warn!(gpu = %bus_id, uuid, nvml_uuid = %facts.uuid, "nvml names another gpu at this bus id: its facts not taken");
                None
            }
            Ok(facts) => Some(GpuFacts {
                index: Some(facts.index),
                memory_bytes: Some(facts.total),
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

    /// The first library that loads, whatever the root: which GPUs it
    /// answers for is decided per GPU.
    #[test]
    fn the_first_library_that_loads_opens() {
        let dir = tempfile::tempdir().unwrap();
        let libraries = libraries(dir.path());
        assert!(NvmlGpuLibrary::open(&libraries).is_some());
        assert!(NvmlGpuLibrary::open(&libraries[..1]).is_none());
    }

    /// An NVML knowing two GPUs at the fixture's first two bus ids: the first
    /// under the fixture's UUID, the second under another GPU's.
    fn nvml_of(dir: &std::path::Path, gpus: &[crate::inventory::Gpu]) -> NvmlGpuLibrary {
        let (a, b) = (&gpus[0], &gpus[1]);
        let source = format!(
            r#"
#include <string.h>
typedef struct {{ unsigned long long total, free, used; }} mem;
int nvmlInit_v2(void) {{ return 0; }}
int nvmlShutdown(void) {{ return 0; }}
int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **d) {{
    if (!strcmp(bus, "{}")) {{ *d = (void *)1; return 0; }}
    if (!strcmp(bus, "{}")) {{ *d = (void *)2; return 0; }}
    return 6;
}}
int nvmlDeviceGetUUID(void *d, char *buf, unsigned int n) {{
    strncpy(buf, d == (void *)1 ? "{}" : "GPU-00000000-0000-0000-0000-000000000000", n);
    return 0;
}}
int nvmlDeviceGetIndex(void *d, unsigned int *i) {{ *i = d == (void *)1 ? 7 : 8; return 0; }}
int nvmlDeviceGetMemoryInfo(void *d, mem *m) {{ m->total = 80ULL << 30; return 0; }}
"#,
            a.bus_id, b.bus_id, a.uuid
        );
        let lib = crate::fixture::build_c_library(dir, "libnvml-two.so", &source).unwrap();
        NvmlGpuLibrary::open(&[lib.to_string_lossy().into_owned()]).unwrap()
    }

    /// NVML's index and memory are taken for a GPU it names as the host
    /// root does, at any root (the DaemonSet reads `/host`); a GPU NVML
    /// names otherwise at that bus id (a simulated root on a machine with
    /// GPUs of its own) keeps what the root says.
    #[test]
    fn facts_are_taken_only_for_the_gpu_the_root_names() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = crate::fixture::HostRootBuilder::hgx()
            .gpus(2)
            .build(&dir.path().join("host"))
            .unwrap();
        let plain = crate::inventory::discover(fixture.root());
        let nvml = nvml_of(dir.path(), &plain.gpus);
        let inv = crate::inventory::discover_with(fixture.root(), &nvml);
        let (a, b) = (&inv.gpus[0], &inv.gpus[1]);
        assert_eq!((a.index, a.memory_bytes), (7, Some(80 << 30)));
        // Unknown to this NVML: numbered after its indices, memory unknown.
        assert_eq!((b.index, b.memory_bytes), (8, None));
    }
}
