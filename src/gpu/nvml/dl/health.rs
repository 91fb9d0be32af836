//! Health through NVML: XID and double-bit ECC events, memory readings.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CStr};
use std::time::Duration;

use super::{
    check, events_check, optional, static_name, DlNvml, EventData, EventSet, Handle, Ret,
    ERROR_TIMEOUT, EVENT_DOUBLE_BIT_ECC, EVENT_XID_CRITICAL, UUID_BUFFER,
};
use crate::gpu::nvml::{EventKind, EventWait, GpuEvent, MemoryHealth, NvmlError, Unwatched};

impl DlNvml {
    pub(super) fn wait(&self, timeout: Duration) -> Result<EventWait, NvmlError> {
        let (set, unwatched) = self.event_set()?;
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
                code => match events_check("nvmlEventSetWait_v2", code) {
                    Ok(()) => {}
                    Err(e) => {
                        // A GPU fallen off the bus fails every later wait of
                        // the set (nvml.h, nvmlEventSetWait_v2): the next
                        // wait builds a new one, without the lost GPU, so the
                        // others are watched again.
                        self.drop_event_set();
                        // What was read stays: an XID 79 comes just before.
                        if out.is_empty() {
                            return Err(e);
                        }
                        tracing::warn!(error = %nri::ErrorChain(&e), "nvml event wait failed after events");
                        break;
                    }
                },
            }
            ms = 0;
            let kind = match data.event_type {
                EVENT_XID_CRITICAL => EventKind::Xid(data.event_data),
                EVENT_DOUBLE_BIT_ECC => EventKind::DoubleBitEcc,
                _ => continue,
            };
            // A lost GPU may not name itself; its memory reading reports it.
            match self.uuid_of(data.device) {
                Ok(uuid) => out.push(GpuEvent { uuid, kind }),
                Err(e) => {
                    tracing::warn!(error = %nri::ErrorChain(&e), ?kind, "nvml event of a gpu without a uuid")
                }
            }
        }
        Ok(EventWait {
            events: out,
            unwatched,
        })
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

    pub(super) fn uuid_of(&self, dev: Handle) -> Result<String, NvmlError> {
        let f: unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> Ret =
            self.sym(c"nvmlDeviceGetUUID", "-")?;
        let mut buf = [0u8; UUID_BUFFER];
        // SAFETY: the buffer has the documented size.
        check("nvmlDeviceGetUUID", "-", unsafe {
            f(
                dev,
                buf.as_mut_ptr().cast::<c_char>(),
                UUID_BUFFER as c_uint,
            )
        })?;
        Ok(uuid_text(&buf))
    }

    /// Frees the event set; the next wait registers every GPU anew.
    pub(super) fn drop_event_set(&self) {
        let set = self.events.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let (Some(set), Ok(free)) = (
            set,
            self.sym::<unsafe extern "C" fn(Handle) -> Ret>(c"nvmlEventSetFree", "-"),
        ) {
            // SAFETY: a set NVML created, no longer reachable from `events`.
            unsafe { free(set.set) };
        }
    }

    /// The event set, with the GPUs it still misses: those that failed to
    /// register before are tried again first, so a GPU that failed once is
    /// not left unwatched for the plugin's life.
    fn event_set(&self) -> Result<(Handle, Vec<Unwatched>), NvmlError> {
        let mut guard = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kept) = guard.as_mut() {
            let before = std::mem::take(&mut kept.unwatched);
            for (i, _) in before {
                if let Registered::Failed(gpu) = self.register(i, kept.set, false) {
                    kept.unwatched.push((i, gpu));
                }
            }
            return Ok((kept.set, unwatched_of(kept)));
        }
        let kept = self.register_all()?;
        let out = (kept.set, unwatched_of(&kept));
        *guard = Some(kept);
        Ok(out)
    }

    /// An event set with XID and double-bit ECC events of every device that supports
    /// them (k8s-device-plugin `internal/rm/health.go` does the same).
    fn register_all(&self) -> Result<EventSet, NvmlError> {
        let create: unsafe extern "C" fn(*mut Handle) -> Ret =
            self.sym(c"nvmlEventSetCreate", "-")?;
        let count: unsafe extern "C" fn(*mut c_uint) -> Ret =
            self.sym(c"nvmlDeviceGetCount_v2", "-")?;
        let free: unsafe extern "C" fn(Handle) -> Ret = self.sym(c"nvmlEventSetFree", "-")?;
        let (mut set, mut n): (Handle, c_uint) = (std::ptr::null_mut(), 0);
        // SAFETY: out pointers to locals; the set comes from NVML.
        unsafe {
            events_check("nvmlEventSetCreate", create(&mut set))?;
            if let Err(e) = events_check("nvmlDeviceGetCount_v2", count(&mut n)) {
                // Not kept, so not freed at drop: freed here.
                free(set);
                return Err(e);
            }
        }
        let unwatched = (0..n)
            .filter_map(|i| match self.register(i, set, true) {
                Registered::Failed(gpu) => Some((i, gpu)),
                Registered::Watched | Registered::Unsupported => None,
            })
            .collect();
        Ok(EventSet { set, unwatched })
    }

    /// Registers GPU `index` in `set` for the events it reports. One GPU that
    /// cannot register (lost, or busy) must not stop the others being
    /// watched; its memory readings still are. `first`: warn, where a retry
    /// that fails again only says so at debug level.
    fn register(&self, index: c_uint, set: Handle, first: bool) -> Registered {
        let mut gpu = Unwatched::Unnamed;
        let mut attempt = || -> Result<Registered, NvmlError> {
            let by_index: unsafe extern "C" fn(c_uint, *mut Handle) -> Ret =
                self.sym(c"nvmlDeviceGetHandleByIndex_v2", "-")?;
            let supported: unsafe extern "C" fn(Handle, *mut c_ulonglong) -> Ret =
                self.sym(c"nvmlDeviceGetSupportedEventTypes", "-")?;
            let register: unsafe extern "C" fn(Handle, c_ulonglong, Handle) -> Ret =
                self.sym(c"nvmlDeviceRegisterEvents", "-")?;
            let (mut dev, mut types): (Handle, c_ulonglong) = (std::ptr::null_mut(), 0);
            // SAFETY: out pointers to locals.
            events_check("nvmlDeviceGetHandleByIndex_v2", unsafe {
                by_index(index, &mut dev)
            })?;
            match self.uuid_of(dev) {
                Ok(uuid) => gpu = Unwatched::Gpu(uuid),
                Err(e) if e.gpu_lost() => gpu = Unwatched::Lost,
                Err(_) => {}
            }
            // SAFETY: a handle from NVML, an out pointer to a local.
            events_check("nvmlDeviceGetSupportedEventTypes", unsafe {
                supported(dev, &mut types)
            })?;
            let wanted = types & (EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC);
            if wanted == 0 {
                return Ok(Registered::Unsupported);
            }
            // SAFETY: handles from NVML.
            events_check("nvmlDeviceRegisterEvents", unsafe {
                register(dev, wanted, set)
            })?;
            Ok(Registered::Watched)
        };
        match attempt() {
            Ok(done) => done,
            // A GPU too old for events: its readings are all there is to
            // learn (nvml.h: the set stays usable); k8s-device-plugin skips
            // such a GPU too.
            Err(e) if e.events_unsupported() => Registered::Unsupported,
            Err(e) => {
                if gpu == Unwatched::Unnamed && e.gpu_lost() {
                    gpu = Unwatched::Lost;
                }
                if first {
                    tracing::warn!(index, ?gpu, error = %nri::ErrorChain(&e), "nvml: gpu not watched for events, trying again at each check");
                } else {
                    tracing::debug!(index, ?gpu, error = %nri::ErrorChain(&e), "nvml: gpu still not watched for events");
                }
                Registered::Failed(gpu)
            }
        }
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

/// What registering one GPU for events came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Registered {
    Watched,
    /// The GPU reports none of the events watched, or none at all.
    Unsupported,
    Failed(Unwatched),
}

fn unwatched_of(set: &EventSet) -> Vec<Unwatched> {
    set.unwatched.iter().map(|(_, gpu)| gpu.clone()).collect()
}

/// The text NVML wrote into `buf`, up to its NUL; never read past the
/// buffer, whatever a driver left in it.
fn uuid_text(buf: &[u8]) -> String {
    let text = CStr::from_bytes_until_nul(buf).map_or(buf, |c| c.to_bytes());
    String::from_utf8_lossy(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::nvml::Nvml;

    /// Two GPUs; the second fails its first three registrations for events
    /// (lost). The first reports XID 79, after which two waits answer
    /// GPU_IS_LOST and later ones time out quietly.
    const SOURCE: &str = r#"
typedef struct { void *device; unsigned long long type, data; unsigned int gi, ci; } ev;
static int waits = 0, creates = 0, second = 0;
int test_creates(void) { return creates; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlEventSetCreate(void **s) { creates++; *s = (void *)7; return 0; }
int nvmlEventSetFree(void *s) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) { *d = (void *)(unsigned long)(i + 1); return 0; }
int nvmlDeviceGetSupportedEventTypes(void *d, unsigned long long *t) { *t = 0xa; return 0; }
int nvmlDeviceRegisterEvents(void *d, unsigned long long t, void *s) { return d == (void *)2 && ++second <= 3 ? 15 : 0; }
int nvmlEventSetWait_v2(void *s, ev *e, unsigned int ms) {
    ++waits;
    if (waits == 2 || waits == 3) return 15;
    if (waits > 3) return 10;
    e->device = (void *)1; e->type = 8; e->data = 79; e->gi = e->ci = ~0U;
    return 0;
}
int nvmlDeviceGetUUID(void *d, char *buf, unsigned int n) {
    const char *u = d == (void *)2 ? "GPU-1" : "GPU-0";
    for (unsigned int i = 0; i < 6; i++) buf[i] = u[i];
    return 0;
}
"#;

    /// A GPU that cannot register does not stop the others being watched,
    /// and is named as unwatched until a later wait registers it in the kept
    /// set; an event read before a failing wait is kept: XID 79 comes just
    /// before the GPU is lost.
    #[test]
    fn events_read_before_a_lost_gpu_fails_the_wait_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let lib = crate::fixture::build_c_library(dir.path(), "libevents.so", SOURCE).unwrap();
        let nvml = DlNvml::open(lib.to_str().unwrap()).unwrap();
        let wait = || nvml.wait_events(Duration::from_millis(10));
        let second = vec![Unwatched::Gpu("GPU-1".into())];
        assert_eq!(
            wait().unwrap(),
            EventWait {
                events: vec![GpuEvent {
                    uuid: "GPU-0".into(),
                    kind: EventKind::Xid(79),
                }],
                unwatched: second.clone(),
            }
        );
        // Each failed wait drops its set: the next one waits on a new set,
        // which fails once more here, then times out quietly.
        assert!(wait().is_err());
        assert_eq!(wait().unwrap().unwatched, second);
        // The kept set takes the GPU at its next try.
        assert_eq!(wait().unwrap(), EventWait::default());
        let creates: unsafe extern "C" fn() -> std::ffi::c_int =
            nvml.sym(c"test_creates", "-").unwrap();
        // SAFETY: the stub's counter, no arguments.
        assert_eq!(unsafe { creates() }, 3);
    }

    /// A UUID is read up to its NUL, and a buffer with none is read no
    /// further than its end.
    #[test]
    fn a_uuid_is_read_within_its_buffer() {
        let mut buf = [0u8; super::UUID_BUFFER];
        buf[..8].copy_from_slice(b"GPU-abcd");
        assert_eq!(super::uuid_text(&buf), "GPU-abcd");
        let full = [b'x'; super::UUID_BUFFER];
        assert_eq!(super::uuid_text(&full), "x".repeat(super::UUID_BUFFER));
    }
}
