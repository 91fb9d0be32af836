//! An in-process fake NRI runtime for tests and benchmarks (feature
//! `test-util`).
//!
//! It follows the runtime side of `pkg/adaptation` closely enough to catch
//! what a real runtime rejects: it checks the plugin's name and index,
//! sends `Configure` before the `RegisterPlugin` reply has gone out (the
//! runtime may), refuses subscription bits its NRI version does not know,
//! splits `Synchronize` and checks the `more` echo, and delivers events either
//! as NRI v0.12 per-event RPCs (falling back to `StateChange` on
//! `UNIMPLEMENTED`) or as `StateChange` like older runtimes.

mod conn;

use std::{path::Path, sync::Arc, time::Duration};

use tokio::{
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot, Mutex},
};

pub use self::conn::PluginConn;
use crate::{
    api::{Container, PodSandbox},
    mux::MuxError,
    EventMask, NriVersion,
};

#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    #[error("socket i/o")]
    Io(#[from] std::io::Error),
    #[error("mux")]
    Mux(#[from] MuxError),
    #[error("start runtime service")]
    Serve(#[source] ttrpc::Error),
    #[error("plugin did not register within {ms} ms")]
    RegistrationTimeout { ms: u128 },
    #[error("plugin registered with invalid {field} {value:?}")]
    InvalidRegistration { field: &'static str, value: String },
    #[error("{method} failed")]
    Rpc {
        method: &'static str,
        #[source]
        source: ttrpc::Error,
    },
    #[error("invalid plugin events: {extra:#x}")]
    InvalidEvents { extra: u32 },
    #[error("plugin does not handle split sync requests")]
    SplitSync,
}

/// How the fake runtime presents itself.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    pub runtime_name: String,
    pub runtime_version: String,
    /// `ConfigureRequest.NRI_version`; empty like runtimes before v0.12.
    pub nri_version: String,
    /// `ConfigureRequest.config`.
    pub config: String,
    pub registration_timeout: Duration,
    pub request_timeout: Duration,
    /// Sent in the initial Synchronize.
    pub pods: Vec<PodSandbox>,
    pub containers: Vec<Container>,
    /// Objects (pods plus containers) per Synchronize message; 0 = one message.
    pub sync_chunk: usize,
    /// Send Configure before the RegisterPlugin reply (the hardest order a
    /// real runtime produces); if false, reply first as it usually does.
    pub configure_before_register_reply: bool,
}

impl FakeConfig {
    /// containerd 1.7.24: NRI v0.6.1, no version in Configure, events 1-11,
    /// lifecycle events through StateChange.
    pub fn containerd_1_7() -> FakeConfig {
        FakeConfig {
            runtime_name: "containerd".to_string(),
            runtime_version: "1.7.24".to_string(),
            nri_version: String::new(),
            config: String::new(),
            registration_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            pods: Vec::new(),
            containers: Vec::new(),
            sync_chunk: 0,
            configure_before_register_reply: true,
        }
    }

    /// A runtime with NRI v0.12: states its version, accepts events 1-14,
    /// sends one RPC per event.
    pub fn nri_v0_12() -> FakeConfig {
        FakeConfig {
            runtime_version: "2.3.0".to_string(),
            nri_version: "v0.12.0".to_string(),
            ..FakeConfig::containerd_1_7()
        }
    }

    /// What this runtime's NRI version is, as a plugin would work it out.
    pub fn version(&self) -> Option<NriVersion> {
        NriVersion::of_runtime(&self.nri_version, &self.runtime_name, &self.runtime_version)
    }

    /// The events this runtime accepts (the runtime's `ValidEvents`).
    pub fn valid_events(&self) -> EventMask {
        NriVersion::valid_events_of(self.version())
    }

    /// Whether events go through per-event RPCs (NRI v0.12+).
    pub fn per_event_rpcs(&self) -> bool {
        self.version()
            .is_some_and(|v| v >= NriVersion::new(0, 12, 0))
    }
}

/// A fake runtime listening on a unix socket, one plugin at a time.
pub struct FakeRuntime {
    listener: UnixListener,
    config: Arc<FakeConfig>,
}

impl FakeRuntime {
    /// Listens on `path` (kept short: unix socket paths are limited to 107
    /// bytes).
    pub fn bind(path: &Path, config: FakeConfig) -> Result<FakeRuntime, FakeError> {
        Ok(FakeRuntime {
            listener: UnixListener::bind(path)?,
            config: Arc::new(config),
        })
    }

    /// Waits for a plugin to connect, then runs the whole handshake.
    pub async fn accept(&self) -> Result<PluginConn, FakeError> {
        let (stream, _) = self.listener.accept().await?;
        handshake(stream, FakeConfig::clone(&self.config)).await
    }
}

/// Runs the runtime side of the handshake on an already connected stream
/// (the pre-installed case: the runtime holds the other end of a socketpair).
pub async fn handshake(stream: UnixStream, config: FakeConfig) -> Result<PluginConn, FakeError> {
    conn::PluginConn::start(stream, config).await
}

/// A registration waiting for the runtime to configure the plugin; the
/// RegisterPlugin reply is held back until `configured` fires.
struct PendingRegistration {
    request: crate::api::RegisterPluginRequest,
    configured: oneshot::Sender<()>,
}

/// The runtime's own ttrpc service (connection 2).
struct RuntimeService {
    registrations: mpsc::Sender<Result<PendingRegistration, FakeError>>,
    hold_reply: bool,
    /// UpdateContainers requests the plugin sent.
    updates: Arc<Mutex<Vec<crate::api::UpdateContainersRequest>>>,
}
