//! The ttrpc envelope of each call, read and written without copying the
//! method's own message (ttrpc `request.proto`):
//!
//! ```text
//! message Request  { string service = 1; string method = 2; bytes payload = 3;
//!                    int64 timeout_nano = 4; repeated KeyValue metadata = 5; }
//! message Response { Status status = 1; bytes payload = 2; }
//! ```
//!
//! Decoding `Request` with the generated type would copy its payload (the
//! whole CreateContainer request) into a fresh allocation, and encoding a
//! `Response` would copy the reply once more; both are large allocations on
//! every call. Here the request's fields borrow the received bytes and the
//! reply is encoded straight into a reused buffer.

use protobuf::{CodedOutputStream, Message};
use ttrpc::Status;

use crate::protowire::{each_field, WireError, LEN, VARINT};

/// A ttrpc `Request` whose strings and payload borrow the message bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct RequestView<'a> {
    pub service: &'a str,
    pub method: &'a str,
    pub payload: &'a [u8],
    pub timeout_nano: i64,
}

impl<'a> RequestView<'a> {
    /// Reads the envelope; unknown fields and `metadata` are skipped. As in
    /// protobuf, a field that occurs twice keeps its last value.
    pub(super) fn decode(buf: &'a [u8]) -> Result<RequestView<'a>, WireError> {
        let mut view = RequestView::default();
        each_field(buf, |r, field, wire_type| {
            match (field, wire_type) {
                (1, LEN) => view.service = r.str(field)?,
                (2, LEN) => view.method = r.str(field)?,
                (3, LEN) => view.payload = r.bytes()?,
                // int64 is sent as the two's complement varint of 64 bits.
                (4, VARINT) => view.timeout_nano = r.varint()? as i64,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(view)
    }
}

/// Appends a `Response` with an OK status and `reply` as its payload, the
/// bytes the generated `Response` type would give for the same values: the
/// status as an empty message (code 0 and no text are defaults), the payload
/// only when it is not empty.
pub(super) fn encode_ok<M: Message>(out: &mut Vec<u8>, reply: &M) -> protobuf::Result<()> {
    out.extend_from_slice(&[1 << 3 | LEN, 0]);
    let size = reply.compute_size();
    if size == 0 {
        return Ok(());
    }
    let mut os = CodedOutputStream::vec(out);
    os.write_raw_varint32(2 << 3 | u32::from(LEN))?;
    os.write_raw_varint64(size)?;
    reply.write_to_with_cached_sizes(&mut os)?;
    os.flush()
}

/// [`encode_ok`] for a reply encoded already.
pub(super) fn encode_ok_bytes(out: &mut Vec<u8>, reply: &[u8]) {
    out.extend_from_slice(&[1 << 3 | LEN, 0]);
    if reply.is_empty() {
        return;
    }
    out.push(2 << 3 | LEN);
    let mut len = reply.len() as u64;
    while len >= 0x80 {
        out.push(len as u8 | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(reply);
}

/// Appends a `Response` carrying `status` and no payload.
pub(super) fn encode_status(out: &mut Vec<u8>, status: Status) {
    let resp = ttrpc::Response {
        status: Some(status).into(),
        ..Default::default()
    };
    // A message of set fields always encodes; an empty reply would still
    // tell the runtime the call failed.
    let _ = resp.write_to_vec(out);
}

#[cfg(test)]
#[path = "envelope_tests.rs"]
mod tests;
