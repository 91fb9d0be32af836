//! devgate's NRI plugin: what happens to a container at CreateContainer.
//!
//! [`DevgatePlugin::adjustment`] is the single place where a container's
//! adjustment is put together; each source of changes (today the probe
//! annotation, later the device plan from `crate::plan`) contributes there.
//! Errors leave the plugin as ttrpc statuses through [`nri::RpcError`],
//! implemented once for [`PluginError`].

pub mod probe;

use std::{
    path::PathBuf,
    sync::{Arc, PoisonError, RwLock},
};

use async_trait::async_trait;
use nri::{
    api::{Container, ContainerAdjustment, CreateContainerResponse, Event, PodSandbox},
    protobuf::MessageField,
    ttrpc::Code,
    EventMask, RpcError, RuntimeInfo,
};

use crate::config::{Config, ConfigError};

/// The events devgate subscribes to.
pub const EVENTS: EventMask = EventMask::of(Event::CREATE_CONTAINER);

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("devgate refused container {container:?} of pod {namespace}/{pod}")]
    Probe {
        namespace: String,
        pod: String,
        container: String,
        #[source]
        source: probe::ProbeError,
    },
    #[error("devgate cannot adjust container {container:?} of pod {namespace}/{pod}: its config from the runtime is invalid")]
    Config {
        namespace: String,
        pod: String,
        container: String,
        #[source]
        source: Arc<ConfigError>,
    },
}

/// The one conversion to the wire: the runtime fails the container with
/// this status and its text (error chain) reaches kubelet. None of these
/// codes is one the runtime treats as fatal for the connection.
impl RpcError for PluginError {
    fn code(&self) -> Code {
        match self {
            PluginError::Probe { .. } => Code::INVALID_ARGUMENT,
            PluginError::Config { .. } => Code::FAILED_PRECONDITION,
        }
    }
}

/// Node paths and mode the plugin runs with.
#[derive(Debug, Clone)]
pub struct PluginOptions {
    /// Root holding the host's `sys/` and `proc/`.
    pub host_root: PathBuf,
    /// Directory of claims and saved device state.
    pub state_dir: PathBuf,
    /// Take the config from `ConfigureRequest.config` (runtime-launched
    /// plugins have no command line and get their drop-in file that way).
    pub config_from_runtime: bool,
}

/// The config in force, or why the runtime's config was refused.
type ConfigState = Result<Arc<Config>, Arc<ConfigError>>;

pub struct DevgatePlugin {
    config: RwLock<ConfigState>,
    options: PluginOptions,
}

impl DevgatePlugin {
    pub fn new(config: Config, options: PluginOptions) -> DevgatePlugin {
        DevgatePlugin {
            config: RwLock::new(Ok(Arc::new(config))),
            options,
        }
    }

    pub fn options(&self) -> &PluginOptions {
        &self.options
    }

    /// The config in force; an error if the runtime sent an invalid one.
    pub fn config(&self) -> ConfigState {
        self.config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Everything devgate changes in a container being created.
    ///
    /// Containers that ask devgate for nothing get an empty adjustment even
    /// when the config is broken; the others are refused rather than
    /// started without what they asked for.
    pub fn adjustment(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<ContainerAdjustment, PluginError> {
        let mut adjust = ContainerAdjustment::default();
        let probe = probe::probe_env(pod).map_err(|source| PluginError::Probe {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            container: ctr.name.clone(),
            source,
        })?;
        if probe.is_none() {
            return Ok(adjust);
        }
        self.config().map_err(|source| PluginError::Config {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            container: ctr.name.clone(),
            source,
        })?;
        adjust.env.extend(probe);
        Ok(adjust)
    }
}

#[async_trait]
impl nri::Plugin for DevgatePlugin {
    type Error = PluginError;

    fn events(&self) -> EventMask {
        EVENTS
    }

    /// Never fails: containerd 1.7 exits when a plugin it launched fails
    /// Configure ("failed to start NRI interface", fatal for CRI), so a bad
    /// drop-in file is reported here and on each container it affects.
    async fn configure(&self, runtime: &RuntimeInfo) -> Result<(), PluginError> {
        if !self.options.config_from_runtime {
            return Ok(());
        }
        let state = Config::parse(&runtime.config, "from the runtime")
            .map(Arc::new)
            .map_err(Arc::new);
        if let Err(e) = &state {
            tracing::error!(error = %e, "invalid plugin config; refusing containers that need devgate");
        }
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = state;
        Ok(())
    }

    async fn create_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<CreateContainerResponse, PluginError> {
        let adjust = self.adjustment(pod, ctr)?;
        tracing::debug!(
            namespace = %pod.namespace,
            pod = %pod.name,
            container = %ctr.name,
            env = adjust.env.len(),
            "adjusted container"
        );
        Ok(CreateContainerResponse {
            adjust: MessageField::some(adjust),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests;
