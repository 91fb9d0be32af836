use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};

use super::*;

/// A started mux on one end of a socket pair, and the raw other end.
fn mux_pair(conns: &[ConnId]) -> (MuxHandle, Vec<MuxConn>, UnixStream) {
    let (ours, peer) = UnixStream::pair().expect("socketpair");
    let mut mux = Mux::new(ours);
    let opened = conns.iter().map(|c| mux.open(*c).expect("open")).collect();
    (mux.start(), opened, peer)
}

async fn read_frame(peer: &mut UnixStream) -> (ConnId, Vec<u8>) {
    let mut header = [0u8; HEADER_LEN];
    peer.read_exact(&mut header).await.expect("header");
    let (conn, len) = decode_header(header);
    let mut payload = vec![0u8; len];
    peer.read_exact(&mut payload).await.expect("payload");
    (conn, payload)
}

async fn send_frame(peer: &mut UnixStream, conn: ConnId, payload: &[u8]) {
    let mut frame = conn.to_be_bytes().to_vec();
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    peer.write_all(&frame).await.expect("send frame");
}

#[tokio::test]
async fn write_is_one_frame_with_big_endian_header() {
    let (_mux, mut conns, mut peer) = mux_pair(&[PLUGIN_SERVICE_CONN]);
    conns[0].write_all(b"hello").await.unwrap();
    let mut raw = [0u8; HEADER_LEN + 5];
    peer.read_exact(&mut raw).await.unwrap();
    assert_eq!(&raw[..HEADER_LEN], &[0, 0, 0, 1, 0, 0, 0, 5]);
    assert_eq!(&raw[HEADER_LEN..], b"hello");
}

#[tokio::test]
async fn large_writes_are_split_into_frames_of_at_most_4096() {
    let (_mux, mut conns, mut peer) = mux_pair(&[RUNTIME_SERVICE_CONN]);
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    conns[0].write_all(&data).await.unwrap();
    let mut got = Vec::new();
    let mut sizes = Vec::new();
    while got.len() < data.len() {
        let (conn, payload) = read_frame(&mut peer).await;
        assert_eq!(conn, RUNTIME_SERVICE_CONN);
        sizes.push(payload.len());
        got.extend(payload);
    }
    assert_eq!(sizes, [4096, 4096, 1808]);
    assert_eq!(got, data);
}

#[tokio::test]
async fn interleaved_frames_reach_their_own_connection() {
    let (_mux, mut conns, mut peer) = mux_pair(&[1, 2]);
    send_frame(&mut peer, 1, b"one-a ").await;
    send_frame(&mut peer, 2, b"two-a ").await;
    send_frame(&mut peer, 1, b"one-b").await;
    send_frame(&mut peer, 2, b"two-b").await;
    let mut one = [0u8; 11];
    let mut two = [0u8; 11];
    conns[1].read_exact(&mut two).await.unwrap();
    conns[0].read_exact(&mut one).await.unwrap();
    assert_eq!(&one, b"one-a one-b");
    assert_eq!(&two, b"two-a two-b");
}

#[tokio::test]
async fn frames_for_unknown_connections_are_dropped() {
    let (_mux, mut conns, mut peer) = mux_pair(&[1]);
    send_frame(&mut peer, 7, b"nobody listens").await;
    send_frame(&mut peer, 1, b"ok").await;
    let mut buf = [0u8; 2];
    conns[0].read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ok");
}

#[tokio::test]
async fn small_reads_consume_a_frame_piecewise() {
    let (_mux, mut conns, mut peer) = mux_pair(&[1]);
    send_frame(&mut peer, 1, b"abcdef").await;
    let mut buf = [0u8; 4];
    conns[0].read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"abcd");
    let mut rest = [0u8; 2];
    conns[0].read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"ef");
}

#[tokio::test]
async fn peer_close_is_eof_on_every_connection() {
    let (mux, mut conns, mut peer) = mux_pair(&[1, 2]);
    send_frame(&mut peer, 2, b"last").await;
    drop(peer);
    let mut rest = Vec::new();
    conns[1].read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"last");
    let mut none = Vec::new();
    assert_eq!(conns[0].read_to_end(&mut none).await.unwrap(), 0);
    mux.closed().await.unwrap();
    let err = conns[0].write_all(b"late").await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
}

/// A peer gone within a frame's header died mid-message: an error, not the
/// clean close of a peer gone between frames.
#[tokio::test]
async fn a_close_within_a_header_is_an_error() {
    let (mux, _conns, mut peer) = mux_pair(&[1]);
    peer.write_all(&[0, 0, 0, 1, 0]).await.unwrap();
    drop(peer);
    let err = mux.closed().await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
}

#[tokio::test]
async fn oversized_peer_frame_is_an_error() {
    let (mux, _conns, mut peer) = mux_pair(&[1]);
    let mut header = 1u32.to_be_bytes().to_vec();
    header.extend_from_slice(&((MAX_PEER_PAYLOAD as u32) + 1).to_be_bytes());
    peer.write_all(&header).await.unwrap();
    let err = mux.closed().await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn dropping_the_handle_closes_the_stream() {
    let (mux, _conns, mut peer) = mux_pair(&[1]);
    drop(mux);
    let mut buf = Vec::new();
    assert_eq!(peer.read_to_end(&mut buf).await.unwrap(), 0);
}

#[test]
fn connection_ids_open_once_and_zero_is_reserved() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (ours, _peer) = UnixStream::pair().unwrap();
        let mut mux = Mux::new(ours);
        assert!(matches!(
            mux.open(0),
            Err(MuxError::ReservedConn { conn: 0 })
        ));
        assert_eq!(mux.open(1).unwrap().id(), 1);
        assert!(matches!(
            mux.open(1),
            Err(MuxError::AlreadyOpen { conn: 1 })
        ));
    });
}
