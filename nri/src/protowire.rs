//! A cursor over protobuf bytes (protobuf encoding guide, "Message
//! Structure"), for the decoders that borrow or skip instead of building
//! every generated message: the ttrpc envelope and the lean requests.

/// Protobuf wire types.
pub(crate) const VARINT: u8 = 0;
pub(crate) const I64: u8 = 1;
pub(crate) const LEN: u8 = 2;
pub(crate) const I32: u8 = 5;
/// Proto2 groups: a start tag, the group's fields, an end tag of the same number.
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
/// Groups nested deeper than this are refused, as protobuf's own parsers
/// bound recursion: rust-protobuf's default recursion limit is 100. It counts
/// the messages a group sits in too, so within the request's nested messages
/// the full decoder refuses a few levels sooner; Go's limit is higher still,
/// and no runtime sends groups (proto3).
const MAX_GROUP_DEPTH: usize = 100;
/// The largest field number protobuf allows (encoding guide: numbers are
/// 1 to 2^29 - 1); 0 is never a field.
const MAX_FIELD: u64 = (1 << 29) - 1;

/// Why bytes are not the protobuf message they should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated at byte {at}")]
    Truncated { at: usize },
    #[error("varint too long at byte {at}")]
    VarintTooLong { at: usize },
    #[error("field number {field} at byte {at} is outside 1 to 2^29 - 1")]
    FieldNumber { field: u64, at: usize },
    #[error("field {field} has wire type {wire_type}, which this decoder does not read")]
    WireType { field: u64, wire_type: u8 },
    #[error("group {field} is not closed, or closed where none is open, at byte {at}")]
    Group { field: u64, at: usize },
    #[error("group {field} at byte {at} is nested more than {MAX_GROUP_DEPTH} deep")]
    TooDeep { field: u64, at: usize },
    #[error("field {field} is not utf-8")]
    NotUtf8 { field: u64 },
}

/// Reads the message `bytes` field by field. `f` gets each field's number
/// and wire type and, when it keeps the field, reads its value and returns
/// `true`; a field it leaves (`false`) is skipped here, so no decoder can
/// forget to step over what it does not read.
pub(crate) fn each_field<'a>(
    bytes: &'a [u8],
    mut f: impl FnMut(&mut Reader<'a>, u64, u8) -> Result<bool, WireError>,
) -> Result<(), WireError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    while let Some((field, wire_type)) = r.key()? {
        if !f(&mut r, field, wire_type)? {
            r.skip(field, wire_type)?;
        }
    }
    Ok(())
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// The next field's number and wire type; `None` at the end.
    fn key(&mut self) -> Result<Option<(u64, u8)>, WireError> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let at = self.pos;
        let key = self.varint()?;
        let field = key >> 3;
        if field == 0 || field > MAX_FIELD {
            return Err(WireError::FieldNumber { field, at });
        }
        Ok(Some((field, (key & 7) as u8)))
    }

    pub(crate) fn varint(&mut self) -> Result<u64, WireError> {
        let start = self.pos;
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .buf
                .get(self.pos)
                .ok_or(WireError::Truncated { at: self.pos })?;
            self.pos += 1;
            // The tenth byte holds the value's 64th bit alone: more would
            // overflow u64, which protobuf's parsers refuse rather than wrap.
            if shift == 63 && byte > 1 {
                return Err(WireError::VarintTooLong { at: start });
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError::VarintTooLong { at: start })
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], WireError> {
        let truncated = WireError::Truncated { at: self.pos };
        let n = usize::try_from(n).map_err(|_| truncated.clone())?;
        let end = self.pos.checked_add(n).ok_or(truncated.clone())?;
        let bytes = self.buf.get(self.pos..end).ok_or(truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    /// A length-delimited field's bytes.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.varint()?;
        self.take(n)
    }

    /// A string field, which protobuf requires to be UTF-8.
    pub(crate) fn str(&mut self, field: u64) -> Result<&'a str, WireError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| WireError::NotUtf8 { field })
    }

    /// Skips a field the caller does not keep, a group with everything in
    /// it as protobuf's parsers do (proto3 has none and neither NRI nor ttrpc
    /// sends them, but an unknown field of any wire type is skipped).
    fn skip(&mut self, field: u64, wire_type: u8) -> Result<(), WireError> {
        self.skip_within(field, wire_type, 0)
    }

    fn skip_within(&mut self, field: u64, wire_type: u8, depth: usize) -> Result<(), WireError> {
        match wire_type {
            VARINT => self.varint().map(drop),
            I64 => self.take(8).map(drop),
            LEN => self.bytes().map(drop),
            I32 => self.take(4).map(drop),
            START_GROUP if depth < MAX_GROUP_DEPTH => self.skip_group(field, depth + 1),
            START_GROUP => Err(WireError::TooDeep {
                field,
                at: self.pos,
            }),
            END_GROUP => Err(WireError::Group {
                field,
                at: self.pos,
            }),
            _ => Err(WireError::WireType { field, wire_type }),
        }
    }

    /// Everything up to and including the end tag of group `field`.
    fn skip_group(&mut self, field: u64, depth: usize) -> Result<(), WireError> {
        let open = self.pos;
        while let Some((inner, wire_type)) = self.key()? {
            if wire_type == END_GROUP && inner == field {
                return Ok(());
            }
            self.skip_within(inner, wire_type, depth)?;
        }
        Err(WireError::Group { field, at: open })
    }
}
