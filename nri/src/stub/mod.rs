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

mod deadline;
mod envelope;
mod plugin;
mod preinstalled;
mod rpc;
mod service;
mod session;
mod socket_watch;
mod wire;

use socket_watch::{SocketWatch, Woken};

use crate::ErrorChain;

use std::{
    io,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

#[cfg(feature = "test-util")]
pub use self::deadline::with_request_timeout;
pub use self::{
    deadline::{answer_budget, request_timeout, DEFAULT_REQUEST_TIMEOUT},
    plugin::{CreateReply, EncodedReply, Plugin, RpcError, RuntimeInfo},
    preinstalled::{Preinstalled, ENV_PLUGIN_IDX, ENV_PLUGIN_NAME, ENV_PLUGIN_SOCKET},
};

/// Where containerd and CRI-O listen for external plugins by default.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/nri/nri.sock";
/// The NRI release whose API this crate implements, sent at registration.
pub const NRI_API_VERSION: &str = "v0.12.2";
/// The runtime's registration timeout default (`pkg/api/timeouts.go`), sent
/// as the request's ttrpc timeout: the runtime's handling of it, once read.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the stub waits for the registration's reply. The runtime reads
/// plugin connections one at a time (`acceptPluginConnections`): each plugin
/// ahead of this one may take its registration timeout, Configure's and
/// Synchronize's (5 + 2 + 2 s by default) before containerd reads this
/// registration at all, as after a restart with other plugins reconnecting.
/// Waiting only the runtime's 5 s would give up on a connection the runtime
/// is about to serve and start over at the back of the line; this bound only
/// catches a runtime that never answers.
const REGISTRATION_WAIT: Duration = Duration::from_secs(30);
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);
/// The wait before dialling again after a Synchronize the runtime gave up
/// on: each try holds the runtime's sync of its pods for its whole deadline,
/// so one that keeps running late is not repeated every few seconds.
const LATE_SYNC_RETRY: Duration = Duration::from_secs(30);
/// A connection that synchronized but closed sooner than this counts as
/// turned down, not as one that served: a runtime closes a plugin whose
/// Synchronize reply it cannot take (updates it fails to apply, a reply too
/// large or too late), and would do so again at once. The delay then keeps
/// growing, instead of a full handshake and state dump every 100 ms under
/// the runtime's NRI lock.
const SERVED: Duration = Duration::from_secs(10);

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
    #[error(
        "the plugin answered synchronize after the runtime's deadline, so the runtime dropped it"
    )]
    SyncTooLate,
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

/// Held by the stub while a handler runs and its reply is written. Whoever
/// holds it knows no request is half handled or unanswered and none starts: a
/// process that exits on a signal takes it before it exits, so that it ends between
/// requests, never inside one.
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
    /// every connection that synchronized and served for [`SERVED`], and cut
    /// short when the runtime creates its socket again ([`SocketWatch`]).
    fn redial(&self, path: &Path) -> Result<(), StubError> {
        let mut delay = FIRST_RETRY;
        let mut watch = SocketWatch::new(path);
        let mut warned = false;
        loop {
            let dialled = std::time::Instant::now();
            let result = match UnixStream::connect(path) {
                Ok(stream) => self.serve_connection(stream),
                Err(source) => Err(StubError::Connect {
                    path: path.to_path_buf(),
                    source,
                }),
            };
            match result {
                Ok(()) if dialled.elapsed() >= SERVED => {
                    tracing::info!(socket = %path.display(), "connection to runtime closed; reconnecting");
                    delay = FIRST_RETRY;
                    warned = false;
                }
                Ok(()) if !warned => {
                    tracing::warn!(socket = %path.display(), "the runtime closed the connection soon after synchronizing; retrying with backoff");
                    warned = true;
                }
                Ok(()) => {
                    tracing::debug!(retry_in_ms = %delay.as_millis(), "the runtime closed the connection soon after synchronizing");
                }
                Err(StubError::SyncTooLate) => {
                    tracing::warn!(retry_in_s = LATE_SYNC_RETRY.as_secs(), "synchronize ran past the runtime's deadline; if it keeps doing so, raise the runtime's plugin request timeout");
                    delay = LATE_SYNC_RETRY;
                }
                // Warn on the first failure of a series only: a runtime that
                // is down for minutes would otherwise flood the log.
                Err(e) if !warned => {
                    tracing::warn!(error = %ErrorChain(&e), "cannot reach the runtime; retrying");
                    warned = true;
                }
                Err(e) => {
                    tracing::debug!(error = %ErrorChain(&e), retry_in_ms = %delay.as_millis(), "cannot reach the runtime");
                }
            }
            if watch.is_none() {
                // The directory may only now exist (the runtime makes it).
                watch = SocketWatch::new(path);
            }
            match watch.as_ref().map(|w| w.wait(delay)) {
                // The socket may be bound but not yet listening: retry soon.
                Some(Woken::Created) => delay = FIRST_RETRY,
                Some(Woken::TimedOut) => delay = (delay * 2).min(MAX_RETRY),
                // Watched anew after the next dial, once the directory is back.
                Some(Woken::Gone) => {
                    watch = None;
                    delay = FIRST_RETRY;
                }
                None => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(MAX_RETRY);
                }
            }
        }
    }
}

/// The runtime's checks on external plugins (`pkg/api/plugin.go`
/// `CheckPluginIndex`, and `CheckPluginName` from NRI v0.12).
/// Whether `name` and `idx` make a plugin identity the runtime accepts (two
/// digits; a name of `[A-Za-z0-9_.+-]`): checked before a plugin sets itself
/// up, and again when it is served.
pub fn check_identity(name: &str, idx: &str) -> Result<(), StubError> {
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

#[cfg(test)]
mod tests;
