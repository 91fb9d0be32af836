//! The `Plugin` service: each method of `proto/api.proto` decoded, handed
//! to [`Plugin`], and its reply encoded.
//!
//! A method this proto does not know answers `UNIMPLEMENTED`, as a Go ttrpc
//! server does; a runtime then falls back to `StateChange` for events.

use protobuf::Message;
use ttrpc::{Code, Status};

use super::envelope::{self, RequestView};
use super::{service::Service, Plugin};
use crate::{api, api::Event};

/// The service name runtimes call.
pub(super) const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// `CreateContainerRequest` for `nri::api::CreateContainerRequest`; the
/// protobuf descriptors would give the same but link the reflection tables.
fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Decodes `payload` as `Req`, runs `f`, and appends the `Response`
/// carrying its reply to `out`.
fn reply<Req: Message, Resp: Message>(
    payload: &[u8],
    out: &mut Vec<u8>,
    f: impl FnOnce(Req) -> Result<Resp, Status>,
) -> Result<(), Status> {
    let req = Req::parse_from_bytes(payload).map_err(|e| {
        ttrpc::get_status(
            Code::INVALID_ARGUMENT,
            format!("decode {}: {e}", short_type_name::<Req>()),
        )
    })?;
    let resp = f(req)?;
    envelope::encode_ok(out, &resp)
        .map_err(|e| ttrpc::get_status(Code::INTERNAL, format!("encode reply: {e}")))
}

impl<P: Plugin> Service<P> {
    /// Answers one request: appends the encoded `Response` to `out`, or
    /// returns the status to send instead.
    pub(super) fn handle(&self, req: &RequestView<'_>, out: &mut Vec<u8>) -> Result<(), Status> {
        if req.service != PLUGIN_SERVICE {
            return Err(ttrpc::get_status(
                Code::UNIMPLEMENTED,
                format!("service {}", req.service),
            ));
        }
        let (t, p) = (req.timeout_nano, req.payload);
        match req.method {
            "Configure" => reply(p, out, |r| self.configure(t, &r)),
            "Synchronize" => reply(p, out, |r| self.synchronize(t, r)),
            "Shutdown" => reply(p, out, |_: api::Empty| {
                tracing::info!("runtime is shutting down");
                self.plugin.shutdown();
                Ok(api::Empty::default())
            }),
            "CreateContainer" => reply(p, out, |r: api::CreateContainerRequest| {
                let (pod, ctr) = (r.pod.get_or_default(), r.container.get_or_default());
                tracing::debug!(pod = %pod.name, container = %ctr.name, id = %ctr.id, "create container");
                self.call(t, "create_container", || {
                    self.plugin.create_container(pod, ctr)
                })
            }),
            "UpdateContainer" => reply(p, out, |r: api::UpdateContainerRequest| {
                let (pod, ctr) = (r.pod.get_or_default(), r.container.get_or_default());
                let resources = r.linux_resources.get_or_default();
                tracing::debug!(pod = %pod.name, container = %ctr.name, id = %ctr.id, "update container");
                self.call(t, "update_container", || {
                    self.plugin.update_container(pod, ctr, resources)
                })
            }),
            "StopContainer" => reply(p, out, |r: api::StopContainerRequest| {
                let (pod, ctr) = (r.pod.get_or_default(), r.container.get_or_default());
                tracing::debug!(pod = %pod.name, container = %ctr.name, id = %ctr.id, "stop container");
                let update =
                    self.call(t, "stop_container", || self.plugin.stop_container(pod, ctr))?;
                Ok(api::StopContainerResponse {
                    update,
                    ..Default::default()
                })
            }),
            "StateChange" => reply(p, out, |r: api::StateChangeEvent| {
                // An event number this proto does not know is ignored, not
                // refused: a newer runtime may add events.
                match r.event.enum_value() {
                    Ok(event) => self.relay(t, event, &r.pod, &r.container)?,
                    Err(n) => tracing::debug!(event = n, "ignoring unknown state change"),
                }
                Ok(api::Empty::default())
            }),
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
            "RunPodSandbox" => pod_event(p, out, |r: api::RunPodSandboxRequest| {
                self.relay_pod(t, Event::RUN_POD_SANDBOX, &r.pod)
            }),
            "PostUpdatePodSandbox" => pod_event(p, out, |r: api::PostUpdatePodSandboxRequest| {
                self.relay_pod(t, Event::POST_UPDATE_POD_SANDBOX, &r.pod)
            }),
            "StopPodSandbox" => pod_event(p, out, |r: api::StopPodSandboxRequest| {
                self.relay_pod(t, Event::STOP_POD_SANDBOX, &r.pod)
            }),
            "RemovePodSandbox" => pod_event(p, out, |r: api::RemovePodSandboxRequest| {
                self.relay_pod(t, Event::REMOVE_POD_SANDBOX, &r.pod)
            }),
            "PostCreateContainer" => pod_event(p, out, |r: api::PostCreateContainerRequest| {
                self.relay(t, Event::POST_CREATE_CONTAINER, &r.pod, &r.container)
            }),
            "StartContainer" => pod_event(p, out, |r: api::StartContainerRequest| {
                self.relay(t, Event::START_CONTAINER, &r.pod, &r.container)
            }),
            "PostStartContainer" => pod_event(p, out, |r: api::PostStartContainerRequest| {
                self.relay(t, Event::POST_START_CONTAINER, &r.pod, &r.container)
            }),
            "PostUpdateContainer" => pod_event(p, out, |r: api::PostUpdateContainerRequest| {
                self.relay(t, Event::POST_UPDATE_CONTAINER, &r.pod, &r.container)
            }),
            "RemoveContainer" => pod_event(p, out, |r: api::RemoveContainerRequest| {
                self.relay(t, Event::REMOVE_CONTAINER, &r.pod, &r.container)
            }),
            other => Err(ttrpc::get_status(
                Code::UNIMPLEMENTED,
                format!("method {other}"),
            )),
        }
    }

    fn configure(
        &self,
        t: i64,
        req: &api::ConfigureRequest,
    ) -> Result<api::ConfigureResponse, Status> {
        let info = self.runtime_info(req)?;
        self.set_request_timeout(info.request_timeout_ms);
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
    ) -> Result<api::SynchronizeResponse, Status> {
        // A split sync (NRI v0.7+) must be acknowledged chunk by chunk with
        // `more` echoed and no updates, or the runtime drops the plugin.
        let Some((pods, containers)) = self.collect_sync(req) else {
            return Ok(api::SynchronizeResponse {
                more: true,
                ..Default::default()
            });
        };
        let (n_pods, n_containers) = (pods.len(), containers.len());
        let update = self.call(t, "synchronize", || {
            self.plugin.synchronize(pods, containers)
        })?;
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

    fn relay_pod(&self, t: i64, event: Event, pod: &api::PodSandbox) -> Result<(), Status> {
        self.relay(t, event, pod, api::Container::default_instance())
    }
}

/// A lifecycle event whose reply message is empty (any empty message
/// encodes the same: zero bytes).
fn pod_event<Req: Message>(
    payload: &[u8],
    out: &mut Vec<u8>,
    f: impl FnOnce(Req) -> Result<(), Status>,
) -> Result<(), Status> {
    reply(payload, out, |r| f(r).map(|()| api::Empty::default()))
}
