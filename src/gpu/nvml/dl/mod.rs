//! NVML through `dlopen(3)`: no link-time dependency, so the binaries run on nodes
//! without the driver. Signatures and struct layouts follow nvml.h (NVIDIA/go-nvml
//! `gen/nvml/nvml.h`); every symbol is looked up when called, so an older driver
//! missing one yields `NotSupported` for that call only.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};
use std::sync::Mutex;
use std::time::Duration;

mod facts;
mod health;
mod mig;
mod processes;

pub use facts::NvmlGpuLibrary;

use super::{ComputeMode, EventWait, MemoryHealth, MigDestroyed, Nvml, NvmlError, Unwatched};

type Handle = *mut c_void;
type Ret = c_int;

const SUCCESS: Ret = 0;
const ERROR_INVALID_ARGUMENT: Ret = 2;
const ERROR_NOT_SUPPORTED: Ret = 3;
const ERROR_INSUFFICIENT_SIZE: Ret = 7;
const ERROR_TIMEOUT: Ret = 10;
const ERROR_FUNCTION_NOT_FOUND: Ret = 13;
const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
const EVENT_XID_CRITICAL: u64 = 0x8;
const MIG_ENABLE: c_uint = 1;
const GPU_INSTANCE_PROFILE_COUNT: c_uint = 0x12;
const COMPUTE_INSTANCE_PROFILE_COUNT: c_uint = 0x9;
const COMPUTE_ENGINE_PROFILE_SHARED: c_uint = 0;
const UUID_BUFFER: usize = 96;
/// Profile info structs are read only for their leading `u32` fields (id, counts); a
/// buffer larger than any version of them keeps the library from writing past it.
const INFO_WORDS: usize = 64;

/// `nvmlEventData_t`.
#[repr(C)]
struct EventData {
    device: Handle,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// The loaded library, initialised. NVML is thread-safe (nvml.h, "Thread safety").
pub struct DlNvml {
    lib: Handle,
    events: Mutex<Option<EventSet>>,
    /// `nvmlInit_v2` succeeded: NVML counts inits per process, and a
    /// shutdown without its init would end another instance's.
    initialised: bool,
}

struct EventSet {
    set: Handle,
    /// GPUs that report events but failed to register (a GPU briefly busy,
    /// a driver call that failed), by index: tried again at each wait.
    unwatched: Vec<(c_uint, Unwatched)>,
}

// SAFETY: both are opaque handles NVML allows on any thread.
unsafe impl Send for DlNvml {}
unsafe impl Sync for DlNvml {}
unsafe impl Send for EventSet {}

impl DlNvml {
    /// Opens `library` and calls `nvmlInit_v2`.
    pub fn open(library: &str) -> Result<DlNvml, NvmlError> {
        let load = |reason: String| NvmlError::Load {
            library: library.to_string(),
            reason,
        };
        // A statically linked program (install/build.sh's devgate-hook)
        // would map a second C library, the host's, under NVML.
        if cfg!(target_feature = "crt-static") {
            return Err(load("a statically linked program cannot load it".into()));
        }
        let name = CString::new(library).map_err(|e| load(e.to_string()))?;
        // SAFETY: a valid C string; RTLD_LOCAL keeps its symbols out of the process.
        let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(load(dl_error()));
        }
        let mut nvml = DlNvml {
            lib,
            events: Mutex::new(None),
            initialised: false,
        };
        let init: unsafe extern "C" fn() -> Ret = nvml.sym(c"nvmlInit_v2", "-")?;
        // SAFETY: nvmlInit_v2 takes no arguments.
        let code = unsafe { init() };
        if code != SUCCESS {
            return Err(load(format!("nvmlInit_v2: {} (code {code})", reason(code))));
        }
        nvml.initialised = true;
        Ok(nvml)
    }

    /// A function of the library. `F` must be the `unsafe extern "C" fn` type nvml.h
    /// declares for `name`.
    fn sym<F: Copy>(&self, name: &'static CStr, uuid: &str) -> Result<F, NvmlError> {
        // SAFETY: `lib` is a live handle and `name` a C string.
        let ptr = unsafe { libc::dlsym(self.lib, name.as_ptr()) };
        if ptr.is_null() || size_of::<F>() != size_of::<*mut c_void>() {
            return Err(NvmlError::NotSupported {
                call: static_name(name),
                uuid: uuid.to_string(),
            });
        }
        // SAFETY: same size, and the caller names the declared signature.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&ptr) })
    }

    fn device(&self, uuid: &str) -> Result<Handle, NvmlError> {
        let f: unsafe extern "C" fn(*const c_char, *mut Handle) -> Ret =
            self.sym(c"nvmlDeviceGetHandleByUUID", uuid)?;
        let text = CString::new(uuid).map_err(|_| NvmlError::Call {
            call: "nvmlDeviceGetHandleByUUID",
            uuid: uuid.to_string(),
            code: 2,
            reason: "invalid argument",
        })?;
        let mut dev: Handle = std::ptr::null_mut();
        // SAFETY: valid string and out pointer.
        check("nvmlDeviceGetHandleByUUID", uuid, unsafe {
            f(text.as_ptr(), &mut dev)
        })?;
        Ok(dev)
    }

    /// Calls a `fn(device) -> Ret` function.
    fn device_call(&self, name: &'static CStr, uuid: &str) -> Result<(), NvmlError> {
        let dev = self.device(uuid)?;
        let f: unsafe extern "C" fn(Handle) -> Ret = self.sym(name, uuid)?;
        // SAFETY: a handle from NVML.
        check(static_name(name), uuid, unsafe { f(dev) })
    }

    fn device_set(&self, name: &'static CStr, uuid: &str, value: c_uint) -> Result<(), NvmlError> {
        let dev = self.device(uuid)?;
        let f: unsafe extern "C" fn(Handle, c_uint) -> Ret = self.sym(name, uuid)?;
        // SAFETY: a handle from NVML and an enum value nvml.h defines.
        check(static_name(name), uuid, unsafe { f(dev, value) })
    }
}

impl Drop for DlNvml {
    fn drop(&mut self) {
        self.drop_event_set();
        // SAFETY: the library handle is live; nothing else uses it once we are dropped.
        unsafe {
            if let (true, Ok(shutdown)) = (
                self.initialised,
                self.sym::<unsafe extern "C" fn() -> Ret>(c"nvmlShutdown", "-"),
            ) {
                shutdown();
            }
            libc::dlclose(self.lib);
        }
    }
}

impl Nvml for DlNvml {
    fn present(&self) -> bool {
        true
    }

    fn processes(&self, uuid: &str) -> Result<Vec<u32>, NvmlError> {
        let dev = self.device(uuid)?;
        let compute = self.process_list(
            dev,
            uuid,
            c"nvmlDeviceGetComputeRunningProcesses_v3",
            c"nvmlDeviceGetComputeRunningProcesses_v2",
        );
        let graphics = self.process_list(
            dev,
            uuid,
            c"nvmlDeviceGetGraphicsRunningProcesses_v3",
            c"nvmlDeviceGetGraphicsRunningProcesses_v2",
        );
        // A GPU without graphics (or compute) support answers NOT_SUPPORTED
        // for that list alone: the other still counts. Only both unsupported
        // is "lists no processes"; any other error is one.
        let unsupported =
            |r: &Result<Vec<u32>, NvmlError>| matches!(r, Err(NvmlError::NotSupported { .. }));
        if unsupported(&compute) && unsupported(&graphics) {
            return compute;
        }
        let mut pids = Vec::new();
        for list in [compute, graphics] {
            match list {
                Ok(found) => pids.extend(found),
                Err(NvmlError::NotSupported { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    fn reset_application_clocks(&self, uuid: &str) -> Result<(), NvmlError> {
        self.device_call(c"nvmlDeviceResetApplicationsClocks", uuid)
    }

    /// Both locks reset, whichever the GPU lacks: one it does not support
    /// (memory clock locks came with Ampere) must not keep the other locked.
    fn reset_locked_clocks(&self, uuid: &str) -> Result<(), NvmlError> {
        let gpu = self.device_call(c"nvmlDeviceResetGpuLockedClocks", uuid);
        let memory = self.device_call(c"nvmlDeviceResetMemoryLockedClocks", uuid);
        match (gpu, memory) {
            (Err(e), _) | (_, Err(e)) if !matches!(e, NvmlError::NotSupported { .. }) => Err(e),
            // Past the arm above, an error is NOT_SUPPORTED: both, and the
            // GPU has neither lock.
            (Err(e), Err(_)) => Err(e),
            _ => Ok(()),
        }
    }

    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), NvmlError> {
        self.device_set(c"nvmlDeviceSetComputeMode", uuid, mode as c_uint)
    }

    fn set_persistence(&self, uuid: &str, enabled: bool) -> Result<(), NvmlError> {
        self.device_set(c"nvmlDeviceSetPersistenceMode", uuid, enabled as c_uint)
    }

    fn mig_enabled(&self, uuid: &str) -> Result<bool, NvmlError> {
        self.mig_mode(uuid)
    }

    fn destroy_mig_instances(&self, uuid: &str) -> Result<MigDestroyed, NvmlError> {
        self.destroy_all(uuid)
    }

    fn wait_events(&self, timeout: Duration) -> Result<EventWait, NvmlError> {
        self.wait(timeout)
    }

    fn memory_health(&self, uuid: &str) -> Result<MemoryHealth, NvmlError> {
        self.memory(uuid)
    }
}

fn static_name(name: &'static CStr) -> &'static str {
    name.to_str().unwrap_or("nvml")
}

fn check(call: &'static str, uuid: &str, code: Ret) -> Result<(), NvmlError> {
    match code {
        SUCCESS => Ok(()),
        ERROR_NOT_SUPPORTED | ERROR_FUNCTION_NOT_FOUND => Err(NvmlError::NotSupported {
            call,
            uuid: uuid.to_string(),
        }),
        code => Err(NvmlError::Call {
            call,
            uuid: uuid.to_string(),
            code,
            reason: reason(code),
        }),
    }
}

/// `Ok(false)` for "not supported", so optional readings can be skipped.
fn optional(call: &'static str, uuid: &str, code: Ret) -> Result<bool, NvmlError> {
    match check(call, uuid, code) {
        Ok(()) => Ok(true),
        Err(NvmlError::NotSupported { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn events_check(call: &'static str, code: Ret) -> Result<(), NvmlError> {
    if code == SUCCESS {
        return Ok(());
    }
    Err(NvmlError::Events {
        call,
        code,
        reason: reason(code),
    })
}

/// nvmlReturn_t names (nvml.h), lower-case.
fn reason(code: Ret) -> &'static str {
    match code {
        1 => "uninitialized",
        2 => "invalid argument",
        3 => "not supported",
        4 => "no permission",
        6 => "not found",
        7 => "insufficient size",
        9 => "driver not loaded",
        10 => "timeout",
        12 => "library not found",
        13 => "function not found",
        15 => "gpu is lost",
        16 => "gpu requires reset",
        19 => "in use",
        _ => "unknown error",
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return "dlopen failed".to_string();
    }
    // SAFETY: non-null, NUL-terminated.
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed init is not followed by a shutdown: NVML counts them per
    /// process, and the extra one would end a live instance's.
    #[test]
    fn a_failed_init_is_not_shut_down() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("shutdowns");
        let source = |init: u32| {
            format!(
                r#"#include <stdio.h>
int nvmlInit_v2(void) {{ return {init}; }}
int nvmlShutdown(void) {{ FILE *f = fopen("{}", "a"); if (f) {{ fputs("x", f); fclose(f); }} return 0; }}
"#,
                mark.display()
            )
        };
        for (name, init, want) in [("fails", 9, ""), ("works", 0, "x")] {
            let sub = dir.path().join(name);
            std::fs::create_dir(&sub).unwrap();
            let lib = crate::fixture::build_c_library(&sub, "libnvml.so", &source(init)).unwrap();
            let opened = DlNvml::open(lib.to_str().unwrap());
            assert_eq!(opened.is_ok(), init == 0);
            drop(opened);
            let shutdowns = std::fs::read_to_string(&mark).unwrap_or_default();
            assert_eq!(shutdowns, want, "{name}");
        }
    }

    /// A GPU without GPU clock locks (NOT_SUPPORTED) still has its memory
    /// clock lock reset; a real failure of either fails the reset.
    #[test]
    fn each_clock_lock_is_reset_whichever_the_gpu_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("memory-reset");
        let source = |gpu: i32, memory: i32| {
            format!(
                r#"#include <stdio.h>
int nvmlInit_v2(void) {{ return 0; }}
int nvmlShutdown(void) {{ return 0; }}
int nvmlDeviceGetHandleByUUID(const char *u, void **d) {{ *d = (void *)1; return 0; }}
int nvmlDeviceResetGpuLockedClocks(void *d) {{ return {gpu}; }}
int nvmlDeviceResetMemoryLockedClocks(void *d) {{ FILE *f = fopen("{}", "a"); if (f) {{ fputs("x", f); fclose(f); }} return {memory}; }}
"#,
                mark.display()
            )
        };
        // (gpu lock's answer, memory lock's, reset ok, not supported)
        for (gpu, memory, ok, unsupported) in [
            (3, 0, true, false),
            (0, 3, true, false),
            (3, 3, false, true),
            (999, 0, false, false),
            (0, 999, false, false),
        ] {
            let sub = dir.path().join(format!("{gpu}-{memory}"));
            std::fs::create_dir(&sub).unwrap();
            let lib =
                crate::fixture::build_c_library(&sub, "libnvml.so", &source(gpu, memory)).unwrap();
            let nvml = DlNvml::open(lib.to_str().unwrap()).unwrap();
            let _ = std::fs::remove_file(&mark);
            let reset = nvml.reset_locked_clocks("GPU-1");
            assert_eq!(reset.is_ok(), ok, "{gpu} {memory}: {reset:?}");
            let not_supported = matches!(reset, Err(NvmlError::NotSupported { .. }));
            assert_eq!(not_supported, unsupported, "{gpu} {memory}: {reset:?}");
            assert!(
                mark.exists(),
                "{gpu} {memory}: the memory lock was not reset"
            );
        }
    }
}
