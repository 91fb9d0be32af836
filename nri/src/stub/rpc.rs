//! The `Plugin` service: each method of `proto/api.proto` decoded, handed
//! to [`Plugin`], and its reply encoded.
//!
//! A method this proto does not know answers `UNIMPLEMENTED`, as a Go ttrpc
//! server does; a runtime then falls back to `StateChange` for events.

use protobuf::Message;
use ttrpc::{Code, Status};

use super::envelope::{self, RequestView};
use super::{service::Service, CreateReply, Plugin};
use crate::lean::{self, Decode, Layout, Parts};
use crate::{api, api::Event};

/// The service name runtimes call.
pub(super) const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// `CreateContainerRequest` for `nri::api::CreateContainerRequest`; the
/// protobuf descriptors would give the same but link the reflection tables.
fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Decodes `payload` as `Req`.
fn decode<Req: Message>(payload: &[u8]) -> Result<Req, Status> {
    Req::parse_from_bytes(payload).map_err(undecodable::<Req>)
}

fn undecodable<Req>(e: impl std::fmt::Display) -> Status {
    ttrpc::get_status(
        Code::INVALID_ARGUMENT,
        format!("decode {}: {e}", short_type_name::<Req>()),
    )
}

/// Appends the `Response` carrying `resp` to `out`.
fn finish<Resp: Message>(out: &mut Vec<u8>, resp: &Resp) -> Result<(), Status> {
    envelope::encode_ok(out, resp)
        .map_err(|e| ttrpc::get_status(Code::INTERNAL, format!("encode reply: {e}")))
}

/// Decodes `payload` as `Req`, runs `f`, and appends the `Response`
/// carrying its reply to `out`.
fn reply<Req: Message, Resp: Message>(
    payload: &[u8],
    out: &mut Vec<u8>,
    f: impl FnOnce(Req) -> Result<Resp, Status>,
) -> Result<(), Status> {
    finish(out, &f(decode(payload)?)?)
}

/// A request that carries a pod and maybe a container, which a plugin
/// asking for [`Decode::Lean`] gets through [`lean::decode`].
trait WithParts: Message {
    const LAYOUT: Layout;
    /// The event the request brings; `None` when the message names it
    /// (`StateChangeEvent`).
    const EVENT: Option<Event>;
    fn into_parts(self) -> Parts;
}

macro_rules! with_parts {
    ($layout:ident: $($req:ty => $event:ident),* $(,)?) => {$(
        impl WithParts for $req {
            const LAYOUT: Layout = lean::$layout;
            const EVENT: Option<Event> = Some(Event::$event);
            fn into_parts(self) -> Parts {
                Parts {
                    pod: self.pod.unwrap_or_default(),
                    container: with_parts!(@container $layout self),
                    ..Default::default()
                }
            }
        }
    )*};
    (@container POD $req:ident) => { api::Container::default() };
    (@container POD_AND_CONTAINER $req:ident) => { $req.container.unwrap_or_default() };
}

with_parts!(POD_AND_CONTAINER:
    api::CreateContainerRequest => CREATE_CONTAINER,
    api::StopContainerRequest => STOP_CONTAINER,
    api::PostCreateContainerRequest => POST_CREATE_CONTAINER,
    api::StartContainerRequest => START_CONTAINER,
    api::PostStartContainerRequest => POST_START_CONTAINER,
    api::PostUpdateContainerRequest => POST_UPDATE_CONTAINER,
    api::RemoveContainerRequest => REMOVE_CONTAINER,
);
with_parts!(POD:
    api::RunPodSandboxRequest => RUN_POD_SANDBOX,
    api::PostUpdatePodSandboxRequest => POST_UPDATE_POD_SANDBOX,
    api::StopPodSandboxRequest => STOP_POD_SANDBOX,
    api::RemovePodSandboxRequest => REMOVE_POD_SANDBOX,
);

impl WithParts for api::StateChangeEvent {
    const LAYOUT: Layout = lean::STATE_CHANGE;
    const EVENT: Option<Event> = None;
    fn into_parts(self) -> Parts {
        Parts {
            event: self.event,
            pod: self.pod.unwrap_or_default(),
            container: self.container.unwrap_or_default(),
        }
    }
}

impl<P: Plugin> Service<P> {
    /// Answers one request: appends the encoded `Response` to `out`, or
    /// returns the status to send instead.
    pub(super) fn handle(&self, req: &RequestView<'_>, out: &mut Vec<u8>) -> Result<(), Status> {
        if req.service != PLUGIN_SERVICE {
            return Err(ttrpc::get_status(
                Code::UNIMPLEMENTED,
                format!("service {}", clipped(req.service)),
            ));
        }
        let (t, p) = (req.timeout_nano, req.payload);
        match req.method {
            "Configure" => reply(p, out, |r| self.configure(t, &r)),
            "Synchronize" => {
                self.admit_sync(p)?;
                reply(p, out, |r| self.synchronize(t, r, p.len()))
            }
            "Shutdown" => reply(p, out, |_: api::Empty| {
                tracing::info!("runtime is shutting down");
                self.plugin.shutdown();
                Ok(api::Empty::default())
            }),
            "CreateContainer" => {
                let r = self.parts::<api::CreateContainerRequest>(p)?;
                let (pod, ctr) = (&r.pod, &r.container);
                tracing::debug!(pod = %pod.name, container = %ctr.name, id = %ctr.id, "create container");
                let resp = self.call(t, "create_container", || {
                    self.plugin.create_container_reply(pod, ctr)
                })?;
                match &resp {
                    CreateReply::Message(m) => finish(out, m),
                    CreateReply::Encoded(e) => {
                        envelope::encode_ok_bytes(out, e.as_bytes());
                        Ok(())
                    }
                }
            }
            "UpdateContainer" => reply(p, out, |r: api::UpdateContainerRequest| {
                let (pod, ctr) = (r.pod.get_or_default(), r.container.get_or_default());
                let resources = r.linux_resources.get_or_default();
                tracing::debug!(pod = %pod.name, container = %ctr.name, id = %ctr.id, "update container");
                self.call(t, "update_container", || {
                    self.plugin.update_container(pod, ctr, resources)
                })
            }),
            "StopContainer" => {
                let r = self.parts::<api::StopContainerRequest>(p)?;
                let (pod, ctr) = (&r.pod, &r.container);
                tracing::debug!(pod = %pod.name, container = %ctr.name, id = %ctr.id, "stop container");
                let update =
                    self.call(t, "stop_container", || self.plugin.stop_container(pod, ctr))?;
                let resp = api::StopContainerResponse {
                    update,
                    ..Default::default()
                };
                finish(out, &resp)
            }
            "StateChange" => self.event::<api::StateChangeEvent>(t, p, out),
            "UpdatePodSandbox" => reply(p, out, |r: api::UpdatePodSandboxRequest| {
                tracing::debug!(pod = %r.pod.name, "update pod sandbox");
                self.call(t, "update_pod_sandbox", || {
                    self.plugin.update_pod_sandbox(&r)
                })?;
                Ok(api::UpdatePodSandboxResponse::default())
            }),
            "ValidateContainerAdjustment" => {
                reply(p, out, |r: api::ValidateContainerAdjustmentRequest| {
                    self.call(t, "validate_container_adjustment", || {
                        self.plugin.validate_container_adjustment(&r)
                    })
                })
            }
            "RunPodSandbox" => self.event::<api::RunPodSandboxRequest>(t, p, out),
            "PostUpdatePodSandbox" => self.event::<api::PostUpdatePodSandboxRequest>(t, p, out),
            "StopPodSandbox" => self.event::<api::StopPodSandboxRequest>(t, p, out),
            "RemovePodSandbox" => self.event::<api::RemovePodSandboxRequest>(t, p, out),
            "PostCreateContainer" => self.event::<api::PostCreateContainerRequest>(t, p, out),
            "StartContainer" => self.event::<api::StartContainerRequest>(t, p, out),
            "PostStartContainer" => self.event::<api::PostStartContainerRequest>(t, p, out),
            "PostUpdateContainer" => self.event::<api::PostUpdateContainerRequest>(t, p, out),
            "RemoveContainer" => self.event::<api::RemoveContainerRequest>(t, p, out),
            other => Err(ttrpc::get_status(
                Code::UNIMPLEMENTED,
                format!("method {}", clipped(other)),
            )),
        }
    }

    fn configure(
        &self,
        t: i64,
        req: &api::ConfigureRequest,
    ) -> Result<api::ConfigureResponse, Status> {
        let info = self.runtime_info(req)?;
        self.set_request_timeout(&info);
        self.call(t, "configure", || self.plugin.configure(&info))?;
        tracing::info!(
            runtime = %info.name,
            runtime_version = %info.version,
            nri_version = ?info.nri_version.map(|v| v.to_string()),
            events = ?info.events,
            "configured"
        );
        Ok(api::ConfigureResponse {
            // At most 14 bits are set, so this never wraps.
            events: info.events.bits() as i32,
            ..Default::default()
        })
    }

    fn synchronize(
        &self,
        t: i64,
        req: api::SynchronizeRequest,
        encoded: usize,
    ) -> Result<api::SynchronizeResponse, Status> {
        // A split sync (NRI v0.7+) must be acknowledged chunk by chunk with
        // `more` echoed and no updates, or the runtime drops the plugin.
        let Some((pods, containers)) = self.collect_sync(req, encoded) else {
            return Ok(api::SynchronizeResponse {
                more: true,
                ..Default::default()
            });
        };
        let (n_pods, n_containers) = (pods.len(), containers.len());
        let start = std::time::Instant::now();
        let update = self.call(t, "synchronize", || {
            self.plugin.synchronize(pods, containers)
        })?;
        let (took, timeout) = (start.elapsed(), self.runtime_deadline(t));
        if took > timeout {
            self.mark_sync_too_late();
            tracing::error!(
                took_ms = %took.as_millis(),
                timeout_ms = %timeout.as_millis(),
                "synchronize outlasted the runtime's deadline: the runtime dropped this plugin; reconnecting"
            );
            return Err(ttrpc::get_status(
                Code::DEADLINE_EXCEEDED,
                "synchronize outlasted the runtime's deadline",
            ));
        }
        self.mark_synchronized();
        tracing::info!(
            pods = n_pods,
            containers = n_containers,
            updates = update.len(),
            "synchronized"
        );
        Ok(api::SynchronizeResponse {
            update,
            ..Default::default()
        })
    }

    /// Decodes a request's pod and container, fully or lean as the plugin asks.
    fn parts<Req: WithParts>(&self, payload: &[u8]) -> Result<Parts, Status> {
        match self.plugin.decode() {
            Decode::Full => decode::<Req>(payload).map(Req::into_parts),
            Decode::Lean(keys) => {
                lean::decode(payload, Req::LAYOUT, keys, Req::EVENT).map_err(undecodable::<Req>)
            }
        }
    }

    /// A lifecycle event with an empty reply.
    fn event<Req: WithParts>(
        &self,
        t: i64,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Status> {
        let r = self.parts::<Req>(payload)?;
        // An event number this proto does not know is ignored, not refused:
        // a newer runtime may add events.
        let event = match Req::EVENT {
            Some(event) => Ok(event),
            None => r.event.enum_value(),
        };
        match event {
            Ok(event) => self.relay(t, event, &r.pod, &r.container)?,
            Err(n) => tracing::debug!(event = n, "ignoring unknown state change"),
        }
        finish(out, &api::Empty::default())
    }
}

/// A peer's name echoed in an error, cut to a bound at a character: the
/// reply must stay far below ttrpc's limit whatever the request named.
fn clipped(name: &str) -> &str {
    const MAX: usize = 256;
    let mut end = name.len().min(MAX);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}
