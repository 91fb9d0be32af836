//! The stub against hand-made frames: what a Go ttrpc client sends and
//! expects, byte for byte, including the cases the fake runtime never makes.

use std::io::{Read, Write};

use protobuf::Message as _;
use ttrpc::{Request, Response};

use super::*;
use crate::frame::{decode_mux_header, TtrpcHeader, TTRPC_REQUEST, TTRPC_RESPONSE};

/// The runtime's end of a connected stub.
struct RawRuntime {
    stream: std::os::unix::net::UnixStream,
    next_stream: u32,
}

impl RawRuntime {
    fn send(&mut self, conn: u32, header: TtrpcHeader, payload: &[u8]) {
        let mut msg = header.encode().to_vec();
        msg.extend_from_slice(payload);
        let mut frame = conn.to_be_bytes().to_vec();
        frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        frame.extend_from_slice(&msg);
        self.stream.write_all(&frame).unwrap();
    }

    /// The next whole message, reassembled from the stub's frames.
    fn recv(&mut self) -> (u32, TtrpcHeader, Vec<u8>) {
        let mut data = Vec::new();
        loop {
            let mut h = [0u8; 8];
            self.stream.read_exact(&mut h).unwrap();
            let (c, len) = decode_mux_header(h);
            // What Go's 4 KiB bufio reader takes: the frame that starts a
            // message fits it; the one remainder frame ends with the message.
            assert!(
                !data.is_empty() || len <= crate::frame::MAX_FRAME_PAYLOAD,
                "first frame of {len} bytes"
            );
            let mut payload = vec![0u8; len];
            self.stream.read_exact(&mut payload).unwrap();
            data.extend_from_slice(&payload);
            if data.len() >= 10 {
                let header = TtrpcHeader::decode(data[..10].try_into().unwrap());
                assert!(data.len() <= 10 + header.length, "frame past the message");
                if data.len() == 10 + header.length {
                    return (c, header, data[10..].to_vec());
                }
            }
        }
    }

    /// Calls `method` of the Plugin service; returns the response.
    fn call(&mut self, method: &str, payload: Vec<u8>) -> Response {
        self.call_within(method, payload, 0)
    }

    /// [`RawRuntime::call`] with the request's deadline, `timeout_nano`.
    fn call_within(&mut self, method: &str, payload: Vec<u8>, timeout_nano: i64) -> Response {
        let req = Request {
            service: "nri.pkg.api.v1alpha1.Plugin".to_string(),
            method: method.to_string(),
            payload,
            timeout_nano,
            ..Default::default()
        };
        let stream_id = self.next_stream;
        self.next_stream += 2;
        let header = TtrpcHeader {
            length: 0,
            stream_id,
            kind: TTRPC_REQUEST,
            flags: 0,
        };
        let bytes = req.write_to_bytes().unwrap();
        self.send(
            1,
            TtrpcHeader {
                length: bytes.len(),
                ..header
            },
            &bytes,
        );
        let (conn, h, body) = self.recv();
        assert_eq!((conn, h.stream_id, h.kind), (1, stream_id, TTRPC_RESPONSE));
        Response::parse_from_bytes(&body).unwrap()
    }
}

/// A stub serving one end of a socket pair, registered.
fn registered(events: EventMask) -> (RawRuntime, std::thread::JoinHandle<Result<(), StubError>>) {
    registered_after(events, std::time::Duration::ZERO)
}

/// [`registered`], the runtime answering the registration `delay` after it came.
fn registered_after(
    events: EventMask,
    delay: std::time::Duration,
) -> (RawRuntime, std::thread::JoinHandle<Result<(), StubError>>) {
    registered_plugin(Recorder::new(events), delay)
}

/// [`registered_after`] for `plugin`.
fn registered_plugin(
    plugin: Recorder,
    delay: std::time::Duration,
) -> (RawRuntime, std::thread::JoinHandle<Result<(), StubError>>) {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let stub = Stub::new(plugin)
        .with_name("raw")
        .with_idx("10")
        .with_connection(ours);
    let running = std::thread::spawn(move || stub.run());
    let mut rt = RawRuntime {
        stream: theirs,
        next_stream: 1,
    };
    let (conn, h, body) = rt.recv();
    assert_eq!((conn, h.stream_id, h.kind), (2, 1, TTRPC_REQUEST));
    let req = Request::parse_from_bytes(&body).unwrap();
    assert_eq!(
        (req.service.as_str(), req.method.as_str()),
        ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
    );
    std::thread::sleep(delay);
    let reply = Response {
        status: Some(ttrpc::get_status(Code::OK, "")).into(),
        payload: crate::api::Empty::default().write_to_bytes().unwrap(),
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap();
    let header = TtrpcHeader {
        length: reply.len(),
        stream_id: 1,
        kind: TTRPC_RESPONSE,
        flags: 0,
    };
    rt.send(2, header, &reply);
    (rt, running)
}

#[test]
fn unknown_methods_and_services_are_unimplemented_as_in_go_ttrpc() {
    let (mut rt, running) = registered(create_and_remove());
    let resp = rt.call("NoSuchMethod", Vec::new());
    assert_eq!(resp.status.code(), Code::UNIMPLEMENTED);
    assert_eq!(resp.status.message(), "method NoSuchMethod");
    // The name echoed is cut: a long one cannot swell the reply.
    let long = "é".repeat(500_000);
    let resp = rt.call(&long, Vec::new());
    assert_eq!(resp.status.code(), Code::UNIMPLEMENTED);
    assert_eq!(resp.status.message(), format!("method {}", "é".repeat(128)));
    // A request that does not decode is refused, and the stub keeps serving.
    let resp = rt.call("CreateContainer", vec![0xff, 0xff, 0xff]);
    assert_eq!(resp.status.code(), Code::INVALID_ARGUMENT);
    let resp = rt.call("Shutdown", Vec::new());
    assert_eq!(resp.status.code(), Code::OK);
    drop(rt);
    // Closed before any Synchronize: a refusal.
    let result = running.join().unwrap();
    assert!(
        matches!(result, Err(StubError::Refused { .. })),
        "{result:?}"
    );
}

#[test]
fn a_large_reply_is_split_into_frames_and_reassembles() {
    let (mut rt, _running) = registered(create_and_remove());
    let pod = crate::api::PodSandbox {
        name: "p".repeat(10_000),
        ..Default::default()
    };
    let req = crate::api::CreateContainerRequest {
        pod: Some(pod).into(),
        container: Some(ctr("c")).into(),
        ..Default::default()
    };
    let resp = rt.call("CreateContainer", req.write_to_bytes().unwrap());
    assert_eq!(resp.status.code(), Code::OK);
    let reply = crate::api::CreateContainerResponse::parse_from_bytes(&resp.payload).unwrap();
    assert_eq!(reply.adjust.env[0].value.len(), 10_000);
}

/// A reply over ttrpc's limit would make the runtime drop the connection
/// (and the plugin with it, for every later container): the call fails
/// instead, naming the limit, and the stub keeps serving.
#[test]
fn a_reply_over_the_ttrpc_limit_fails_the_call_and_keeps_the_connection() {
    let (mut rt, _running) = registered(create_and_remove());
    let request = |name: &str| crate::api::CreateContainerRequest {
        pod: Some(pod("p")).into(),
        container: Some(ctr(name)).into(),
        ..Default::default()
    };
    let resp = rt.call("CreateContainer", request("huge").write_to_bytes().unwrap());
    assert_eq!(resp.status.code(), Code::RESOURCE_EXHAUSTED);
    assert!(
        resp.status
            .message()
            .contains("over the ttrpc limit of 4194304 bytes"),
        "{}",
        resp.status.message()
    );
    let resp = rt.call("CreateContainer", request("c").write_to_bytes().unwrap());
    assert_eq!(resp.status.code(), Code::OK);
    // An error as long: its text is not sent.
    let resp = rt.call(
        "CreateContainer",
        request("huge-error").write_to_bytes().unwrap(),
    );
    assert_eq!(resp.status.code(), Code::RESOURCE_EXHAUSTED);
    assert_eq!(resp.status.message(), "error reply over the ttrpc limit");
    let resp = rt.call("CreateContainer", request("c").write_to_bytes().unwrap());
    assert_eq!(resp.status.code(), Code::OK);
}

/// containerd reads plugin connections one at a time, each plugin ahead taking
/// up to its registration, Configure and Synchronize timeouts (5 + 2 + 2 s)
/// after a restart: a registration answered later than the runtime's own 5 s
/// is still taken, not given up on to start again at the back of the line.
#[test]
fn a_registration_answered_after_the_runtimes_5_s_is_kept() {
    let delay = std::time::Duration::from_millis(6_500);
    let (mut rt, running) = registered_after(create_and_remove(), delay);
    let resp = rt.call("NoSuchMethod", Vec::new());
    assert_eq!(resp.status.code(), Code::UNIMPLEMENTED, "still serving");
    assert!(!running.is_finished(), "the stub gave up");
}

/// A Synchronize chunk naming more pods than the stub holds is refused
/// before it is decoded: its entries here are not valid pods, which a
/// decode would report instead. At the bound itself the chunk is decoded
/// (and its entries found invalid), and the stub serves on.
#[test]
fn a_synchronize_over_the_bound_is_refused_before_it_is_decoded() {
    let (mut rt, _running) = registered(create_and_remove());
    // Pods (field 1), each a pod whose first field is cut short.
    let pods = |n: usize| [0x0a, 0x01, 0x08].repeat(n);
    let reply = rt.call("Synchronize", pods((1 << 16) + 1));
    assert_eq!(reply.status.code(), Code::RESOURCE_EXHAUSTED, "{reply:?}");
    assert!(
        reply.status.message().contains("more than 65536"),
        "{reply:?}"
    );
    let reply = rt.call("Synchronize", pods(1 << 16));
    assert_eq!(reply.status.code(), Code::INVALID_ARGUMENT, "{reply:?}");
    let reply = rt.call("Synchronize", Vec::new());
    assert_eq!(reply.status.code(), Code::OK, "{reply:?}");
}

/// A stub whose Synchronize takes 300 ms, configured by containerd 1.7.24
/// stating a 100 ms request timeout, and the reply to a Synchronize that
/// carries `timeout_nano`.
fn synchronized_within(
    timeout_nano: i64,
) -> (
    RawRuntime,
    std::thread::JoinHandle<Result<(), StubError>>,
    Response,
) {
    let plugin = Recorder {
        sync_stall: Some(std::time::Duration::from_millis(300)),
        ..Recorder::new(create_and_remove())
    };
    let (mut rt, running) = registered_plugin(plugin, std::time::Duration::ZERO);
    let configure = crate::api::ConfigureRequest {
        runtime_name: "containerd".into(),
        runtime_version: "1.7.24".into(),
        request_timeout: 100,
        ..Default::default()
    };
    let reply = rt.call("Configure", configure.write_to_bytes().unwrap());
    assert_eq!(reply.status.code(), Code::OK);
    let sync = crate::api::SynchronizeRequest::default()
        .write_to_bytes()
        .unwrap();
    let reply = rt.call_within("Synchronize", sync, timeout_nano);
    (rt, running, reply)
}

/// A Synchronize answered past the runtime's deadline: the runtime dropped
/// the plugin. containerd 1.7.25 and older (NRI v0.6.1) keep the connection
/// open and never send on it again, so the stub answers with the deadline's
/// error and ends the connection itself, to be dialled again.
#[test]
fn a_synchronize_answered_too_late_ends_the_connection() {
    let (mut rt, running, reply) = synchronized_within(100_000_000);
    assert_eq!(reply.status.code(), Code::DEADLINE_EXCEEDED, "{reply:?}");
    // The runtime keeps its end open: the stub closes the connection.
    rt.stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    let read = rt.stream.read_to_end(&mut rest);
    assert!(matches!(read, Ok(0)), "{read:?} {rest:?}");
    let result = running.join().unwrap();
    assert!(matches!(result, Err(StubError::SyncTooLate)), "{result:?}");
}

/// The request's own deadline decides: NRI v0.6.1 states no timeout at
/// Configure, and a runtime whose operator raised it sends the longer
/// deadline with the request only. A Synchronize within it is answered.
#[test]
fn a_synchronize_within_the_requests_own_deadline_is_answered() {
    let (_rt, _running, reply) = synchronized_within(10_000_000_000);
    assert_eq!(reply.status.code(), Code::OK, "{reply:?}");
}
