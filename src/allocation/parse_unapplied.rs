//! What the annotation carries that devgate does not apply (device types
//! other than gpu, rdma and fpga; VFs listed under a GPU or FPGA) is still
//! read with the types koordinator reads it with: an annotation it cannot
//! read (`json.Unmarshal` fails whole) leaves every device of the pod
//! uncounted by its scheduler and koordlet, those devgate would grant too.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::super::entry_error::{malformed, out_of_range};
use super::super::raw::{RawExtension, RawVf, UniqueMap};
use super::AllocationError;

/// `DeviceAllocation` of a type devgate does not apply, as Go types it;
/// each quantity kept as its JSON text, which [`go_reads_quantity`] judges.
#[derive(Deserialize)]
struct RawOther {
    minor: Option<i64>,
    /// Read for its type only.
    #[serde(rename = "id")]
    _id: Option<String>,
    resources: Option<UniqueMap<Box<RawValue>>>,
    extension: Option<RawExtension>,
}

/// The entries of a device type devgate does not apply (`npu`). They count
/// toward no limit of devgate's: the annotation's size bounds them, and
/// koordinator takes any number.
pub(super) fn device_type(kind: &str, raw: &RawValue) -> Result<(), AllocationError> {
    for (i, raw) in super::entries(kind, raw)?.iter().enumerate() {
        let at = format!("{kind}[{i}]");
        super::super::spelling::check_entry(&at, raw)?;
        entry(&at, raw)?;
    }
    Ok(())
}

/// One entry of a type devgate does not apply (`npu[0]`): `null`, or an
/// object whose fields have Go's types (`Minor int32`, `ID string`,
/// quantities in Go's grammar, VFs as [`unapplied_vfs`] reads them).
fn entry(entry: &str, raw: &RawValue) -> Result<(), AllocationError> {
    let e: Option<RawOther> = serde_json::from_str(raw.get()).map_err(|e| malformed(entry, e))?;
    let Some(e) = e else {
        return Ok(());
    };
    if let Some(m) = e.minor {
        i32::try_from(m)
            .map_err(|_| out_of_range(entry, "minor", m, "-2147483648..=2147483647"))?;
    }
    let quantities = e.resources.map(|m| m.0).unwrap_or_default();
    for (name, q) in quantities {
        if !go_reads_quantity(q.get()) {
            return Err(AllocationError::Malformed {
                annotation: super::ANN,
                entry: entry.to_string(),
                reason: format!(
                    "{} {}: no quantity koordinator reads",
                    crate::untrusted::one_line(&name, 64),
                    crate::untrusted::one_line(q.get(), 64)
                ),
            });
        }
    }
    unapplied_vfs(entry, e.extension.as_ref())
}

/// VFs in the extension of an entry that is not RDMA: nothing devgate
/// applies, but typed as koordinator's `VirtualFunction` (a `busID` of 7
/// fails its whole annotation).
pub(super) fn unapplied_vfs(
    entry: &str,
    extension: Option<&RawExtension>,
) -> Result<(), AllocationError> {
    let vfs = extension.and_then(|x| x.vfs.as_deref()).unwrap_or_default();
    for (j, vf) in vfs.iter().enumerate() {
        let entry = format!("{entry}.vfs[{j}]");
        let _: RawVf = serde_json::from_str(vf.get()).map_err(|e| malformed(&entry, e))?;
    }
    Ok(())
}

/// Whether koordinator reads `raw`, one quantity's JSON text, as Go's
/// `Quantity.UnmarshalJSON` does: `null`, or the bytes between the quotes
/// (escapes left as they are) or the bare token, trimmed of white space, read
/// by `ParseQuantity` (k8s.io/apimachinery `pkg/api/resource/quantity.go`).
pub(super) fn go_reads_quantity(raw: &str) -> bool {
    if raw == "null" {
        return true;
    }
    let text = match raw.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) if raw.len() >= 2 => inner,
        _ => raw,
    };
    go_parse_quantity(text.trim())
}

/// `ParseQuantity`'s verdict: `parseQuantityString`'s grammar (one sign,
/// digits, a fraction, a suffix of `eEinumkKMGTP` with an optional signed
/// exponent), a suffix `interpret` knows, and a value with no digit at all
/// (`Gi`, `e-10`) only where the fast path takes it, since `inf.Dec` reads
/// no number from it.
fn go_parse_quantity(s: &str) -> bool {
    if s.is_empty() {
        return false;
    }
    let b = s.as_bytes();
    let digits_from = |mut at: usize| {
        while at < b.len() && b[at].is_ascii_digit() {
            at += 1;
        }
        at
    };
    let mut at = usize::from(matches!(b[0], b'-' | b'+'));
    at = digits_from(at);
    if at < b.len() && b[at] == b'.' {
        at = digits_from(at + 1);
    }
    let has_digit = b[..at].iter().any(u8::is_ascii_digit);
    let suffix = &s[at..];
    let mut end = at;
    while end < b.len() && b"eEinumkKMGTP".contains(&b[end]) {
        end += 1;
    }
    if end < b.len() {
        if matches!(b[end], b'-' | b'+') {
            end += 1;
        }
        if digits_from(end) < b.len() {
            return false;
        }
    }
    let Some(scale) = go_suffix(suffix) else {
        return false;
    };
    // Zeros alone (`-`, `.`, `-0`) read as 0 before any suffix is looked at.
    if suffix.is_empty() || has_digit {
        return true;
    }
    match scale {
        GoScale::Decimal(exponent) => exponent >= -9,
        // precision = 15 - len("0") - exponent * 3 / 10 - 1 must not be negative.
        GoScale::Binary(exponent) => 13 - (exponent * 3 / 10) >= 0,
    }
}

enum GoScale {
    Decimal(i32),
    Binary(i32),
}

/// `suffixHandler.interpret`: the SI and binary tables, then `e`/`E` and an
/// int64 exponent, kept as Go's `int32(parsed)` keeps it.
fn go_suffix(suffix: &str) -> Option<GoScale> {
    let decimal = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"];
    if let Some(i) = decimal.iter().position(|d| *d == suffix) {
        let exponent = 3 * i32::try_from(i).ok()? - 9;
        return Some(GoScale::Decimal(exponent));
    }
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if let Some(i) = binary.iter().position(|d| *d == suffix) {
        return Some(GoScale::Binary(10 * (i32::try_from(i).ok()? + 1)));
    }
    let exponent = suffix.strip_prefix(['e', 'E']).filter(|e| !e.is_empty())?;
    let parsed: i64 = exponent.parse().ok()?;
    // Go's int32(parsed): the low 32 bits.
    Some(GoScale::Decimal(parsed as i32))
}

#[cfg(test)]
mod tests {
    use super::go_reads_quantity;

    /// Each quantity's JSON text as Go's `Quantity.UnmarshalJSON` takes it
    /// or refuses it (k8s.io/apimachinery `quantity.go`, read by hand).
    #[test]
    fn quantities_are_read_as_go_reads_them() {
        #[rustfmt::skip]
        let table: &[(&str, bool)] = &[
            ("null", true), (r#""0""#, true), (r#""100""#, true), ("8", true),
            (r#""16Gi""#, true), (r#""500m""#, true), (r#""100n""#, true), (r#""5u""#, true),
            (r#""1.5Gi""#, true), (r#""-1.5Gi""#, true), (r#""+2""#, true), (r#"".5""#, true),
            (r#""1.""#, true), (r#""1.G""#, true), ("1e3", true), ("-0.5", true),
            (r#""1e-3""#, true), (r#""1E+3""#, true), (r#""1e1000""#, true), (r#""1e0003""#, true),
            (r#""1E""#, true), (r#"" 1 ""#, true), ("\"1\u{a0}\"", true),
            // Go reads a value without a digit as 0 where its fast path takes it.
            (r#""-""#, true), (r#""+""#, true), (r#"".""#, true), (r#""Gi""#, true), (r#""Ti""#, true),
            (r#""k""#, true), (r#""M""#, true), (r#""-0""#, true), (r#""e-9""#, true),
            (&format!(r#""{}""#, "9".repeat(70)), true), (r#""99999999999999999999Ei""#, true),
            // ...and refuses it where `inf.Dec` must read it.
            (r#""Pi""#, false), (r#""Ei""#, false), (r#""e-10""#, false),
            (r#""""#, false), (r#""  ""#, false), (r#""abc""#, false), (r#""-+1""#, false),
            (r#""--1""#, false), (r#""1.2.3""#, false), (r#""1ki""#, false), (r#""1e""#, false),
            (r#""1ee3""#, false), (r#""1e3e""#, false), (r#""1 Gi""#, false), (r#""16GB""#, false),
            (r#""\u0031""#, false), (r#""1e99999999999999999999""#, false),
            ("true", false), ("[1]", false), (r#"{"a":1}"#, false),
        ];
        for (raw, want) in table {
            assert_eq!(go_reads_quantity(raw), *want, "{raw}");
        }
    }
}
