//! Byte layouts of the two framings NRI stacks on one unix stream.
//!
//! - The socket multiplexer (`pkg/net/multiplex` in containerd/nri): every
//!   frame is an 8-byte header, big-endian `u32` connection id then
//!   big-endian `u32` payload length, followed by the payload. There is no
//!   handshake and no close signal; frames for an id nobody opened are
//!   dropped. NRI uses id 1 for the plugin's ttrpc server and id 2 for the
//!   runtime's.
//! - ttrpc messages on each connection (ttrpc `PROTOCOL.md`): a 10-byte
//!   header, big-endian `u32` payload length, big-endian `u32` stream id,
//!   `u8` message type, `u8` flags, followed by the protobuf payload.
//!
//! Frame size: the Go side reads each connection through a 4 KiB `bufio`
//! reader, and its mux returns `ENOMEM` when a frame is larger than the read
//! buffer (nri#102). A frame that starts a ttrpc message must therefore fit
//! in 4096 bytes. Capping every frame at [`MAX_FRAME_PAYLOAD`] satisfies that
//! for any write pattern.

/// A connection id on the multiplexed stream.
pub type ConnId = u32;

/// The plugin serves `nri.pkg.api.v1alpha1.Plugin` on this connection.
pub const PLUGIN_SERVICE_CONN: ConnId = 1;
/// The runtime serves `nri.pkg.api.v1alpha1.Runtime` on this connection.
pub const RUNTIME_SERVICE_CONN: ConnId = 2;
/// Largest payload this side puts in one frame (see the module docs).
pub const MAX_FRAME_PAYLOAD: usize = 4096;
/// Largest payload accepted from the peer: the Go mux's limit up to v0.6.1
/// (`1 << 24`); later versions send at most `10 + 4 MiB`.
pub const MAX_PEER_PAYLOAD: usize = 1 << 24;
/// Length of a mux frame header.
pub const MUX_HEADER_LEN: usize = 8;

/// Length of a ttrpc message header.
pub const TTRPC_HEADER_LEN: usize = 10;
/// Largest ttrpc payload either side sends (ttrpc's `messageLengthMax`).
pub const TTRPC_MAX_PAYLOAD: usize = 4 << 20;
/// ttrpc message types.
pub const TTRPC_REQUEST: u8 = 1;
pub const TTRPC_RESPONSE: u8 = 2;

/// Splits a mux header into connection id and payload length.
pub fn decode_mux_header(h: [u8; MUX_HEADER_LEN]) -> (ConnId, usize) {
    let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    (conn, len as usize)
}

/// Appends `data` to `out` as mux frames of `conn`, each carrying at most
/// [`MAX_FRAME_PAYLOAD`] bytes; nothing for empty `data`.
pub fn append_mux_frames(out: &mut Vec<u8>, conn: ConnId, data: &[u8]) {
    out.reserve(data.len() + MUX_HEADER_LEN * data.len().div_ceil(MAX_FRAME_PAYLOAD));
    for chunk in data.chunks(MAX_FRAME_PAYLOAD) {
        out.extend_from_slice(&conn.to_be_bytes());
        // A chunk holds at most MAX_FRAME_PAYLOAD bytes, so it fits in a u32.
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
}

/// A ttrpc message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtrpcHeader {
    pub length: usize,
    pub stream_id: u32,
    pub kind: u8,
    pub flags: u8,
}

impl TtrpcHeader {
    pub fn decode(h: &[u8; TTRPC_HEADER_LEN]) -> TtrpcHeader {
        TtrpcHeader {
            length: u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize,
            stream_id: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
            kind: h[8],
            flags: h[9],
        }
    }

    /// The header bytes; `length` must be at most [`TTRPC_MAX_PAYLOAD`].
    pub fn encode(&self) -> [u8; TTRPC_HEADER_LEN] {
        let mut h = [0u8; TTRPC_HEADER_LEN];
        h[..4].copy_from_slice(&(self.length as u32).to_be_bytes());
        h[4..8].copy_from_slice(&self.stream_id.to_be_bytes());
        h[8] = self.kind;
        h[9] = self.flags;
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mux_frames_split_at_the_go_read_buffer() {
        let cases: [(usize, &[usize]); 5] = [
            (0, &[]),
            (1, &[1]),
            (4096, &[4096]),
            (4097, &[4096, 1]),
            (10_000, &[4096, 4096, 1808]),
        ];
        for (len, want) in cases {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut out = Vec::new();
            append_mux_frames(&mut out, 7, &data);
            let mut rest = out.as_slice();
            let mut got = Vec::new();
            let mut joined = Vec::new();
            while !rest.is_empty() {
                let (conn, n) = decode_mux_header(rest[..8].try_into().unwrap());
                assert_eq!(conn, 7);
                got.push(n);
                joined.extend_from_slice(&rest[8..8 + n]);
                rest = &rest[8 + n..];
            }
            assert_eq!(got, want, "{len}");
            assert_eq!(joined, data, "{len}");
        }
    }

    #[test]
    fn ttrpc_header_layout() {
        let h = TtrpcHeader {
            length: 0x0102_0304,
            stream_id: 5,
            kind: TTRPC_RESPONSE,
            flags: 0,
        };
        let bytes = h.encode();
        assert_eq!(bytes, [1, 2, 3, 4, 0, 0, 0, 5, 2, 0]);
        assert_eq!(TtrpcHeader::decode(&bytes), h);
    }
}
