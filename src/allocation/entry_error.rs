//! The parser's errors for one entry of the annotation, each naming it.

use super::{AllocationError, DEVICE_ALLOCATED as ANN};

pub(super) fn malformed(entry: &str, e: serde_json::Error) -> AllocationError {
    // serde_json decodes escapes in what it quotes (an unknown field name).
    let reason = crate::untrusted::one_line(&e.to_string(), 200);
    AllocationError::Malformed {
        annotation: ANN,
        entry: entry.to_string(),
        reason,
    }
}

pub(super) fn too_many(entry: &str, what: &'static str, limit: usize) -> AllocationError {
    AllocationError::TooMany {
        annotation: ANN,
        entry: entry.to_string(),
        what,
        limit,
    }
}

pub(super) fn missing(entry: &str, field: &'static str) -> AllocationError {
    AllocationError::Missing {
        annotation: ANN,
        entry: entry.to_string(),
        field,
    }
}

pub(super) fn negative(entry: &str, field: &'static str, value: i64) -> AllocationError {
    AllocationError::Negative {
        annotation: ANN,
        entry: entry.to_string(),
        field,
        value,
    }
}

pub(super) fn out_of_range(
    entry: &str,
    field: &str,
    value: i64,
    range: &'static str,
) -> AllocationError {
    AllocationError::OutOfRange {
        annotation: ANN,
        entry: entry.to_string(),
        field: field.to_string(),
        value,
        range,
    }
}
