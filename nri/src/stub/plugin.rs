//! The surface a plugin implements: one method per NRI event.

use std::sync::Arc;

use protobuf::Message as _;
use ttrpc::Code;

use crate::{
    api::{
        Container, ContainerUpdate, CreateContainerResponse, LinuxResources, PodSandbox,
        UpdateContainerResponse, UpdatePodSandboxRequest, ValidateContainerAdjustmentRequest,
        ValidateContainerAdjustmentResponse,
    },
    Decode, EventMask, NriVersion,
};

/// An error a plugin hands back to the runtime.
///
/// The stub sends it as a ttrpc status with [`RpcError::code`] and the
/// error's text, its `source()` chain joined by `": "`. For CreateContainer
/// the runtime fails the container with that text, which kubelet shows.
pub trait RpcError: std::error::Error + Send + Sync + 'static {
    /// The status code; the stub replaces codes the runtime would misread
    /// (see [`crate::stub`]) with `UNKNOWN`.
    fn code(&self) -> Code {
        Code::UNKNOWN
    }
}

impl RpcError for std::convert::Infallible {}

/// What the runtime told the plugin in `ConfigureRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// "containerd" or "cri-o".
    pub name: String,
    pub version: String,
    /// Stated by the runtime (NRI v0.12+) or inferred from name and version.
    pub nri_version: Option<NriVersion>,
    /// Plugin configuration: set only for plugins the runtime launched (the
    /// content of their drop-in file); empty otherwise.
    pub config: String,
    /// How long the runtime waits for a registration, in milliseconds (0 if not sent).
    pub registration_timeout_ms: i64,
    /// How long the runtime waits for any reply, in milliseconds (0 if not sent).
    pub request_timeout_ms: i64,
    /// The subscription the stub answered with: [`Plugin::events`] minus
    /// what this runtime does not accept.
    pub events: EventMask,
}

impl RuntimeInfo {
    /// The request timeout the runtime stated at Configure (NRI v0.7 and
    /// later); `None` where it stated none, or one that is not positive.
    pub fn stated_request_timeout(&self) -> Option<std::time::Duration> {
        u64::try_from(self.request_timeout_ms)
            .ok()
            .filter(|ms| *ms > 0)
            .map(std::time::Duration::from_millis)
    }
}

/// A reply to CreateContainer: a message to encode, or one encoded before.
#[derive(Debug, Clone)]
pub enum CreateReply {
    Message(CreateContainerResponse),
    Encoded(EncodedReply),
}

/// A `CreateContainerResponse` encoded once, for a plugin that gives many
/// containers the same reply: sending it again costs neither a copy of the
/// adjustment nor its encoding.
#[derive(Debug, Clone)]
pub struct EncodedReply(Arc<[u8]>);

impl EncodedReply {
    pub fn new(reply: &CreateContainerResponse) -> protobuf::Result<EncodedReply> {
        Ok(EncodedReply(reply.write_to_bytes()?.into()))
    }

    /// The message's bytes, as `Message::write_to_bytes` gives them.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// An NRI plugin. Every event method has a no-op default; override the
/// ones named in [`Plugin::events`].
///
/// Handlers run one at a time on the stub's thread, which reads the next
/// request only after the reply is out. They must bound their own waits well
/// inside the runtime's request timeout ([`RuntimeInfo::request_timeout_ms`],
/// 2 s by default): a late reply makes the runtime drop the connection for
/// good. The stub logs a handler that took more than three quarters of it.
pub trait Plugin: Send + Sync + 'static {
    type Error: RpcError;

    /// The events this plugin wants; must not be empty (the runtime reads an
    /// empty subscription as "all events"). Events the runtime does not
    /// know are left out of the subscription automatically.
    fn events(&self) -> EventMask;

    /// How much of each request's pod and container the handlers get:
    /// everything, or only the fields listed in [`crate::lean`] (the rest
    /// left default), which spares decoding the container's mounts, hooks
    /// and resources on every call. `UpdateContainer`, `UpdatePodSandbox`,
    /// `ValidateContainerAdjustment` and `Synchronize` are always decoded
    /// whole.
    fn decode(&self) -> Decode {
        Decode::Full
    }

    /// Called once per connection, before [`Plugin::synchronize`]. An error
    /// makes the runtime close the connection.
    fn configure(&self, _runtime: &RuntimeInfo) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The runtime's pods and containers when the connection starts, all at
    /// once even if the runtime sent them in several messages. The result
    /// updates existing containers.
    fn synchronize(
        &self,
        _pods: Vec<PodSandbox>,
        _containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, Self::Error> {
        Ok(Vec::new())
    }

    /// The runtime is shutting down (containerd never sends this; expect a
    /// closed connection instead).
    fn shutdown(&self) {}

    /// The connection to the runtime is gone.
    fn on_close(&self) {}

    fn run_pod_sandbox(&self, _pod: &PodSandbox) -> Result<(), Self::Error> {
        Ok(())
    }

    /// NRI v0.10+.
    fn update_pod_sandbox(&self, _req: &UpdatePodSandboxRequest) -> Result<(), Self::Error> {
        Ok(())
    }

    /// NRI v0.10+.
    fn post_update_pod_sandbox(&self, _pod: &PodSandbox) -> Result<(), Self::Error> {
        Ok(())
    }

    fn stop_pod_sandbox(&self, _pod: &PodSandbox) -> Result<(), Self::Error> {
        Ok(())
    }

    fn remove_pod_sandbox(&self, _pod: &PodSandbox) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Adjust the container being created. An error fails the creation.
    fn create_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<CreateContainerResponse, Self::Error> {
        Ok(CreateContainerResponse::default())
    }

    /// What the stub calls at CreateContainer: [`Plugin::create_container`]
    /// unless a plugin that keeps encoded replies overrides it.
    fn create_container_reply(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<CreateReply, Self::Error> {
        self.create_container(pod, container)
            .map(CreateReply::Message)
    }

    fn post_create_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    fn start_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    fn post_start_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    /// `resources` is what CRI asks to set.
    fn update_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
        _resources: &LinuxResources,
    ) -> Result<UpdateContainerResponse, Self::Error> {
        Ok(UpdateContainerResponse::default())
    }

    fn post_update_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    fn stop_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<Vec<ContainerUpdate>, Self::Error> {
        Ok(Vec::new())
    }

    fn remove_container(
        &self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    /// NRI v0.10+: accept or reject the merged adjustment of all plugins.
    fn validate_container_adjustment(
        &self,
        _req: &ValidateContainerAdjustmentRequest,
    ) -> Result<ValidateContainerAdjustmentResponse, Self::Error> {
        Ok(ValidateContainerAdjustmentResponse::default())
    }
}
