//! The generated `Plugin` service trait, implemented method by method.

use async_trait::async_trait;
use ttrpc::r#async::TtrpcContext;

use super::{service::Service, Plugin};
use crate::{api, api::Event, api_ttrpc};

#[async_trait]
impl<P: Plugin> api_ttrpc::Plugin for Service<P> {
    async fn configure(
        &self,
        ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let info = self.runtime_info(&req)?;
        self.set_request_timeout(info.request_timeout_ms);
        self.call(ctx, "configure", self.plugin.configure(&info))
            .await?;
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

    async fn synchronize(
        &self,
        ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        // A split sync (NRI v0.7+) must be acknowledged chunk by chunk with
        // `more` echoed and no updates, or the runtime drops the plugin.
        let Some((pods, containers)) = self.collect_sync(req) else {
            return Ok(api::SynchronizeResponse {
                more: true,
                ..Default::default()
            });
        };
        let (n_pods, n_containers) = (pods.len(), containers.len());
        let update = self
            .call(
                ctx,
                "synchronize",
                self.plugin.synchronize(pods, containers),
            )
            .await?;
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

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        tracing::info!("runtime is shutting down");
        self.plugin.shutdown().await;
        Ok(api::Empty::default())
    }

    async fn create_container(
        &self,
        ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        let (pod, ctr) = (req.pod.get_or_default(), req.container.get_or_default());
        tracing::debug!(pod = %pod.name, container = %ctr.name, id = %ctr.id, "create container");
        self.call(
            ctx,
            "create_container",
            self.plugin.create_container(pod, ctr),
        )
        .await
    }

    async fn update_container(
        &self,
        ctx: &TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        let (pod, ctr) = (req.pod.get_or_default(), req.container.get_or_default());
        let resources = req.linux_resources.get_or_default();
        tracing::debug!(pod = %pod.name, container = %ctr.name, id = %ctr.id, "update container");
        let handler = self.plugin.update_container(pod, ctr, resources);
        self.call(ctx, "update_container", handler).await
    }

    async fn stop_container(
        &self,
        ctx: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        let (pod, ctr) = (req.pod.get_or_default(), req.container.get_or_default());
        tracing::debug!(pod = %pod.name, container = %ctr.name, id = %ctr.id, "stop container");
        let update = self
            .call(ctx, "stop_container", self.plugin.stop_container(pod, ctr))
            .await?;
        Ok(api::StopContainerResponse {
            update,
            ..Default::default()
        })
    }

    async fn state_change(
        &self,
        ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        // An event number this proto does not know is ignored, not refused:
        // a newer runtime may add events.
        let Ok(event) = req.event.enum_value() else {
            tracing::debug!(event = req.event.value(), "ignoring unknown state change");
            return Ok(api::Empty::default());
        };
        let (pod, ctr) = (req.pod.get_or_default(), req.container.get_or_default());
        self.relay(ctx, event, pod, ctr).await?;
        Ok(api::Empty::default())
    }

    async fn update_pod_sandbox(
        &self,
        ctx: &TtrpcContext,
        req: api::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::UpdatePodSandboxResponse> {
        tracing::debug!(pod = %req.pod.name, "update pod sandbox");
        self.call(
            ctx,
            "update_pod_sandbox",
            self.plugin.update_pod_sandbox(&req),
        )
        .await?;
        Ok(api::UpdatePodSandboxResponse::default())
    }

    async fn validate_container_adjustment(
        &self,
        ctx: &TtrpcContext,
        req: api::ValidateContainerAdjustmentRequest,
    ) -> ttrpc::Result<api::ValidateContainerAdjustmentResponse> {
        let handler = self.plugin.validate_container_adjustment(&req);
        self.call(ctx, "validate_container_adjustment", handler)
            .await
    }

    async fn run_pod_sandbox(
        &self,
        ctx: &TtrpcContext,
        req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        let no_ctr = api::Container::default();
        self.relay(
            ctx,
            Event::RUN_POD_SANDBOX,
            req.pod.get_or_default(),
            &no_ctr,
        )
        .await?;
        Ok(Default::default())
    }

    async fn post_update_pod_sandbox(
        &self,
        ctx: &TtrpcContext,
        req: api::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::PostUpdatePodSandboxResponse> {
        let no_ctr = api::Container::default();
        let pod = req.pod.get_or_default();
        self.relay(ctx, Event::POST_UPDATE_POD_SANDBOX, pod, &no_ctr)
            .await?;
        Ok(Default::default())
    }

    async fn stop_pod_sandbox(
        &self,
        ctx: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        let no_ctr = api::Container::default();
        self.relay(
            ctx,
            Event::STOP_POD_SANDBOX,
            req.pod.get_or_default(),
            &no_ctr,
        )
        .await?;
        Ok(Default::default())
    }

    async fn remove_pod_sandbox(
        &self,
        ctx: &TtrpcContext,
        req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        let no_ctr = api::Container::default();
        let pod = req.pod.get_or_default();
        self.relay(ctx, Event::REMOVE_POD_SANDBOX, pod, &no_ctr)
            .await?;
        Ok(Default::default())
    }

    async fn post_create_container(
        &self,
        ctx: &TtrpcContext,
        req: api::PostCreateContainerRequest,
    ) -> ttrpc::Result<api::PostCreateContainerResponse> {
        let (pod, ctr) = (req.pod.get_or_default(), req.container.get_or_default());
        self.relay(ctx, Event::POST_CREATE_CONTAINER, pod, ctr)
            .await?;
        Ok(Default::default())
    }

    async fn start_container(
        &self,
        ctx: &TtrpcContext,
        req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        let (pod, ctr) = (req.pod.get_or_default(), req.container.get_or_default());
        self.relay(ctx, Event::START_CONTAINER, pod, ctr).await?;
        Ok(Default::default())
    }

    async fn post_start_container(
        &self,
        ctx: &TtrpcContext,
        req: api::PostStartContainerRequest,
    ) -> ttrpc::Result<api::PostStartContainerResponse> {
        let (pod, ctr) = (req.pod.get_or_default(), req.container.get_or_default());
        self.relay(ctx, Event::POST_START_CONTAINER, pod, ctr)
            .await?;
        Ok(Default::default())
    }

    async fn post_update_container(
        &self,
        ctx: &TtrpcContext,
        req: api::PostUpdateContainerRequest,
    ) -> ttrpc::Result<api::PostUpdateContainerResponse> {
        let (pod, ctr) = (req.pod.get_or_default(), req.container.get_or_default());
        self.relay(ctx, Event::POST_UPDATE_CONTAINER, pod, ctr)
            .await?;
        Ok(Default::default())
    }

    async fn remove_container(
        &self,
        ctx: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        let (pod, ctr) = (req.pod.get_or_default(), req.container.get_or_default());
        self.relay(ctx, Event::REMOVE_CONTAINER, pod, ctr).await?;
        Ok(Default::default())
    }
}
