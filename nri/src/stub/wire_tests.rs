use std::{io::Write, thread, time::Instant};

use super::*;
use crate::frame::{TTRPC_REQUEST, TTRPC_RESPONSE};

fn ttrpc(stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let header = TtrpcHeader {
        length: payload.len(),
        stream_id,
        kind: TTRPC_REQUEST,
        flags: 0,
    };
    [header.encode().as_slice(), payload].concat()
}

fn frame(conn: ConnId, data: &[u8]) -> Vec<u8> {
    let mut out = conn.to_be_bytes().to_vec();
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// Sends `chunks` as separate writes with pauses, so that reads see them apart.
fn wire_fed_by(chunks: Vec<Vec<u8>>) -> Wire {
    let (ours, mut peer) = UnixStream::pair().unwrap();
    thread::spawn(move || {
        for chunk in chunks {
            peer.write_all(&chunk).unwrap();
            thread::sleep(Duration::from_millis(5));
        }
    });
    Wire::new(ours)
}

fn read_all(wire: &mut Wire) -> Vec<(ConnId, u32, Vec<u8>)> {
    let mut got = Vec::new();
    while let Some(m) = wire.read().unwrap() {
        got.push((m.conn, m.header.stream_id, m.payload));
    }
    got
}

#[test]
fn messages_are_reassembled_however_frames_and_reads_cut_them() {
    let big: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let msg1 = ttrpc(1, b"configure");
    let msg2 = ttrpc(3, &big);
    let msg3 = ttrpc(1, b"registered");
    // msg1 split over two frames; msg2 over three frames and two writes; an
    // unknown connection in between; msg3 on conn 2 sharing a write.
    let mut first = frame(1, &msg1[..4]);
    first.extend(frame(1, &msg1[4..]));
    first.extend(frame(9, b"ignored"));
    first.extend(frame(1, &msg2[..4096]));
    let half = frame(1, &msg2[4096..8192]);
    let second = half[..100].to_vec();
    let mut third = half[100..].to_vec();
    third.extend(frame(1, &msg2[8192..]));
    third.extend(frame(2, &msg3));
    let mut wire = wire_fed_by(vec![first, second, third]);
    let got = read_all(&mut wire);
    assert_eq!(
        got,
        [
            (1, 1, b"configure".to_vec()),
            (1, 3, big),
            (2, 1, b"registered".to_vec()),
        ]
    );
}

/// A frame of connection 2 arriving while connection 1's message is still
/// incomplete: each connection is reassembled on its own.
#[test]
fn interleaved_connections_keep_their_own_partial_messages() {
    let one = ttrpc(1, &[1u8; 300]);
    let two = ttrpc(5, &[2u8; 200]);
    let chunks = vec![
        frame(1, &one[..150]),
        frame(2, &two[..20]),
        frame(1, &one[150..]),
        frame(2, &two[20..]),
    ];
    let mut wire = wire_fed_by(chunks);
    let got = read_all(&mut wire);
    assert_eq!(got, [(1, 1, vec![1u8; 300]), (2, 5, vec![2u8; 200])]);
}

/// Many messages in one frame are taken in place: the bytes after each are
/// not shifted down, and every message comes out in order.
#[test]
fn messages_sharing_a_frame_are_taken_without_shifting_the_rest() {
    let msgs: Vec<Vec<u8>> = (0..1000u32)
        .map(|i| ttrpc(2 * i + 1, &i.to_be_bytes()))
        .collect();
    let mut wire = wire_fed_by(vec![frame(1, &msgs.concat())]);
    let first = wire.read().unwrap().unwrap();
    assert_eq!(
        (first.header.stream_id, first.payload),
        (1, 0u32.to_be_bytes().to_vec())
    );
    let stream = &wire.conns[0];
    assert_eq!(stream.pos, msgs[0].len());
    assert_eq!(stream.buf.len(), msgs.iter().map(Vec::len).sum::<usize>());
    let rest = read_all(&mut wire);
    assert_eq!(rest.len(), 999);
    for (i, (conn, id, payload)) in rest.into_iter().enumerate() {
        let n = i as u32 + 1;
        assert_eq!(
            (conn, id, payload),
            (1, 2 * n + 1, n.to_be_bytes().to_vec())
        );
    }
    assert_eq!((wire.conns[0].pos, wire.conns[0].buf.len()), (0, 0));
}

#[test]
fn oversized_frames_and_messages_are_refused() {
    let mut huge_frame = 1u32.to_be_bytes().to_vec();
    huge_frame.extend_from_slice(&((MAX_PEER_PAYLOAD as u32) + 1).to_be_bytes());
    let mut wire = wire_fed_by(vec![huge_frame]);
    assert_eq!(wire.read().unwrap_err().kind(), io::ErrorKind::InvalidData);

    let mut header = TtrpcHeader {
        length: TTRPC_MAX_PAYLOAD + 1,
        stream_id: 1,
        kind: TTRPC_REQUEST,
        flags: 0,
    }
    .encode()
    .to_vec();
    header.truncate(TTRPC_HEADER_LEN);
    let mut wire = wire_fed_by(vec![frame(1, &header)]);
    assert_eq!(wire.read().unwrap_err().kind(), io::ErrorKind::InvalidData);
}

/// A runtime that stops reading: the write gives up instead of hanging.
#[test]
fn a_reply_the_runtime_never_reads_times_out() {
    let (ours, _peer) = UnixStream::pair().unwrap();
    let mut wire = Wire::new(ours);
    wire.set_write_timeout(std::time::Duration::from_millis(100))
        .unwrap();
    let header = TtrpcHeader {
        length: 0,
        stream_id: 7,
        kind: TTRPC_RESPONSE,
        flags: 0,
    };
    let payload = vec![0u8; 3 << 20];
    let e = wire
        .write(PLUGIN_SERVICE_CONN, header, &payload)
        .unwrap_err();
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{e}"
    );
}

#[test]
fn a_reply_goes_out_as_frames_the_go_side_can_read() {
    let (ours, mut peer) = UnixStream::pair().unwrap();
    let mut wire = Wire::new(ours);
    let payload: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let header = TtrpcHeader {
        length: 0,
        stream_id: 7,
        kind: TTRPC_RESPONSE,
        flags: 0,
    };
    wire.write(PLUGIN_SERVICE_CONN, header, &payload).unwrap();
    drop(wire);
    let mut raw = Vec::new();
    peer.read_to_end(&mut raw).unwrap();
    // Two frames: 4096 bytes (header and the payload's start), then the rest.
    let (conn, n) = decode_mux_header(raw[..8].try_into().unwrap());
    assert_eq!((conn, n), (1, 4096));
    let (conn, m) = decode_mux_header(raw[8 + n..16 + n].try_into().unwrap());
    assert_eq!((conn, m), (1, TTRPC_HEADER_LEN + 5000 - 4096));
    let message = [&raw[8..8 + n], &raw[16 + n..]].concat();
    let got = TtrpcHeader::decode(message[..10].try_into().unwrap());
    assert_eq!(
        got,
        TtrpcHeader {
            length: 5000,
            ..header
        }
    );
    assert_eq!(&message[10..], payload.as_slice());
}

#[test]
fn buffers_grown_for_a_large_message_are_given_back() {
    let big = vec![7u8; 3 * KEEP_CAPACITY];
    let msg = ttrpc(1, &big);
    let mut frames = Vec::new();
    for chunk in msg.chunks(200_000) {
        frames.extend(frame(1, chunk));
    }
    frames.extend(frame(1, &ttrpc(3, b"small")));
    let (ours, mut peer) = UnixStream::pair().unwrap();
    // The peer sends, then drains what the wire writes back until it closes.
    let drain = thread::spawn(move || {
        peer.write_all(&frames).unwrap();
        std::io::copy(&mut peer, &mut std::io::sink()).unwrap()
    });
    let mut wire = Wire::new(ours);
    let m = wire.read().unwrap().unwrap();
    assert_eq!(m.payload.len(), big.len());
    wire.recycle(m.payload);
    assert_eq!(
        wire.spare.capacity(),
        0,
        "a large payload buffer is not kept"
    );
    let m = wire.read().unwrap().unwrap();
    assert_eq!(m.payload, b"small");
    assert!(wire.conns[0].buf.capacity() <= KEEP_CAPACITY);
    assert!(wire.rbuf.len() <= READ_CHUNK);
    wire.write(PLUGIN_SERVICE_CONN, m.header, &big).unwrap();
    assert!(wire.message.capacity() <= KEEP_CAPACITY && wire.wbuf.capacity() <= KEEP_CAPACITY);
    wire.recycle(m.payload);
    assert!(wire.spare.capacity() > 0, "a small one is");
    drop(wire);
    assert!(drain.join().unwrap() > big.len() as u64);
}

#[test]
fn a_read_timeout_ends_a_silent_wait_and_resets_to_waiting_forever() {
    let (ours, mut peer) = UnixStream::pair().unwrap();
    let mut wire = Wire::new(ours);
    wire.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let start = Instant::now();
    let err = wire.read().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
    assert!(start.elapsed() >= Duration::from_millis(50));

    // Without a bound, a message that comes late is still read.
    wire.set_read_timeout(None).unwrap();
    let late = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        peer.write_all(&frame(1, &ttrpc(7, b"late"))).unwrap();
        peer
    });
    let msg = wire.read().unwrap().unwrap();
    assert_eq!((msg.header.stream_id, msg.payload), (7, b"late".to_vec()));
    drop(late.join().unwrap());
    assert!(wire.read().unwrap().is_none());
}

/// A stream that ends within a frame, or within a message that spans
/// frames, is an error: only a close between messages is the runtime's
/// goodbye.
#[test]
fn a_stream_closed_mid_message_is_an_error() {
    let msg = ttrpc(1, &[7u8; 100]);
    let whole = frame(1, &msg);
    for cut in [
        whole[..5].to_vec(),
        whole[..60].to_vec(),
        frame(1, &msg[..40]),
    ] {
        let mut wire = wire_fed_by(vec![cut]);
        let err = wire.read().expect_err("an error");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
    }
    let mut wire = wire_fed_by(vec![whole]);
    assert_eq!(read_all(&mut wire).len(), 1, "a close after it is no error");
}
