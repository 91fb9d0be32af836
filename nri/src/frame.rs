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
//! in 4096 bytes. The rest of the message goes as one frame, as Go's own
//! writer sends it (ttrpc's 4 KiB `bufio.Writer` flushes a full buffer, then
//! writes the remainder straight through): `bufio.Reader` reads a remainder
//! of 4 KiB or more directly into the message's buffer, which it fits
//! exactly, and a shorter one into its own. Splitting it further would cost
//! the Go mux a queue slot per 4 KiB (`readQueueLen` 256), and a full queue
//! closes the whole connection.

/// A connection id on the multiplexed stream.
pub type ConnId = u32;

/// The plugin serves `nri.pkg.api.v1alpha1.Plugin` on this connection.
pub const PLUGIN_SERVICE_CONN: ConnId = 1;
/// The runtime serves `nri.pkg.api.v1alpha1.Runtime` on this connection.
pub const RUNTIME_SERVICE_CONN: ConnId = 2;
/// Largest payload of the frame that starts a message (see the module docs).
pub const MAX_FRAME_PAYLOAD: usize = 4096;
/// Largest payload of any frame this side sends: the Go mux's
/// `maxPayloadSize`, a ttrpc header plus ttrpc's largest message.
pub const MAX_SENT_PAYLOAD: usize = TTRPC_HEADER_LEN + TTRPC_MAX_PAYLOAD;
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

/// Appends the message `data` to `out` as mux frames of `conn`: the first
/// [`MAX_FRAME_PAYLOAD`] bytes, then the rest in one frame (frames of at most
/// [`MAX_SENT_PAYLOAD`]); nothing for empty `data`.
pub fn append_mux_frames(out: &mut Vec<u8>, conn: ConnId, data: &[u8]) {
    let (first, rest) = data.split_at(data.len().min(MAX_FRAME_PAYLOAD));
    let frames = usize::from(!first.is_empty()) + rest.len().div_ceil(MAX_SENT_PAYLOAD);
    out.reserve(data.len() + MUX_HEADER_LEN * frames);
    let chunks = std::iter::once(first).chain(rest.chunks(MAX_SENT_PAYLOAD));
    for chunk in chunks.filter(|c| !c.is_empty()) {
        out.extend_from_slice(&conn.to_be_bytes());
        // A chunk holds at most MAX_SENT_PAYLOAD bytes, so it fits in a u32.
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
        let cases: [(usize, &[usize]); 6] = [
            (0, &[]),
            (1, &[1]),
            (4096, &[4096]),
            (4097, &[4096, 1]),
            (10_000, &[4096, 5904]),
            (2 << 20, &[4096, (2 << 20) - 4096]),
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
