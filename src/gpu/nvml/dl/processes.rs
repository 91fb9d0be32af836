//! The running-process queries (`nvmlDeviceGet{Compute,Graphics}RunningProcesses`).
//!
//! nvml.h declares `nvmlProcessInfo_v2_t` (24 bytes) for the `_v2` and `_v3`
//! calls, but the `_v3` of some R535 drivers writes entries with a trailing
//! `usedGpuCcProtectedMemory` (32 bytes): those export
//! `nvmlDeviceGetConfComputeMemSizeInfo` and not yet
//! `nvmlDeviceGetRunningProcessDetailList`, which later drivers replaced it
//! with. The buffer is sized for the wider entry whatever the driver, so no
//! driver can write past it, and read with the stride the symbols point to.

use std::ffi::{c_uint, c_void, CStr};

use super::{check, reason, static_name, DlNvml, Handle, Ret, ERROR_INSUFFICIENT_SIZE};
use crate::gpu::nvml::NvmlError;

/// `nvmlProcessInfo_v2_t`: pid, pad, usedGpuMemory, gpuInstanceId, computeInstanceId.
const NARROW: usize = 24;
/// The same with `usedGpuCcProtectedMemory` after it.
const WIDE: usize = 32;

impl DlNvml {
    /// The entry size the driver's `_v3` query writes.
    fn process_stride(&self, v3: bool) -> usize {
        let has = |name: &'static CStr| self.sym::<unsafe extern "C" fn()>(name, "-").is_ok();
        if v3
            && has(c"nvmlDeviceGetConfComputeMemSizeInfo")
            && !has(c"nvmlDeviceGetRunningProcessDetailList")
        {
            WIDE
        } else {
            NARROW
        }
    }

    pub(super) fn process_list(
        &self,
        dev: Handle,
        uuid: &str,
        v3: &'static CStr,
        v2: &'static CStr,
    ) -> Result<Vec<u32>, NvmlError> {
        type F = unsafe extern "C" fn(Handle, *mut c_uint, *mut c_void) -> Ret;
        let (name, f, is_v3) = match self.sym::<F>(v3, uuid) {
            Ok(f) => (v3, f, true),
            Err(_) => (v2, self.sym::<F>(v2, uuid)?, false),
        };
        let stride = self.process_stride(is_v3);
        let mut entries = 64usize;
        for _ in 0..4 {
            // u64 words: aligned for the entries' 8-byte fields.
            let mut buf = vec![0u64; entries * WIDE / 8];
            let mut count = entries as c_uint;
            // SAFETY: room for `count` entries of the widest layout any driver writes.
            let code = unsafe { f(dev, &mut count, buf.as_mut_ptr().cast()) };
            if code == ERROR_INSUFFICIENT_SIZE {
                entries = room_for(count);
                continue;
            }
            check(static_name(name), uuid, code)?;
            let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
            return Ok(pids(&bytes, (count as usize).min(entries), stride));
        }
        Err(NvmlError::Call {
            call: static_name(name),
            uuid: uuid.to_string(),
            code: ERROR_INSUFFICIENT_SIZE,
            reason: reason(ERROR_INSUFFICIENT_SIZE),
        })
    }
}

/// Most processes asked for on one GPU: a driver reporting more (a broken
/// one) gets no larger buffer, and the call then fails after its tries, so
/// the GPU's users stay unknown rather than the process aborting on an
/// allocation it cannot make.
const MAX_PROCESSES: usize = 1 << 16;

/// Entries to make room for when the driver says `count` processes: a few
/// more, for those started meanwhile, within [`MAX_PROCESSES`].
fn room_for(count: c_uint) -> usize {
    (count as usize).min(MAX_PROCESSES) + 16
}

/// The pid (the leading `unsigned int`) of each of `count` entries `stride`
/// bytes apart.
fn pids(buf: &[u8], count: usize, stride: usize) -> Vec<u32> {
    buf.chunks_exact(stride)
        .take(count)
        .map(|e| u32::from_ne_bytes([e[0], e[1], e[2], e[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(pids: &[u32], stride: usize) -> Vec<u8> {
        let mut buf = vec![0xeeu8; pids.len() * stride + 64];
        for (i, pid) in pids.iter().enumerate() {
            buf[i * stride..i * stride + 4].copy_from_slice(&pid.to_ne_bytes());
        }
        buf
    }

    /// A driver library as the R535 ones behave, or as nvml.h says
    /// (`wide` false): 70 compute processes, more than the first buffer holds
    /// (so the call asks for a larger one), and one graphics process.
    fn stand_in(dir: &std::path::Path, wide: bool) -> std::path::PathBuf {
        let cc_field = if wide { "unsigned long long cc;" } else { "" };
        let conf = if wide {
            "int nvmlDeviceGetConfComputeMemSizeInfo(void) { return 0; }"
        } else {
            ""
        };
        let source = format!(
            r#"typedef struct {{ unsigned int pid; unsigned long long mem; unsigned int gi, ci; {cc_field} }} info;
int nvmlInit_v2(void) {{ return 0; }}
int nvmlShutdown(void) {{ return 0; }}
int nvmlDeviceGetHandleByUUID(const char *u, void **d) {{ *d = (void *)1; return 0; }}
{conf}
static int fill(unsigned int *n, info *p, unsigned int want, unsigned int first) {{
    if (*n < want) {{ *n = want; return 7; }}
    for (unsigned int i = 0; i < want; i++) {{
        p[i].pid = first + i; p[i].mem = ~0ULL; p[i].gi = ~0U; p[i].ci = ~0U;
    }}
    *n = want;
    return 0;
}}
int nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned int *n, info *p) {{ return fill(n, p, 70, 1000); }}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *d, unsigned int *n, info *p) {{ return fill(n, p, 1, 5000); }}
"#
        );
        let name = if wide { "libwide.so" } else { "libnarrow.so" };
        crate::fixture::build_c_library(dir, name, &source).unwrap()
    }

    /// Through `dlopen`, as on a node: every pid read back whichever layout
    /// the library writes.
    #[test]
    fn a_driver_library_of_either_layout_gives_its_pids() {
        use crate::gpu::nvml::Nvml;
        let dir = tempfile::tempdir().unwrap();
        let mut want: Vec<u32> = (1000..1070).collect();
        want.push(5000);
        for wide in [false, true] {
            let lib = stand_in(dir.path(), wide);
            let nvml = DlNvml::open(lib.to_str().unwrap()).unwrap();
            assert_eq!(nvml.processes("GPU-x").unwrap(), want, "wide {wide}");
        }
    }

    /// A compute-only GPU answers NOT_SUPPORTED (3) for its graphics list:
    /// the compute pids still count. Both unsupported lists no processes;
    /// any other error is one.
    #[test]
    fn one_unsupported_list_keeps_the_other() {
        use crate::gpu::nvml::Nvml;
        let dir = tempfile::tempdir().unwrap();
        let processes = |name: &str, compute: u32, graphics: u32| {
            let source = format!(
                r#"typedef struct {{ unsigned int pid; unsigned long long mem; unsigned int gi, ci; }} info;
int nvmlInit_v2(void) {{ return 0; }}
int nvmlShutdown(void) {{ return 0; }}
int nvmlDeviceGetHandleByUUID(const char *u, void **d) {{ *d = (void *)1; return 0; }}
int nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned int *n, info *p) {{
    if ({compute}) return {compute};
    p[0].pid = 4242; *n = 1; return 0;
}}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *d, unsigned int *n, info *p) {{
    if ({graphics}) return {graphics};
    *n = 0; return 0;
}}
"#
            );
            let sub = dir.path().join(name);
            std::fs::create_dir(&sub).unwrap();
            let lib = crate::fixture::build_c_library(&sub, "libnvml.so", &source).unwrap();
            DlNvml::open(lib.to_str().unwrap())
                .unwrap()
                .processes("GPU-x")
        };
        assert_eq!(processes("gfx", 0, 3).unwrap(), vec![4242]);
        assert!(matches!(
            processes("none", 3, 3),
            Err(NvmlError::NotSupported { .. })
        ));
        assert!(matches!(
            processes("error", 0, 999),
            Err(NvmlError::Call { code: 999, .. })
        ));
    }

    #[test]
    fn both_entry_layouts_give_their_pids() {
        for stride in [NARROW, WIDE] {
            let buf = entries(&[41, 42, 4_000_000], stride);
            assert_eq!(pids(&buf, 3, stride), [41, 42, 4_000_000], "{stride}");
            assert_eq!(pids(&buf, 1, stride), [41]);
        }
        assert!(pids(&[], 5, NARROW).is_empty());
    }

    /// The room asked for follows the driver's count, within a bound.
    #[test]
    fn room_for_processes_is_bounded() {
        assert_eq!(super::room_for(3), 19);
        assert_eq!(super::room_for(c_uint::MAX), super::MAX_PROCESSES + 16);
    }
}
