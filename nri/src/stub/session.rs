//! One connection to the runtime: the registration, then requests answered
//! one at a time until the stream closes.

use std::{
    io,
    os::unix::net::UnixStream,
    sync::Arc,
    time::{Duration, Instant},
};

use protobuf::Message as _;
use ttrpc::{Code, Request, Response};

use super::{
    envelope::{self, RequestView},
    service::Service,
    wire::{reset_buffer, Wire},
    Connector, Plugin, StubError, NRI_API_VERSION, REGISTRATION_TIMEOUT, REGISTRATION_WAIT,
};
use crate::{
    api,
    frame::{
        TtrpcHeader, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, TTRPC_MAX_PAYLOAD, TTRPC_REQUEST,
        TTRPC_RESPONSE,
    },
};

impl<P: Plugin> Connector<P> {
    /// One connection: register, serve, until the close. `Ok` if the
    /// runtime synchronized the plugin, whatever closed the connection later.
    pub(super) fn serve_connection(&self, stream: UnixStream) -> Result<(), StubError> {
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
            tracing::warn!(error = %crate::ErrorChain(&e), "connection to runtime failed");
        }
        Ok(())
    }

    /// Sends the registration, then answers requests until the stream
    /// closes (`Ok(Ok)`) or fails (`Ok(Err)`). The registration reply must
    /// come within [`REGISTRATION_WAIT`]; a Synchronize answered past the
    /// runtime's deadline ends the connection ([`StubError::SyncTooLate`]).
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
        let deadline = Instant::now() + REGISTRATION_WAIT;
        let mut registered = false;
        let mut reply = Vec::new();
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
                    let ms = REGISTRATION_WAIT.as_millis();
                    return Err(register(format!("no reply within {ms} ms")));
                }
                Err(e) => return Ok(Err(e)),
            };
            match (msg.conn, msg.header.kind) {
                (PLUGIN_SERVICE_CONN, TTRPC_REQUEST) => {
                    // The reply is written before the gate opens: a stop that
                    // waits on it ends the process between requests, never
                    // after a handler acted and before the runtime heard.
                    let written = {
                        let _running = self.gate.hold();
                        answer(service, &msg.payload, &mut reply);
                        let header = TtrpcHeader {
                            kind: TTRPC_RESPONSE,
                            flags: 0,
                            ..msg.header
                        };
                        wire.write(PLUGIN_SERVICE_CONN, header, &reply)
                    };
                    if let Err(e) = written {
                        return Ok(Err(e));
                    }
                    // The runtime gave up on it: whether it closes (NRI
                    // v0.7+) or keeps a connection it sends nothing more on
                    // (v0.6.1), only a new connection serves again.
                    if service.sync_too_late() {
                        return Err(StubError::SyncTooLate);
                    }
                    reset_buffer(&mut reply);
                    wire.recycle(msg.payload);
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

/// Puts the encoded `Response` to one request on the plugin connection in
/// `out` (a buffer reused from call to call).
fn answer<P: Plugin>(service: &Service<P>, payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let result = RequestView::decode(payload)
        .map_err(|e| ttrpc::get_status(Code::INVALID_ARGUMENT, format!("decode request: {e}")))
        .and_then(|req| service.handle(&req, out));
    if let Err(status) = result {
        out.clear();
        envelope::encode_status(out, status);
        if out.len() > TTRPC_MAX_PAYLOAD {
            // An error text that long (a plugin's) would end the connection
            // as a reply would.
            out.clear();
            let short = "error reply over the ttrpc limit";
            envelope::encode_status(out, ttrpc::get_status(Code::RESOURCE_EXHAUSTED, short));
        }
    } else if out.len() > TTRPC_MAX_PAYLOAD {
        // Sent, it would end the connection (the runtime refuses a message
        // over the limit), and the plugin with it for every later request.
        let status = ttrpc::get_status(
            Code::RESOURCE_EXHAUSTED,
            format!(
                "reply of {} bytes is over the ttrpc limit of {TTRPC_MAX_PAYLOAD} bytes",
                out.len()
            ),
        );
        out.clear();
        envelope::encode_status(out, status);
    }
}
