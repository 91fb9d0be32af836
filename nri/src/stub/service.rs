//! What the `Plugin` service keeps per connection (the runtime's timeout, a
//! split Synchronize, whether the handshake finished) and how a handler's
//! result becomes a ttrpc status.
//!
//! Both ways a runtime delivers lifecycle events are routed to the same trait
//! method ([`Service::relay`]): the per-event RPCs of NRI v0.12+ and the older
//! `StateChange` (nri.md §1). `rpc.rs` implements every method of the proto:
//! answering one with `UNIMPLEMENTED` would make a v0.12 runtime fall back to
//! `StateChange` for good.

use std::{
    mem,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use ttrpc::{Code, Status};

use super::{Plugin, RpcError, RuntimeInfo};
use crate::protowire;
use crate::ErrorChain;
use crate::{api, api::Event, NriVersion};

/// [`super::DEFAULT_REQUEST_TIMEOUT`], used until Configure tells otherwise.
const DEFAULT_REQUEST_TIMEOUT_MS: u64 = super::DEFAULT_REQUEST_TIMEOUT.as_millis() as u64;

pub(super) struct Service<P> {
    pub(super) plugin: Arc<P>,
    request_timeout_ms: AtomicU64,
    /// Set once the initial Synchronize was answered: the connection is up.
    synchronized: AtomicBool,
    /// Set when the initial Synchronize was answered past the runtime's
    /// deadline: the runtime dropped the plugin, and the connection must go.
    sync_too_late: AtomicBool,
    /// Chunks of a split Synchronize, until the last one arrives.
    sync: Mutex<SyncBuffer>,
}

/// What a split Synchronize may carry in all: pods and containers together
/// (far past any node: kubelet's default is 110 pods), and their encoded
/// bytes (each chunk up to ttrpc's 4 MiB). A bound on what a runtime that
/// never sends its last chunk makes this process hold.
const MAX_SYNC: SyncBound = SyncBound {
    objects: 1 << 16,
    bytes: 64 << 20,
};

#[derive(Debug, Clone, Copy)]
struct SyncBound {
    objects: usize,
    bytes: u64,
}

/// A Synchronize's pods and containers, once its last chunk is in.
type Synced = (Vec<api::PodSandbox>, Vec<api::Container>);

#[derive(Default)]
struct SyncBuffer {
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
    /// The encoded size of the chunks held.
    bytes: u64,
}

impl SyncBuffer {
    /// Checks a chunk still encoded against `max`, counting its pods and
    /// containers without building them: a chunk of up to 4 MiB of empty
    /// entries (two bytes each) would otherwise make this process build two
    /// million messages before `add` could refuse them. A chunk that is not
    /// valid protobuf passes with what was counted up to the fault, for the
    /// decoder to name it.
    fn admit(&mut self, payload: &[u8], max: SyncBound) -> Result<(), Status> {
        let mut entries = 0usize;
        // SynchronizeRequest: pods = 1, containers = 2 (api.proto), each
        // entry one length-delimited field.
        let _ = protowire::each_field(payload, |_, field, wire_type| {
            if matches!(field, 1 | 2) && wire_type == protowire::LEN {
                entries += 1;
            }
            Ok(false)
        });
        let objects = self.objects().saturating_add(entries);
        let bytes = self.bytes.saturating_add(payload.len() as u64);
        if objects > max.objects || bytes > max.bytes {
            return Err(self.exhausted(max));
        }
        Ok(())
    }

    /// Adds one chunk [`SyncBuffer::admit`] let in, `encoded` bytes long
    /// (decoded, it holds just the pods and containers admit counted);
    /// everything collected once the last one is in.
    fn add(&mut self, req: api::SynchronizeRequest, encoded: usize) -> Option<Synced> {
        self.bytes = self.bytes.saturating_add(encoded as u64);
        self.pods.extend(req.pods);
        self.containers.extend(req.containers);
        if req.more {
            return None;
        }
        let all = mem::take(self);
        Some((all.pods, all.containers))
    }

    fn objects(&self) -> usize {
        self.pods.len() + self.containers.len()
    }

    /// Drops what was collected: the runtime's Synchronize has failed, and
    /// its next one starts afresh.
    fn exhausted(&mut self, max: SyncBound) -> Status {
        *self = SyncBuffer::default();
        ttrpc::get_status(
            Code::RESOURCE_EXHAUSTED,
            format!(
                "synchronize carries more than {} pods and containers or {} bytes",
                max.objects, max.bytes
            ),
        )
    }
}

fn sync_refused(status: &Status) {
    tracing::error!(error = %status.message, "synchronize refused");
}

/// Converts a plugin error into the status the runtime sees.
///
/// `DEADLINE_EXCEEDED` could read as a timeout, which makes the runtime
/// drop the plugin (`isFatalError`), and `UNIMPLEMENTED` makes a v0.12
/// runtime switch this connection to StateChange for good
/// (`adaptation/plugin_type.go`); neither is what a plugin error means.
pub(crate) fn status_of<E: RpcError>(err: &E) -> Status {
    let code = match err.code() {
        Code::OK | Code::DEADLINE_EXCEEDED | Code::UNIMPLEMENTED => Code::UNKNOWN,
        code => code,
    };
    ttrpc::get_status(code, ErrorChain(err).to_string())
}

/// `configured`, or a request's deadline (`timeout_nano`) where it is
/// shorter; one that is not positive sets none.
fn shorter_of(configured: Duration, timeout_nano: i64) -> Duration {
    match u64::try_from(timeout_nano) {
        Ok(nanos) if nanos > 0 => configured.min(Duration::from_nanos(nanos)),
        _ => configured,
    }
}

impl<P: Plugin> Service<P> {
    pub(super) fn new(plugin: Arc<P>) -> Service<P> {
        Service {
            plugin,
            request_timeout_ms: AtomicU64::new(DEFAULT_REQUEST_TIMEOUT_MS),
            synchronized: AtomicBool::new(false),
            sync_too_late: AtomicBool::new(false),
            sync: Mutex::new(SyncBuffer::default()),
        }
    }

    /// Records the request timeout the runtime stated at Configure, if any.
    pub(super) fn set_request_timeout(&self, info: &RuntimeInfo) {
        if let Some(timeout) = info.stated_request_timeout() {
            let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            self.request_timeout_ms.store(ms, Ordering::Relaxed);
        }
    }

    pub(super) fn mark_synchronized(&self) {
        self.synchronized.store(true, Ordering::Relaxed);
    }

    pub(super) fn is_synchronized(&self) -> bool {
        self.synchronized.load(Ordering::Relaxed)
    }

    pub(super) fn mark_sync_too_late(&self) {
        self.sync_too_late.store(true, Ordering::Relaxed);
    }

    /// Whether the runtime gave up on the initial Synchronize: NRI v0.7 and
    /// later then close the plugin (`plugin.synchronize`, 4e60cd0); v0.6.1
    /// (containerd 1.7.25 and older) only logs it and never adds the plugin,
    /// leaving the connection open with nothing more to come on it.
    pub(super) fn sync_too_late(&self) -> bool {
        self.sync_too_late.load(Ordering::Relaxed)
    }

    /// Refuses a Synchronize chunk that would take the collected chunks past
    /// their bound, before it is decoded.
    pub(super) fn admit_sync(&self, payload: &[u8]) -> Result<(), Status> {
        let mut buf = self.sync.lock().unwrap_or_else(PoisonError::into_inner);
        buf.admit(payload, MAX_SYNC).inspect_err(sync_refused)
    }

    /// Adds one Synchronize chunk, admitted and `encoded` bytes long;
    /// returns everything collected once the last chunk (`more == false`)
    /// is in.
    pub(super) fn collect_sync(
        &self,
        req: api::SynchronizeRequest,
        encoded: usize,
    ) -> Option<Synced> {
        let mut buf = self.sync.lock().unwrap_or_else(PoisonError::into_inner);
        buf.add(req, encoded)
    }

    /// How long the runtime waited for the answer to a request, to judge one
    /// answered: the request's own deadline when it carries one (ttrpc sends
    /// what is left of the runtime's; NRI v0.6.1 states no timeout at
    /// Configure, so an operator's longer `plugin_request_timeout` shows only
    /// here), else the timeout stated at Configure (2 s where none was).
    pub(super) fn runtime_deadline(&self, timeout_nano: i64) -> Duration {
        match u64::try_from(timeout_nano) {
            Ok(ns) if ns > 0 => Duration::from_nanos(ns),
            _ => Duration::from_millis(self.request_timeout_ms.load(Ordering::Relaxed)),
        }
    }

    /// How long the runtime waits for the answer to a request: the shorter
    /// of the timeout it stated at Configure (2 s where it stated none) and
    /// the request's own deadline (`timeout_nano`, 0 if unset).
    fn request_timeout(&self, timeout_nano: i64) -> Duration {
        let configured = Duration::from_millis(self.request_timeout_ms.load(Ordering::Relaxed));
        shorter_of(configured, timeout_nano)
    }

    /// Runs one handler; errors leave here as ttrpc statuses, and this is
    /// where they are logged. A handler that ran past its budget is logged
    /// too: the runtime may have given up on it already.
    pub(super) fn call<T>(
        &self,
        timeout_nano: i64,
        method: &'static str,
        handler: impl FnOnce() -> Result<T, P::Error>,
    ) -> Result<T, Status> {
        let start = Instant::now();
        let timeout = self.request_timeout(timeout_nano);
        let result = {
            let _timeout = super::deadline::RequestScope::enter(timeout);
            handler()
        };
        let took = start.elapsed();
        let budget = super::answer_budget(timeout);
        if took > budget {
            tracing::error!(
                method,
                took_ms = %took.as_millis(),
                budget_ms = %budget.as_millis(),
                "plugin handler ran past its time budget"
            );
        }
        result.map_err(|err| {
            tracing::warn!(method, error = %ErrorChain(&err), "plugin handler failed");
            status_of(&err)
        })
    }

    /// Delivers a lifecycle event that carries no reply data, whichever RPC
    /// brought it.
    pub(super) fn relay(
        &self,
        timeout_nano: i64,
        event: Event,
        pod: &api::PodSandbox,
        ctr: &api::Container,
    ) -> Result<(), Status> {
        tracing::debug!(?event, pod = %pod.name, container = %ctr.name, "event");
        let p = &self.plugin;
        let handler = || {
            match event {
                Event::RUN_POD_SANDBOX => p.run_pod_sandbox(pod),
                Event::POST_UPDATE_POD_SANDBOX => p.post_update_pod_sandbox(pod),
                Event::STOP_POD_SANDBOX => p.stop_pod_sandbox(pod),
                Event::REMOVE_POD_SANDBOX => p.remove_pod_sandbox(pod),
                Event::POST_CREATE_CONTAINER => p.post_create_container(pod, ctr),
                Event::START_CONTAINER => p.start_container(pod, ctr),
                Event::POST_START_CONTAINER => p.post_start_container(pod, ctr),
                Event::POST_UPDATE_CONTAINER => p.post_update_container(pod, ctr),
                Event::REMOVE_CONTAINER => p.remove_container(pod, ctr),
                // These have replies and always come through their own RPC.
                Event::CREATE_CONTAINER
                | Event::UPDATE_CONTAINER
                | Event::STOP_CONTAINER
                | Event::UPDATE_POD_SANDBOX
                | Event::VALIDATE_CONTAINER_ADJUSTMENT
                | Event::UNKNOWN
                | Event::LAST => Ok(()),
            }
        };
        self.call(timeout_nano, event_name(event), handler)
    }

    pub(super) fn runtime_info(&self, req: &api::ConfigureRequest) -> Result<RuntimeInfo, Status> {
        let nri_version =
            NriVersion::of_runtime(&req.NRI_version, &req.runtime_name, &req.runtime_version);
        let wanted = self.plugin.events();
        let accepted = NriVersion::valid_events_of(nri_version);
        let events = wanted.intersection(accepted);
        let left_out = wanted.difference(accepted);
        if !left_out.is_empty() {
            tracing::info!(
                runtime = %req.runtime_name,
                runtime_version = %req.runtime_version,
                events = ?left_out,
                "runtime does not support these events; not subscribing to them"
            );
        }
        if events.is_empty() {
            // An empty mask would subscribe to everything.
            return Err(ttrpc::get_status(
                Code::FAILED_PRECONDITION,
                format!(
                    "runtime {} {} supports none of the plugin's events {wanted}",
                    req.runtime_name, req.runtime_version
                ),
            ));
        }
        Ok(RuntimeInfo {
            name: req.runtime_name.clone(),
            version: req.runtime_version.clone(),
            nri_version,
            config: req.config.clone(),
            registration_timeout_ms: req.registration_timeout,
            request_timeout_ms: req.request_timeout,
            events,
        })
    }
}

fn event_name(event: Event) -> &'static str {
    match event {
        Event::RUN_POD_SANDBOX => "run_pod_sandbox",
        Event::POST_UPDATE_POD_SANDBOX => "post_update_pod_sandbox",
        Event::STOP_POD_SANDBOX => "stop_pod_sandbox",
        Event::REMOVE_POD_SANDBOX => "remove_pod_sandbox",
        Event::POST_CREATE_CONTAINER => "post_create_container",
        Event::START_CONTAINER => "start_container",
        Event::POST_START_CONTAINER => "post_start_container",
        Event::POST_UPDATE_CONTAINER => "post_update_container",
        Event::REMOVE_CONTAINER => "remove_container",
        _ => "state_change",
    }
}

#[cfg(test)]
mod timeout_tests {
    use super::*;

    #[test]
    fn a_requests_timeout_is_the_shorter_of_the_stated_one_and_its_deadline() {
        let ms = Duration::from_millis;
        for (configured, timeout_nano, want) in [
            (ms(2000), 0, ms(2000)),
            (ms(2000), -5, ms(2000)),
            (ms(2000), 1_500_000_000, ms(1500)),
            (ms(1000), 1_500_000_000, ms(1000)),
        ] {
            assert_eq!(shorter_of(configured, timeout_nano), want, "{timeout_nano}");
        }
    }

    #[test]
    fn only_a_positive_stated_timeout_counts() {
        for (stated, want) in [
            (1000, Some(Duration::from_millis(1000))),
            (0, None),
            (-5, None),
        ] {
            let info = RuntimeInfo {
                request_timeout_ms: stated,
                ..RuntimeInfo::default()
            };
            assert_eq!(info.stated_request_timeout(), want, "{stated}");
        }
    }
}

#[cfg(test)]
mod sync_buffer_tests {
    use super::*;

    fn chunk(pods: usize, containers: usize, more: bool) -> api::SynchronizeRequest {
        api::SynchronizeRequest {
            pods: vec![api::PodSandbox::default(); pods],
            containers: vec![api::Container::default(); containers],
            more,
            ..Default::default()
        }
    }

    /// A chunk through the stub's two steps: admitted still encoded, then
    /// added decoded.
    fn feed(
        buf: &mut SyncBuffer,
        req: api::SynchronizeRequest,
        max: SyncBound,
    ) -> Result<Option<Synced>, Status> {
        let encoded = protobuf::Message::write_to_bytes(&req).unwrap();
        buf.admit(&encoded, max)?;
        Ok(buf.add(req, encoded.len()))
    }

    #[test]
    fn chunks_past_the_bound_are_refused_and_dropped() {
        let mut buf = SyncBuffer::default();
        assert_eq!(feed(&mut buf, chunk(2, 3, true), TEN), Ok(None));
        assert_eq!(feed(&mut buf, chunk(2, 3, true), TEN), Ok(None));
        let err = feed(&mut buf, chunk(1, 0, false), TEN).unwrap_err();
        assert_eq!(err.code(), Code::RESOURCE_EXHAUSTED);
        assert!(err.message.contains("more than 10"), "{}", err.message);
        assert!(buf.pods.is_empty() && buf.containers.is_empty());
        assert_eq!(buf.bytes, 0);
        // The next Synchronize starts afresh, and the bound itself is allowed.
        let (pods, containers) = feed(&mut buf, chunk(4, 6, false), TEN).unwrap().unwrap();
        assert_eq!((pods.len(), containers.len()), (4, 6));
    }

    const TEN: SyncBound = SyncBound {
        objects: 10,
        bytes: 1 << 20,
    };

    /// A chunk is counted still encoded, against what the buffer holds:
    /// pods (field 1) and containers (field 2), each one length-delimited
    /// entry, and other fields not at all.
    #[test]
    fn chunks_are_counted_before_they_are_decoded() {
        let mut buf = SyncBuffer::default();
        assert_eq!(feed(&mut buf, chunk(2, 4, true), TEN), Ok(None));
        // Four entries and `more`: ten in all, the bound itself.
        let four = [
            [0x0a, 0x00],
            [0x12, 0x00],
            [0x12, 0x00],
            [0x0a, 0x00],
            [0x18, 0x01],
        ]
        .concat();
        assert_eq!(buf.admit(&four, TEN), Ok(()));
        assert_eq!(buf.objects(), 6, "admitting adds nothing");
        let five = [four.as_slice(), &[0x0a, 0x00]].concat();
        let err = buf.admit(&five, TEN).unwrap_err();
        assert_eq!(err.code(), Code::RESOURCE_EXHAUSTED);
        assert!(buf.pods.is_empty() && buf.containers.is_empty() && buf.bytes == 0);
        // Invalid protobuf is counted up to its fault and left to the decoder.
        let cut = [[0x0a, 0x00].repeat(3), vec![0x0a, 0x05]].concat();
        assert_eq!(buf.admit(&cut, TEN), Ok(()));
        let past = [[0x12, 0x00].repeat(11), vec![0x0a, 0x05]].concat();
        assert!(buf.admit(&past, TEN).is_err());
        // The bytes bound the chunk's encoded size (ten bytes here).
        let ten_bytes = SyncBound {
            objects: 10,
            bytes: 10,
        };
        let mut buf = SyncBuffer::default();
        assert!(buf.admit(&four, ten_bytes).is_ok());
        let longer = [four.as_slice(), &[0x18, 0x00]].concat();
        assert!(buf.admit(&longer, ten_bytes).is_err());
    }

    /// Few objects, each large (a pod's annotations): the bytes bound them.
    #[test]
    fn chunks_past_the_byte_bound_are_refused() {
        let big = || {
            let mut req = chunk(1, 0, true);
            req.pods[0].annotations.insert("k".into(), "v".repeat(600));
            req
        };
        let bound = SyncBound {
            objects: 10,
            bytes: 1000,
        };
        let mut buf = SyncBuffer::default();
        assert_eq!(feed(&mut buf, big(), bound), Ok(None));
        let err = feed(&mut buf, big(), bound).unwrap_err();
        assert_eq!(err.code(), Code::RESOURCE_EXHAUSTED);
        assert!(err.message.contains("1000 bytes"), "{}", err.message);
        assert!(buf.pods.is_empty() && buf.bytes == 0);
    }
}
