//! One plugin connection as the fake runtime sees it.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::{
    net::UnixStream,
    sync::{mpsc, Mutex},
};
use ttrpc::{
    r#async::{
        transport::{Listener, Socket},
        Client, Server, TtrpcContext,
    },
    Code,
};

use super::{FakeConfig, FakeError, PendingRegistration, RuntimeService};
use crate::{
    api::{self, Container, Event, PodSandbox},
    api_ttrpc,
    mux::{Mux, MuxHandle, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN},
    EventMask,
};

/// A registered, configured and synchronized plugin.
pub struct PluginConn {
    pub registration: api::RegisterPluginRequest,
    /// The subscription from ConfigureResponse (0 turned into "all").
    pub events: EventMask,
    /// Every Synchronize reply, in order.
    pub sync_replies: Vec<api::SynchronizeResponse>,
    /// UpdateContainers requests the plugin sent.
    pub updates: Arc<Mutex<Vec<api::UpdateContainersRequest>>>,
    client: api_ttrpc::PluginClient,
    config: FakeConfig,
    /// Set after the plugin answered a per-event RPC with UNIMPLEMENTED.
    state_change_fallback: AtomicBool,
    mux: MuxHandle,
    _server: Server,
}

impl PluginConn {
    pub(super) async fn start(
        stream: UnixStream,
        config: FakeConfig,
    ) -> Result<PluginConn, FakeError> {
        let mut mux = Mux::new(stream);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN)?;
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN)?;
        let mux = mux.start();

        let (reg_tx, mut reg_rx) = mpsc::channel(1);
        let updates = Arc::new(Mutex::new(Vec::new()));
        let service = RuntimeService {
            registrations: reg_tx,
            hold_reply: config.configure_before_register_reply,
            updates: Arc::clone(&updates),
        };
        let once = futures::stream::once(async move { Ok::<_, std::io::Error>(runtime_conn) });
        let mut server = Server::new()
            .register_service(api_ttrpc::create_runtime(Arc::new(service)))
            .add_listener(Listener::new(once.chain(futures::stream::pending())));
        server.start().await.map_err(FakeError::Serve)?;
        let client = api_ttrpc::PluginClient::new(Client::new(Socket::new(plugin_conn)));

        let wait = config.registration_timeout;
        let pending = tokio::time::timeout(wait, reg_rx.recv())
            .await
            .ok()
            .flatten()
            .ok_or(FakeError::RegistrationTimeout {
                ms: wait.as_millis(),
            })??;

        let mut conn = PluginConn {
            registration: pending.request,
            events: EventMask::EMPTY,
            sync_replies: Vec::new(),
            updates,
            client,
            config,
            state_change_fallback: AtomicBool::new(false),
            mux,
            _server: server,
        };
        let configured = conn.configure().await;
        // Now let the RegisterPlugin reply go out.
        let _ = pending.configured.send(());
        conn.events = configured?;
        conn.synchronize().await?;
        Ok(conn)
    }

    fn ctx(&self) -> ttrpc::context::Context {
        ttrpc::context::with_duration(self.config.request_timeout)
    }

    async fn configure(&self) -> Result<EventMask, FakeError> {
        let c = &self.config;
        let req = api::ConfigureRequest {
            config: c.config.clone(),
            runtime_name: c.runtime_name.clone(),
            runtime_version: c.runtime_version.clone(),
            registration_timeout: millis(c.registration_timeout),
            request_timeout: millis(c.request_timeout),
            NRI_version: c.nri_version.clone(),
            ..Default::default()
        };
        let reply = self
            .client
            .configure(self.ctx(), &req)
            .await
            .map_err(|source| FakeError::Rpc {
                method: "Configure",
                source,
            })?;
        // Like `adaptation/plugin.go` `configure`.
        let bits = reply.events as u32;
        let valid = c.valid_events();
        if bits == 0 {
            return Ok(valid);
        }
        let extra = bits & !valid.bits();
        if extra != 0 {
            return Err(FakeError::InvalidEvents { extra });
        }
        Ok(EventMask::from_bits(bits))
    }

    /// Sends the configured pods and containers, `sync_chunk` objects per
    /// message, and checks the plugin's handling of `more`.
    async fn synchronize(&mut self) -> Result<(), FakeError> {
        let mut pods = self.config.pods.clone();
        let mut ctrs = self.config.containers.clone();
        let chunk = match self.config.sync_chunk {
            0 => usize::MAX,
            n => n,
        };
        loop {
            let n_pods = pods.len().min(chunk);
            let n_ctrs = ctrs.len().min(chunk - n_pods);
            let req = api::SynchronizeRequest {
                pods: pods.drain(..n_pods).collect(),
                containers: ctrs.drain(..n_ctrs).collect(),
                more: !(pods.is_empty() && ctrs.is_empty()),
                ..Default::default()
            };
            let reply = self
                .client
                .synchronize(self.ctx(), &req)
                .await
                .map_err(|source| FakeError::Rpc {
                    method: "Synchronize",
                    source,
                })?;
            let more = req.more;
            let bad_split = more && (!reply.update.is_empty() || !reply.more);
            self.sync_replies.push(reply);
            if bad_split {
                return Err(FakeError::SplitSync);
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// The raw client, for requests the helpers do not cover.
    pub fn client(&self) -> &api_ttrpc::PluginClient {
        &self.client
    }

    pub async fn create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        let req = api::CreateContainerRequest {
            pod: Some(pod.clone()).into(),
            container: Some(container.clone()).into(),
            ..Default::default()
        };
        self.client.create_container(self.ctx(), &req).await
    }

    /// UpdateContainer, as the runtime sends it when a container's resources change.
    pub async fn update_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
        resources: &api::LinuxResources,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        let req = api::UpdateContainerRequest {
            pod: Some(pod.clone()).into(),
            container: Some(container.clone()).into(),
            linux_resources: Some(resources.clone()).into(),
            ..Default::default()
        };
        self.client.update_container(self.ctx(), &req).await
    }

    /// StopContainer, as the runtime sends it before a container stops.
    pub async fn stop_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        let req = api::StopContainerRequest {
            pod: Some(pod.clone()).into(),
            container: Some(container.clone()).into(),
            ..Default::default()
        };
        self.client.stop_container(self.ctx(), &req).await
    }

    /// Delivers a lifecycle event without reply data the way this runtime
    /// would: nothing if not subscribed; per-event RPC on NRI v0.12 unless
    /// the plugin answered UNIMPLEMENTED once; StateChange otherwise.
    pub async fn event(
        &self,
        event: Event,
        pod: &PodSandbox,
        container: Option<&Container>,
    ) -> ttrpc::Result<()> {
        if !self.events.contains(event) {
            return Ok(());
        }
        if self.config.per_event_rpcs() && !self.state_change_fallback.load(Ordering::Relaxed) {
            match self.per_event_rpc(event, pod, container).await {
                Err(ttrpc::Error::RpcStatus(s)) if s.code() == Code::UNIMPLEMENTED => {
                    self.state_change_fallback.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        let req = api::StateChangeEvent {
            event: event.into(),
            pod: Some(pod.clone()).into(),
            container: container.cloned().into(),
            ..Default::default()
        };
        self.client.state_change(self.ctx(), &req).await.map(drop)
    }

    async fn per_event_rpc(
        &self,
        event: Event,
        pod: &PodSandbox,
        container: Option<&Container>,
    ) -> ttrpc::Result<()> {
        let (c, ctx) = (&self.client, self.ctx());
        let pod = Some(pod.clone()).into();
        let ctr = || container.cloned().into();
        match event {
            Event::RUN_POD_SANDBOX => {
                let req = api::RunPodSandboxRequest {
                    pod,
                    ..Default::default()
                };
                c.run_pod_sandbox(ctx, &req).await.map(drop)
            }
            Event::STOP_POD_SANDBOX => {
                let req = api::StopPodSandboxRequest {
                    pod,
                    ..Default::default()
                };
                c.stop_pod_sandbox(ctx, &req).await.map(drop)
            }
            Event::REMOVE_POD_SANDBOX => {
                let req = api::RemovePodSandboxRequest {
                    pod,
                    ..Default::default()
                };
                c.remove_pod_sandbox(ctx, &req).await.map(drop)
            }
            Event::POST_UPDATE_POD_SANDBOX => {
                let req = api::PostUpdatePodSandboxRequest {
                    pod,
                    ..Default::default()
                };
                c.post_update_pod_sandbox(ctx, &req).await.map(drop)
            }
            Event::POST_CREATE_CONTAINER => {
                let req = api::PostCreateContainerRequest {
                    pod,
                    container: ctr(),
                    ..Default::default()
                };
                c.post_create_container(ctx, &req).await.map(drop)
            }
            Event::START_CONTAINER => {
                let req = api::StartContainerRequest {
                    pod,
                    container: ctr(),
                    ..Default::default()
                };
                c.start_container(ctx, &req).await.map(drop)
            }
            Event::POST_START_CONTAINER => {
                let req = api::PostStartContainerRequest {
                    pod,
                    container: ctr(),
                    ..Default::default()
                };
                c.post_start_container(ctx, &req).await.map(drop)
            }
            Event::POST_UPDATE_CONTAINER => {
                let req = api::PostUpdateContainerRequest {
                    pod,
                    container: ctr(),
                    ..Default::default()
                };
                c.post_update_container(ctx, &req).await.map(drop)
            }
            Event::REMOVE_CONTAINER => {
                let req = api::RemoveContainerRequest {
                    pod,
                    container: ctr(),
                    ..Default::default()
                };
                c.remove_container(ctx, &req).await.map(drop)
            }
            _ => Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
                Code::INVALID_ARGUMENT,
                format!("{event:?} has its own request type"),
            ))),
        }
    }

    /// Waits until the plugin closes its end.
    pub async fn closed(self) -> std::io::Result<()> {
        let PluginConn {
            mux,
            client,
            _server,
            ..
        } = self;
        // Our own conns must stay open, or the mux would stop on its own.
        let result = mux.closed().await;
        drop(client);
        result
    }
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl api_ttrpc::Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        let bad_idx =
            req.plugin_idx.len() != 2 || !req.plugin_idx.bytes().all(|b| b.is_ascii_digit());
        let invalid = match () {
            () if bad_idx => Some(("index", req.plugin_idx.clone())),
            () if req.plugin_name.is_empty() => Some(("name", req.plugin_name.clone())),
            () => None,
        };
        if let Some((field, value)) = invalid {
            let status = ttrpc::get_status(
                Code::INVALID_ARGUMENT,
                format!("invalid plugin {field} {value:?}"),
            );
            let _ = self
                .registrations
                .send(Err(FakeError::InvalidRegistration { field, value }))
                .await;
            return Err(ttrpc::Error::RpcStatus(status));
        }
        let (configured, wait) = tokio::sync::oneshot::channel();
        let pending = PendingRegistration {
            request: req,
            configured,
        };
        if self.registrations.send(Ok(pending)).await.is_err() {
            let status = ttrpc::get_status(Code::ALREADY_EXISTS, "plugin already registered");
            return Err(ttrpc::Error::RpcStatus(status));
        }
        // Hold the reply until Configure went through, the worst ordering
        // a real runtime can produce.
        if self.hold_reply {
            let _ = wait.await;
        }
        Ok(api::Empty::default())
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        self.updates.lock().await.push(req);
        Ok(api::UpdateContainersResponse::default())
    }
}
