//! The plugin side of NRI: connect, register, serve, and reconnect.
//!
//! Handshake (nri.md §1, `pkg/stub/stub.go`): over one unix stream split into
//! connections ([`crate::frame`]), the plugin serves the `Plugin` service on
//! connection 1 and calls `Runtime.RegisterPlugin` on connection 2. The
//! runtime answers with `Configure` right after accepting the registration,
//! which can overtake the registration reply, so requests are served while
//! the reply is awaited.
//!
//! Everything runs on the calling thread: [`Stub::run`] blocks, reading a
//! request, running its handler and writing the reply before it reads the
//! next. A runtime sends a plugin one request at a time, so this costs no
//! parallelism, and it keeps the path of a CreateContainer to one read, the
//! handler, and one write.
//!
//! Two ways in:
//! - dial the runtime's socket ([`Stub::with_socket_path`], default
//!   [`DEFAULT_SOCKET_PATH`]); the runtime never reconnects to a plugin, so
//!   when the connection closes (runtime restart) the stub dials again with
//!   capped exponential backoff and registers anew;
//! - pre-installed: the runtime started us with the connection on a file
//!   descriptor ([`Preinstalled::from_env`]); when that closes the runtime
//!   is done with us and [`Stub::run`] returns.

mod plugin;
mod preinstalled;
mod rpc;
mod service;
mod wire;

use std::{
    io,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use protobuf::Message as _;
use ttrpc::{Code, Request, Response};

pub use self::{
    plugin::{Plugin, RpcError, RuntimeInfo},
    preinstalled::{Preinstalled, ENV_PLUGIN_IDX, ENV_PLUGIN_NAME, ENV_PLUGIN_SOCKET},
};
use self::{service::Service, wire::Wire};
use crate::{
    api,
    frame::{
        TtrpcHeader, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, TTRPC_REQUEST, TTRPC_RESPONSE,
    },
};

/// Where containerd and CRI-O listen for external plugins by default.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/nri/nri.sock";
/// The NRI release whose API this crate implements, sent at registration.
pub const NRI_API_VERSION: &str = "v0.12.2";
/// The runtime's registration timeout default (`pkg/api/timeouts.go`).
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StubError {
    #[error("plugin index {idx:?} is not two ascii digits")]
    InvalidIndex { idx: String },
    #[error("plugin name {name:?} must be non-empty and use only [A-Za-z0-9_.+-]")]
    InvalidName { name: String },
    #[error("plugin subscribes to no events")]
    NoEvents,
    #[error("environment variable {var} is {problem}")]
    Env { var: &'static str, problem: String },
    #[error("file descriptor {fd} from {ENV_PLUGIN_SOCKET}")]
    InheritedFd {
        fd: i32,
        #[source]
        source: io::Error,
    },
    #[error("adopt the connection from the runtime")]
    Adopt {
        #[source]
        source: io::Error,
    },
    #[error("connect to {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("register with the runtime: {reason}")]
    Register { reason: String },
    #[error("runtime closed the connection before synchronizing")]
    Refused {
        #[source]
        source: Option<io::Error>,
    },
}

enum Transport {
    Socket(PathBuf),
    Connected(std::os::unix::net::UnixStream),
}

/// Runs a [`Plugin`] against a runtime.
pub struct Stub<P> {
    conn: Connector<P>,
    transport: Transport,
}

/// What every connection needs: the plugin and the identity it registers.
struct Connector<P> {
    plugin: Arc<P>,
    name: String,
    idx: String,
    gate: RequestGate,
}

/// Held by the stub while a handler runs. Whoever holds it knows no request
/// is half handled and none starts: a process that exits on a signal takes it
/// first, so that it ends between requests, never inside one.
#[derive(Clone, Default)]
pub struct RequestGate(Arc<std::sync::Mutex<()>>);

impl RequestGate {
    /// Waits for the handler in progress, if any, and keeps new ones out
    /// until the guard is dropped.
    pub fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<P: Plugin> Stub<P> {
    /// A stub that dials [`DEFAULT_SOCKET_PATH`]; set the name and index
    /// before running it.
    pub fn new(plugin: P) -> Stub<P> {
        Stub {
            conn: Connector {
                plugin: Arc::new(plugin),
                name: String::new(),
                idx: String::new(),
                gate: RequestGate::default(),
            },
            transport: Transport::Socket(PathBuf::from(DEFAULT_SOCKET_PATH)),
        }
    }

    /// A stub for a plugin the runtime launched: name, index and
    /// connection come from the runtime.
    pub fn preinstalled(plugin: P, runtime: Preinstalled) -> Stub<P> {
        Stub::new(plugin)
            .with_name(runtime.name)
            .with_idx(runtime.idx)
            .with_connection(runtime.stream)
    }

    /// Name registered with the runtime.
    pub fn with_name(mut self, name: impl Into<String>) -> Stub<P> {
        self.conn.name = name.into();
        self
    }

    /// Two-digit index; the runtime calls plugins in ascending order.
    pub fn with_idx(mut self, idx: impl Into<String>) -> Stub<P> {
        self.conn.idx = idx.into();
        self
    }

    /// Dial this socket, and dial again whenever the connection closes.
    pub fn with_socket_path(mut self, path: impl AsRef<Path>) -> Stub<P> {
        self.transport = Transport::Socket(path.as_ref().to_path_buf());
        self
    }

    /// Use an already connected stream; [`Stub::run`] returns when it closes.
    pub fn with_connection(mut self, stream: std::os::unix::net::UnixStream) -> Stub<P> {
        self.transport = Transport::Connected(stream);
        self
    }

    pub fn plugin(&self) -> &Arc<P> {
        &self.conn.plugin
    }

    /// The gate every request passes while its handler runs.
    pub fn request_gate(&self) -> RequestGate {
        self.conn.gate.clone()
    }

    /// Serves the plugin on this thread. With a socket path this never
    /// returns `Ok`; with a given connection it returns once that closes.
    pub fn run(self) -> Result<(), StubError> {
        let Stub { conn, transport } = self;
        check_identity(&conn.name, &conn.idx)?;
        if conn.plugin.events().is_empty() {
            return Err(StubError::NoEvents);
        }
        match transport {
            Transport::Connected(stream) => {
                stream
                    .set_nonblocking(false)
                    .map_err(|source| StubError::Adopt { source })?;
                conn.serve_connection(stream)
            }
            Transport::Socket(path) => conn.redial(&path),
        }
    }
}

impl<P: Plugin> Connector<P> {
    /// Dials `path` for ever; backoff 100 ms doubling to 5 s, reset by
    /// every connection that got as far as synchronizing.
    fn redial(&self, path: &Path) -> Result<(), StubError> {
        let mut delay = FIRST_RETRY;
        loop {
            let result = match UnixStream::connect(path) {
                Ok(stream) => self.serve_connection(stream),
                Err(source) => Err(StubError::Connect {
                    path: path.to_path_buf(),
                    source,
                }),
            };
            match result {
                Ok(()) => {
                    tracing::info!(socket = %path.display(), "connection to runtime closed; reconnecting");
                    delay = FIRST_RETRY;
                }
                // Warn on the first failure of a series only: a runtime that
                // is down for minutes would otherwise flood the log.
                Err(e) if delay == FIRST_RETRY => {
                    tracing::warn!(error = %ErrorChain(&e), "cannot reach the runtime; retrying");
                }
                Err(e) => {
                    tracing::debug!(error = %ErrorChain(&e), retry_in_ms = %delay.as_millis(), "cannot reach the runtime");
                }
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(MAX_RETRY);
        }
    }

    /// One connection: register, serve, until the close. `Ok` if the
    /// runtime synchronized the plugin, whatever closed the connection later.
    fn serve_connection(&self, stream: UnixStream) -> Result<(), StubError> {
        let service = Service::new(Arc::clone(&self.plugin));
        let mut wire = Wire::new(stream);
        let closed = self.exchange(&service, &mut wire);
        self.plugin.on_close();
        let closed = closed?;
        // Closed before the handshake finished: the runtime refused the
        // plugin (e.g. at Configure); count it as a failure so that the
        // next attempt backs off instead of looping every 100 ms.
        if !service.is_synchronized() {
            return Err(StubError::Refused {
                source: closed.err(),
            });
        }
        if let Err(e) = closed {
            tracing::warn!(error = %e, "connection to runtime failed");
        }
        Ok(())
    }

    /// Sends the registration, then answers requests until the stream
    /// closes (`Ok(Ok)`) or fails (`Ok(Err)`). The registration reply must
    /// come within [`REGISTRATION_TIMEOUT`].
    fn exchange(&self, service: &Service<P>, wire: &mut Wire) -> Result<io::Result<()>, StubError> {
        let register = |reason: String| StubError::Register { reason };
        let req = api::RegisterPluginRequest {
            plugin_name: self.name.clone(),
            plugin_idx: self.idx.clone(),
            NRI_version: NRI_API_VERSION.to_string(),
            ..Default::default()
        };
        let req = Request {
            service: "nri.pkg.api.v1alpha1.Runtime".to_string(),
            method: "RegisterPlugin".to_string(),
            payload: req.write_to_bytes().map_err(|e| register(e.to_string()))?,
            timeout_nano: REGISTRATION_TIMEOUT.as_nanos() as i64,
            ..Default::default()
        };
        let payload = req.write_to_bytes().map_err(|e| register(e.to_string()))?;
        let header = TtrpcHeader {
            length: 0,
            stream_id: REGISTER_STREAM,
            kind: TTRPC_REQUEST,
            flags: 0,
        };
        if let Err(e) = wire.write(RUNTIME_SERVICE_CONN, header, &payload) {
            return Ok(Err(e));
        }
        let deadline = Instant::now() + REGISTRATION_TIMEOUT;
        let mut registered = false;
        loop {
            if !registered {
                let left = deadline.saturating_duration_since(Instant::now());
                if let Err(e) = wire.set_read_timeout(Some(left.max(Duration::from_millis(1)))) {
                    return Ok(Err(e));
                }
            }
            let msg = match wire.read() {
                Ok(Some(msg)) => msg,
                Ok(None) => return Ok(Ok(())),
                Err(e) if !registered && is_timeout(&e) => {
                    let ms = REGISTRATION_TIMEOUT.as_millis();
                    return Err(register(format!("no reply within {ms} ms")));
                }
                Err(e) => return Ok(Err(e)),
            };
            match (msg.conn, msg.header.kind) {
                (PLUGIN_SERVICE_CONN, TTRPC_REQUEST) => {
                    let reply = {
                        let _running = self.gate.hold();
                        answer(service, &msg.payload)
                    };
                    let header = TtrpcHeader {
                        kind: TTRPC_RESPONSE,
                        flags: 0,
                        ..msg.header
                    };
                    if let Err(e) = wire.write(PLUGIN_SERVICE_CONN, header, &reply) {
                        return Ok(Err(e));
                    }
                }
                (RUNTIME_SERVICE_CONN, TTRPC_RESPONSE)
                    if !registered && msg.header.stream_id == REGISTER_STREAM =>
                {
                    let resp = Response::parse_from_bytes(&msg.payload)
                        .map_err(|e| register(format!("decode reply: {e}")))?;
                    if resp.status.code() != Code::OK {
                        return Err(register(resp.status.message().to_string()));
                    }
                    registered = true;
                    if let Err(e) = wire.set_read_timeout(None) {
                        return Ok(Err(e));
                    }
                    tracing::info!(name = %self.name, idx = %self.idx, "registered with the runtime");
                }
                (conn, kind) => {
                    tracing::debug!(
                        conn,
                        kind,
                        stream = msg.header.stream_id,
                        "ignoring unexpected ttrpc message"
                    );
                }
            }
        }
    }
}

/// The stream id of the registration: the first (odd) id of our client side.
const REGISTER_STREAM: u32 = 1;

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// The encoded `Response` to one request on the plugin connection.
fn answer<P: Plugin>(service: &Service<P>, payload: &[u8]) -> Vec<u8> {
    let result = Request::parse_from_bytes(payload)
        .map_err(|e| ttrpc::get_status(Code::INVALID_ARGUMENT, format!("decode request: {e}")))
        .and_then(|req| service.handle(&req));
    let resp = match result {
        Ok(payload) => Response {
            status: Some(ttrpc::get_status(Code::OK, "")).into(),
            payload,
            ..Default::default()
        },
        Err(status) => Response {
            status: Some(status).into(),
            ..Default::default()
        },
    };
    // Encoding a message of set fields cannot fail; an empty reply would
    // still tell the runtime something went wrong.
    resp.write_to_bytes().unwrap_or_default()
}

/// The runtime's checks on external plugins (`pkg/api/plugin.go`
/// `CheckPluginIndex`, and `CheckPluginName` from NRI v0.12).
fn check_identity(name: &str, idx: &str) -> Result<(), StubError> {
    if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return Err(StubError::InvalidIndex {
            idx: idx.to_string(),
        });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-');
    if name.is_empty() || !name.chars().all(allowed) {
        return Err(StubError::InvalidName {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// Displays an error with its `source()` chain, `a: b: c`.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
