//! Field names spelled as Go reads them. Go's `encoding/json` matches an object
//! key to a struct field without regard to case (`bytes.EqualFold`: ASCII case,
//! plus the Kelvin sign and the long s, which fold to `k` and `s`), keeping the
//! last of several; serde matches names exactly. An entry spelling a field
//! `Minor` would be read by koordlet and ignored by devgate, which would then
//! read another device or none. A key that folds to a field's name without
//! being it is refused: devgate never reads a different device than koordlet.

use serde_json::value::RawValue;

use super::raw::UniqueMap;
use super::{AllocationError, DEVICE_ALLOCATED};

/// `DeviceAllocation` (apis/extension/device_share.go).
const ENTRY: &[&str] = &["minor", "id", "resources", "extension"];
/// `DeviceAllocationExtension`.
const EXTENSION: &[&str] = &["vfs", "gpuSharedResourceTemplate"];
/// `VirtualFunction`.
const VF: &[&str] = &["minor", "busID"];

fn folded(s: &str) -> impl Iterator<Item = char> + '_ {
    s.chars().map(|c| match c {
        '\u{212A}' => 'k',
        '\u{17F}' => 's',
        c => c.to_ascii_lowercase(),
    })
}

/// The field `key` stands for in Go without being spelled like it.
fn misspelled(key: &str, fields: &[&'static str]) -> Option<&'static str> {
    fields
        .iter()
        .find(|f| **f != key && folded(f).eq(folded(key)))
        .copied()
}

/// The keys of `raw` when it is an object; an object naming a key twice is
/// an error (Go keeps the last, serde the first of a field it knows, and a
/// key checked here could hide behind another). `null` is the typed parse's
/// to judge. Anything else is refused: serde reads a struct from an array
/// of its fields in order (`[3]` as minor 3), which Go's `encoding/json`
/// refuses, so koordlet and the scheduler would not see the device devgate
/// grants.
fn object(raw: &RawValue) -> Result<Option<UniqueMap<Box<RawValue>>>, String> {
    let text = raw.get().trim_start();
    if text == "null" {
        return Ok(None);
    }
    if !text.starts_with('{') {
        return Err("not a JSON object".to_string());
    }
    serde_json::from_str(raw.get())
        .map(Some)
        .map_err(|e| e.to_string())
}

fn keys(
    entry: &str,
    raw: &RawValue,
    fields: &[&'static str],
) -> Result<Vec<(String, Box<RawValue>)>, AllocationError> {
    let malformed = |reason: String| AllocationError::Malformed {
        annotation: DEVICE_ALLOCATED,
        entry: entry.to_string(),
        reason,
    };
    let Some(map) = object(raw).map_err(malformed)? else {
        return Ok(Vec::new());
    };
    for (key, _) in &map.0 {
        if let Some(field) = misspelled(key, fields) {
            return Err(malformed(format!(
                "key {:?} is field `{field}` spelled otherwise",
                crate::untrusted::one_line(key, 64)
            )));
        }
    }
    Ok(map.0)
}

/// Checks the keys of one entry (`gpu[0]`), its extension and its VFs.
pub(super) fn check_entry(entry: &str, raw: &RawValue) -> Result<(), AllocationError> {
    for (key, value) in keys(entry, raw, ENTRY)? {
        if key != "extension" {
            continue;
        }
        for (key, value) in keys(entry, &value, EXTENSION)? {
            if key != "vfs" {
                continue;
            }
            let vfs: Vec<Box<RawValue>> = serde_json::from_str(value.get()).unwrap_or_default();
            for (i, vf) in vfs.iter().enumerate() {
                keys(&format!("{entry}.vfs[{i}]"), vf, VF)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<(), String> {
        let raw: Box<RawValue> = serde_json::from_str(text).unwrap();
        check_entry("gpu[0]", &raw).map_err(|e| e.to_string())
    }

    #[test]
    fn keys_go_would_take_for_a_field_are_refused() {
        for (text, want) in [
            (
                r#"{"minor":0,"Minor":3}"#,
                r#"key "Minor" is field `minor`"#,
            ),
            (r#"{"ID":"GPU-1"}"#, r#"key "ID" is field `id`"#),
            ("{\"re\u{17F}ources\":{}}", "is field `resources`"),
            (r#"{"extension":{"VFs":[]}}"#, "is field `vfs`"),
            (
                r#"{"extension":{"vfs":[{"busid":"0000:01:00.2"}]}}"#,
                r#"gpu[0].vfs[0]: malformed: key "busid" is field `busID`"#,
            ),
            (
                "{\"\u{212A}\":1,\"minor\\u0000x\":1,\"mInOr\":1}",
                "is field `minor`",
            ),
            // A repeated key would otherwise hide a misspelled one.
            (
                r#"{"minor":0,"Minor":1,"x":0,"x":0}"#,
                r#"gpu[0]: malformed: duplicate key "x""#,
            ),
            (
                r#"{"extension":{"vfs":[{"busID":"0000:19:00.2","BusID":"0000:19:00.3","x":0,"x":0}]}}"#,
                r#"gpu[0].vfs[0]: malformed: duplicate key "x""#,
            ),
            // Arrays serde would read as the fields in order; Go refuses them.
            (
                r#"[3,null,null,null]"#,
                "gpu[0]: malformed: not a JSON object",
            ),
            (
                r#"{"extension":{"vfs":[[-1,"0000:01:00.2"]]}}"#,
                "gpu[0].vfs[0]: malformed: not a JSON object",
            ),
            (
                r#"{"extension":[[]]}"#,
                "gpu[0]: malformed: not a JSON object",
            ),
            (
                r#"{"extension":"x"}"#,
                "gpu[0]: malformed: not a JSON object",
            ),
        ] {
            let err = check(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn exact_and_unknown_keys_pass() {
        for text in [
            r#"{"minor":0,"id":"GPU-1","resources":{"Minor":"1"},"extension":{"vfs":[{"minor":-1,"busID":"0000:01:00.2"}],"bondSlaves":[]}}"#,
            r#"{"priority":"VFPriorityHigh","minors":1}"#,
            r#"{"extension":null,"vfs":{"Minor":1}}"#,
            r#"null"#,
        ] {
            assert_eq!(check(text), Ok(()), "{text}");
        }
    }
}
