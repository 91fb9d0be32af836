//! Health through NVML: XID and double-bit ECC events, memory readings.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CStr};
use std::time::Duration;

use super::{
    check, events_check, optional, static_name, DlNvml, EventData, EventSet, Handle, Ret,
    ERROR_TIMEOUT, EVENT_DOUBLE_BIT_ECC, EVENT_XID_CRITICAL, SUCCESS, UUID_BUFFER,
};
use crate::gpu::nvml::{EventKind, GpuEvent, MemoryHealth, NvmlError};

impl DlNvml {
    pub(super) fn wait(&self, timeout: Duration) -> Result<Vec<GpuEvent>, NvmlError> {
        let set = self.event_set()?;
        let wait: unsafe extern "C" fn(Handle, *mut EventData, c_uint) -> Ret =
            self.sym(c"nvmlEventSetWait_v2", "-")?;
        let mut out = Vec::new();
        let mut ms = timeout.as_millis().min(u32::MAX as u128) as c_uint;
        // One event per call; drain what is queued without waiting again.
        for _ in 0..256 {
            let mut data = EventData {
                device: std::ptr::null_mut(),
                event_type: 0,
                event_data: 0,
                gpu_instance_id: 0,
                compute_instance_id: 0,
            };
            // SAFETY: a live set and an out struct of the declared layout.
            match unsafe { wait(set, &mut data, ms) } {
                ERROR_TIMEOUT => break,
                code => events_check("nvmlEventSetWait_v2", code)?,
            }
            ms = 0;
            let kind = match data.event_type {
                EVENT_XID_CRITICAL => EventKind::Xid(data.event_data),
                EVENT_DOUBLE_BIT_ECC => EventKind::DoubleBitEcc,
                _ => continue,
            };
            out.push(GpuEvent {
                uuid: self.uuid_of(data.device)?,
                kind,
            });
        }
        Ok(out)
    }

    pub(super) fn memory(&self, uuid: &str) -> Result<MemoryHealth, NvmlError> {
        let dev = self.device(uuid)?;
        let mut health = MemoryHealth {
            retired_pages_pending: self.read_u32_flag(
                c"nvmlDeviceGetRetiredPagesPendingStatus",
                dev,
                uuid,
            )?,
            ..MemoryHealth::default()
        };
        if let Ok(f) = self
            .sym::<unsafe extern "C" fn(Handle, c_int, c_int, *mut c_ulonglong) -> Ret>(
                c"nvmlDeviceGetTotalEccErrors",
                uuid,
            )
        {
            let mut n: c_ulonglong = 0;
            // UNCORRECTED = 1, VOLATILE = 0 (nvml.h nvmlMemoryErrorType_t, nvmlEccCounterType_t).
            // SAFETY: out pointer to a local.
            let code = unsafe { f(dev, 1, 0, &mut n) };
            health.dbe_volatile = optional("nvmlDeviceGetTotalEccErrors", uuid, code)?.then_some(n);
        }
        if let Ok(f) = self.sym::<unsafe extern "C" fn(
            Handle,
            *mut c_uint,
            *mut c_uint,
            *mut c_uint,
            *mut c_uint,
        ) -> Ret>(c"nvmlDeviceGetRemappedRows", uuid)
        {
            let (mut corr, mut unc, mut pending, mut failed) = (0, 0, 0, 0);
            // SAFETY: out pointers to locals.
            let code = unsafe { f(dev, &mut corr, &mut unc, &mut pending, &mut failed) };
            if optional("nvmlDeviceGetRemappedRows", uuid, code)? {
                health.remap_pending = Some(pending != 0);
                health.remap_failed = Some(failed != 0);
            }
        }
        Ok(health)
    }

    fn uuid_of(&self, dev: Handle) -> Result<String, NvmlError> {
        let f: unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> Ret =
            self.sym(c"nvmlDeviceGetUUID", "-")?;
        let mut buf = [0 as c_char; UUID_BUFFER];
        // SAFETY: the buffer has the documented size.
        check("nvmlDeviceGetUUID", "-", unsafe {
            f(dev, buf.as_mut_ptr(), UUID_BUFFER as c_uint)
        })?;
        // SAFETY: NVML NUL-terminates within the buffer.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    fn event_set(&self) -> Result<Handle, NvmlError> {
        let mut guard = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = guard.as_ref() {
            return Ok(set.0);
        }
        let set = self.register_all()?;
        *guard = Some(EventSet(set));
        Ok(set)
    }

    /// An event set with XID and double-bit ECC events of every device that supports
    /// them (k8s-device-plugin `internal/rm/health.go` does the same).
    fn register_all(&self) -> Result<Handle, NvmlError> {
        let create: unsafe extern "C" fn(*mut Handle) -> Ret =
            self.sym(c"nvmlEventSetCreate", "-")?;
        let count: unsafe extern "C" fn(*mut c_uint) -> Ret =
            self.sym(c"nvmlDeviceGetCount_v2", "-")?;
        let by_index: unsafe extern "C" fn(c_uint, *mut Handle) -> Ret =
            self.sym(c"nvmlDeviceGetHandleByIndex_v2", "-")?;
        let supported: unsafe extern "C" fn(Handle, *mut c_ulonglong) -> Ret =
            self.sym(c"nvmlDeviceGetSupportedEventTypes", "-")?;
        let register: unsafe extern "C" fn(Handle, c_ulonglong, Handle) -> Ret =
            self.sym(c"nvmlDeviceRegisterEvents", "-")?;
        let (mut set, mut n): (Handle, c_uint) = (std::ptr::null_mut(), 0);
        // SAFETY: out pointers to locals; handles come from NVML.
        unsafe {
            events_check("nvmlEventSetCreate", create(&mut set))?;
            events_check("nvmlDeviceGetCount_v2", count(&mut n))?;
            for i in 0..n {
                let mut dev: Handle = std::ptr::null_mut();
                let mut types: c_ulonglong = 0;
                if by_index(i, &mut dev) != SUCCESS || supported(dev, &mut types) != SUCCESS {
                    continue;
                }
                let wanted = types & (EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC);
                if wanted != 0 {
                    events_check("nvmlDeviceRegisterEvents", register(dev, wanted, set))?;
                }
            }
        }
        Ok(set)
    }

    fn read_u32_flag(
        &self,
        name: &'static CStr,
        dev: Handle,
        uuid: &str,
    ) -> Result<Option<bool>, NvmlError> {
        let f: unsafe extern "C" fn(Handle, *mut c_uint) -> Ret = match self.sym(name, uuid) {
            Ok(f) => f,
            Err(_) => return Ok(None),
        };
        let mut v: c_uint = 0;
        // SAFETY: out pointer to a local.
        optional(static_name(name), uuid, unsafe { f(dev, &mut v) }).map(|ok| ok.then_some(v == 1))
    }
}
