//! MIG instance teardown: compute instances first, then GPU instances (nvidia-smi
//! `mig -dci` then `-dgi`; NVML refuses to destroy a GPU instance that still has
//! compute instances).

use std::ffi::{c_uint, CStr};

use super::{
    check, optional, static_name, DlNvml, Handle, Ret, COMPUTE_ENGINE_PROFILE_SHARED,
    COMPUTE_INSTANCE_PROFILE_COUNT, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED,
    GPU_INSTANCE_PROFILE_COUNT, INFO_WORDS, MIG_ENABLE, SUCCESS,
};
use crate::gpu::nvml::{MigDestroyed, NvmlError};

impl DlNvml {
    pub(super) fn mig_mode(&self, uuid: &str) -> Result<bool, NvmlError> {
        let dev = self.device(uuid)?;
        let f: unsafe extern "C" fn(Handle, *mut c_uint, *mut c_uint) -> Ret =
            self.sym(c"nvmlDeviceGetMigMode", uuid)?;
        let (mut current, mut pending) = (0, 0);
        // SAFETY: out pointers to locals.
        let code = unsafe { f(dev, &mut current, &mut pending) };
        Ok(optional("nvmlDeviceGetMigMode", uuid, code)? && current == MIG_ENABLE)
    }

    pub(super) fn destroy_all(&self, uuid: &str) -> Result<MigDestroyed, NvmlError> {
        let dev = self.device(uuid)?;
        let mut done = MigDestroyed::default();
        for gi in self.gpu_instances(dev, uuid)? {
            for ci in self.compute_instances(gi, uuid)? {
                self.destroy(c"nvmlComputeInstanceDestroy", uuid, ci)?;
                done.compute_instances += 1;
            }
            self.destroy(c"nvmlGpuInstanceDestroy", uuid, gi)?;
            done.gpu_instances += 1;
        }
        // Listed again: the GPU goes to the next pod only without the last
        // one's instances, whatever the calls above answered.
        let left = self.gpu_instances(dev, uuid)?.len();
        if left > 0 {
            return Err(NvmlError::MigLeft {
                uuid: uuid.to_string(),
                left,
            });
        }
        Ok(done)
    }

    fn gpu_instances(&self, dev: Handle, uuid: &str) -> Result<Vec<Handle>, NvmlError> {
        type Info = unsafe extern "C" fn(Handle, c_uint, *mut c_uint) -> Ret;
        type List = unsafe extern "C" fn(Handle, c_uint, *mut Handle, *mut c_uint) -> Ret;
        let info: Info = self.sym(c"nvmlDeviceGetGpuInstanceProfileInfo", uuid)?;
        let list: List = self.sym(c"nvmlDeviceGetGpuInstances", uuid)?;
        let mut out = Vec::new();
        for profile in 0..GPU_INSTANCE_PROFILE_COUNT {
            let mut words = [0 as c_uint; INFO_WORDS];
            // SAFETY: the buffer is larger than nvmlGpuInstanceProfileInfo_t.
            let code = unsafe { info(dev, profile, words.as_mut_ptr()) };
            if !profile_here("nvmlDeviceGetGpuInstanceProfileInfo", uuid, code)? {
                continue;
            }
            // Fields: id, isP2pSupported, sliceCount, instanceCount, ...
            let (id, capacity) = (words[0], words[3].clamp(1, 64));
            out.extend(
                self.fill(uuid, "nvmlDeviceGetGpuInstances", capacity, |buf, n| {
                    // SAFETY: `n` points at the buffer's length.
                    unsafe { list(dev, id, buf, n) }
                })?,
            );
        }
        Ok(out)
    }

    fn compute_instances(&self, gi: Handle, uuid: &str) -> Result<Vec<Handle>, NvmlError> {
        type Info = unsafe extern "C" fn(Handle, c_uint, c_uint, *mut c_uint) -> Ret;
        type List = unsafe extern "C" fn(Handle, c_uint, *mut Handle, *mut c_uint) -> Ret;
        let info: Info = self.sym(c"nvmlGpuInstanceGetComputeInstanceProfileInfo", uuid)?;
        let list: List = self.sym(c"nvmlGpuInstanceGetComputeInstances", uuid)?;
        let mut out = Vec::new();
        for profile in 0..COMPUTE_INSTANCE_PROFILE_COUNT {
            let mut words = [0 as c_uint; INFO_WORDS];
            // SAFETY: the buffer is larger than nvmlComputeInstanceProfileInfo_t.
            let code = unsafe {
                info(
                    gi,
                    profile,
                    COMPUTE_ENGINE_PROFILE_SHARED,
                    words.as_mut_ptr(),
                )
            };
            if !profile_here("nvmlGpuInstanceGetComputeInstanceProfileInfo", uuid, code)? {
                continue;
            }
            // Fields: id, sliceCount, instanceCount, ...
            let (id, capacity) = (words[0], words[2].clamp(1, 64));
            out.extend(self.fill(
                uuid,
                "nvmlGpuInstanceGetComputeInstances",
                capacity,
                |buf, n| {
                    // SAFETY: `n` points at the buffer's length.
                    unsafe { list(gi, id, buf, n) }
                },
            )?);
        }
        Ok(out)
    }

    /// Runs a `(buffer, count)` list call into a buffer of `capacity` handles.
    fn fill(
        &self,
        uuid: &str,
        call: &'static str,
        capacity: c_uint,
        f: impl FnOnce(*mut Handle, *mut c_uint) -> Ret,
    ) -> Result<Vec<Handle>, NvmlError> {
        let mut buf: Vec<Handle> = vec![std::ptr::null_mut(); capacity as usize];
        let mut count = capacity;
        match f(buf.as_mut_ptr(), &mut count) {
            ERROR_NOT_SUPPORTED => return Ok(Vec::new()),
            code => check(call, uuid, code)?,
        }
        buf.truncate((count as usize).min(capacity as usize));
        Ok(buf)
    }

    fn destroy(&self, name: &'static CStr, uuid: &str, handle: Handle) -> Result<(), NvmlError> {
        let f: unsafe extern "C" fn(Handle) -> Ret = self.sym(name, uuid)?;
        // SAFETY: a handle NVML returned.
        check(static_name(name), uuid, unsafe { f(handle) })
    }
}

/// Whether a profile info call found the profile: NOT_SUPPORTED and
/// INVALID_ARGUMENT are nvml.h's answers for a profile this GPU does not
/// have. Any other failure is an error: a teardown that skipped a profile it
/// could not read would hand the GPU on with the last pod's instances.
fn profile_here(call: &'static str, uuid: &str, code: Ret) -> Result<bool, NvmlError> {
    match code {
        SUCCESS => Ok(true),
        ERROR_NOT_SUPPORTED | ERROR_INVALID_ARGUMENT => Ok(false),
        code => check(call, uuid, code).map(|()| true),
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_int;

    use crate::gpu::nvml::{Nvml, NvmlError};

    /// One GPU with one GPU instance of profile 0 and no compute instance.
    /// `test_mode`: 0 as a driver does; 1 the profile info fails (999); 2
    /// destroying answers success and leaves the instance.
    const SOURCE: &str = r#"
static int mode = 0, live = 1;
void test_mode(int m) { mode = m; live = 1; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetHandleByUUID(const char *u, void **d) { *d = (void *)1; return 0; }
int nvmlDeviceGetGpuInstanceProfileInfo(void *d, unsigned int p, unsigned int *info) {
    if (p != 0) return 3;
    if (mode == 1) return 999;
    info[0] = 0; info[3] = 2;
    return 0;
}
int nvmlDeviceGetGpuInstances(void *d, unsigned int id, void **buf, unsigned int *n) {
    if (live) buf[0] = (void *)100;
    *n = live;
    return 0;
}
int nvmlGpuInstanceGetComputeInstanceProfileInfo(void *g, unsigned int p, unsigned int e, unsigned int *info) { return 3; }
int nvmlGpuInstanceGetComputeInstances(void *g, unsigned int id, void **buf, unsigned int *n) { *n = 0; return 0; }
int nvmlGpuInstanceDestroy(void *g) { if (mode != 2) live = 0; return 0; }
int nvmlComputeInstanceDestroy(void *c) { return 0; }
"#;

    /// Instances are destroyed and none is left; a profile that cannot be
    /// read, or an instance still listed after its destroy, fails the
    /// teardown instead of handing the GPU on with them.
    #[test]
    fn a_mig_teardown_fails_where_it_cannot_vouch_for_no_instance_left() {
        let dir = tempfile::tempdir().unwrap();
        let lib = crate::fixture::build_c_library(dir.path(), "libmig.so", SOURCE).unwrap();
        let nvml = super::DlNvml::open(lib.to_str().unwrap()).unwrap();
        let mode: unsafe extern "C" fn(c_int) = nvml.sym(c"test_mode", "-").unwrap();
        let gpu = "GPU-1";
        let done = nvml.destroy_mig_instances(gpu).unwrap();
        assert_eq!((done.gpu_instances, done.compute_instances), (1, 0));
        assert_eq!(nvml.destroy_mig_instances(gpu).unwrap().gpu_instances, 0);
        // SAFETY: the stub's setter, an int.
        unsafe { mode(1) };
        let err = nvml.destroy_mig_instances(gpu).unwrap_err();
        assert!(
            err.to_string()
                .contains("nvmlDeviceGetGpuInstanceProfileInfo"),
            "{err}"
        );
        // SAFETY: as above.
        unsafe { mode(2) };
        let err = nvml.destroy_mig_instances(gpu).unwrap_err();
        assert!(matches!(err, NvmlError::MigLeft { left: 1, .. }), "{err}");
    }
}
