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

/// Protobuf wire types (protobuf encoding guide, "Message Structure").
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// A ttrpc `Request` whose strings and payload borrow the message bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct RequestView<'a> {
    pub service: &'a str,
    pub method: &'a str,
    pub payload: &'a [u8],
    pub timeout_nano: i64,
}

/// Why a request envelope could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum EnvelopeError {
    #[error("truncated at byte {at}")]
    Truncated { at: usize },
    #[error("varint too long at byte {at}")]
    VarintTooLong { at: usize },
    #[error("field {field} has wire type {wire_type}, which this decoder does not read")]
    WireType { field: u64, wire_type: u8 },
    #[error("field {field} is not utf-8")]
    NotUtf8 { field: u64 },
}

/// A cursor over protobuf bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, EnvelopeError> {
        let start = self.pos;
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .buf
                .get(self.pos)
                .ok_or(EnvelopeError::Truncated { at: self.pos })?;
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(EnvelopeError::VarintTooLong { at: start })
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], EnvelopeError> {
        let truncated = EnvelopeError::Truncated { at: self.pos };
        let n = usize::try_from(n).map_err(|_| truncated.clone())?;
        let end = self.pos.checked_add(n).ok_or(truncated.clone())?;
        let bytes = self.buf.get(self.pos..end).ok_or(truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    /// Skips a field this decoder does not keep. Groups (wire types 3 and
    /// 4) are refused: proto3 has none and ttrpc never sends them.
    fn skip(&mut self, field: u64, wire_type: u8) -> Result<(), EnvelopeError> {
        match wire_type {
            VARINT => self.varint().map(drop),
            I64 => self.take(8).map(drop),
            LEN => {
                let n = self.varint()?;
                self.take(n).map(drop)
            }
            I32 => self.take(4).map(drop),
            _ => Err(EnvelopeError::WireType { field, wire_type }),
        }
    }
}

impl<'a> RequestView<'a> {
    /// Reads the envelope; unknown fields and `metadata` are skipped. As in
    /// protobuf, a field that occurs twice keeps its last value.
    pub(super) fn decode(buf: &'a [u8]) -> Result<RequestView<'a>, EnvelopeError> {
        let mut r = Reader { buf, pos: 0 };
        let mut view = RequestView::default();
        while r.pos < buf.len() {
            let key = r.varint()?;
            let (field, wire_type) = (key >> 3, (key & 7) as u8);
            let text = |bytes: &'a [u8]| {
                std::str::from_utf8(bytes).map_err(|_| EnvelopeError::NotUtf8 { field })
            };
            match (field, wire_type) {
                (1, LEN) => view.service = text(len_delimited(&mut r)?)?,
                (2, LEN) => view.method = text(len_delimited(&mut r)?)?,
                (3, LEN) => view.payload = len_delimited(&mut r)?,
                // int64 is sent as the two's complement varint of 64 bits.
                (4, VARINT) => view.timeout_nano = r.varint()? as i64,
                _ => r.skip(field, wire_type)?,
            }
        }
        Ok(view)
    }
}

fn len_delimited<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], EnvelopeError> {
    let n = r.varint()?;
    r.take(n)
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
