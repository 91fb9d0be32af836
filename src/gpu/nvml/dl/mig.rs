//! MIG instance teardown: compute instances first, then GPU instances (nvidia-smi
//! `mig -dci` then `-dgi`; NVML refuses to destroy a GPU instance that still has
//! compute instances).

use std::ffi::{c_uint, CStr};

use super::{
    check, optional, static_name, DlNvml, Handle, Ret, COMPUTE_ENGINE_PROFILE_SHARED,
    COMPUTE_INSTANCE_PROFILE_COUNT, ERROR_NOT_SUPPORTED, GPU_INSTANCE_PROFILE_COUNT, INFO_WORDS,
    MIG_ENABLE, SUCCESS,
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
            if unsafe { info(dev, profile, words.as_mut_ptr()) } != SUCCESS {
                continue; // a profile this GPU does not have
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
            if code != SUCCESS {
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
