//! The OCI container state a runtime writes on a hook's stdin
//! (runtime-spec `runtime.md` §State; extra fields are allowed by the spec and ignored here).

use std::collections::BTreeMap;
use std::io::Read;

use serde::Deserialize;

use super::HookError;
use crate::fsutil::BoundedError;

/// The state is a few KiB even with many annotations; a runtime never sends this much.
pub const MAX_STATE_BYTES: u64 = 1024 * 1024;
const MAX_ID_LEN: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct State {
    #[serde(rename = "ociVersion", default)]
    pub oci_version: String,
    pub id: String,
    /// Required by the runtime spec, but a state without it is still usable at
    /// an explicitly named stage: the pid alone leads to the netns.
    #[serde(default)]
    pub status: String,
    /// The container init pid as the runtime sees it; absent (or 0) at poststop.
    #[serde(default)]
    pub pid: Option<i64>,
    #[serde(default)]
    pub bundle: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl State {
    /// Reads and checks the state from `input`, refusing more than [`MAX_STATE_BYTES`].
    pub fn read(input: impl Read) -> Result<State, HookError> {
        let mut text = Vec::new();
        match crate::fsutil::read_bounded(input, MAX_STATE_BYTES, &mut text) {
            Ok(()) => State::parse(&text),
            Err(BoundedError::Io(e)) => Err(HookError::Stdin(e)),
            Err(BoundedError::TooLarge { .. }) => Err(HookError::StateTooLarge),
        }
    }

    pub fn parse(text: &[u8]) -> Result<State, HookError> {
        let state: State = serde_json::from_slice(text)
            .map_err(|e| HookError::State(crate::untrusted::one_line(&e.to_string(), 300)))?;
        let id_ok = !state.id.is_empty()
            && state.id.len() <= MAX_ID_LEN
            && state.id.bytes().all(|b| b.is_ascii_graphic());
        if !id_ok {
            // Quoted (escapes keep it one line) and cut: stdin may hold 1 MiB.
            let shown: String = state.id.chars().take(MAX_ID_LEN + 1).collect();
            return Err(HookError::State(format!(
                "container id {shown:?} is not usable"
            )));
        }
        Ok(state)
    }

    /// The pid, when the runtime gave a real one.
    pub fn pid(&self) -> Option<u32> {
        self.pid
            .filter(|p| *p > 0)
            .and_then(|p| u32::try_from(p).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_states_parse_and_extra_fields_are_ignored() {
        let create = br#"{"ociVersion":"1.0.2","id":"abc","status":"creating","pid":4242,
            "bundle":"/run/b","annotations":{"k":"v"},"extra":{"x":1}}"#;
        let s = State::parse(create).unwrap();
        assert_eq!(
            (s.id.as_str(), s.status.as_str(), s.pid()),
            ("abc", "creating", Some(4242))
        );
        assert_eq!(s.annotations["k"], "v");
        let stop = br#"{"ociVersion":"1.0.2","id":"abc","status":"stopped","bundle":"/run/b"}"#;
        let s = State::parse(stop).unwrap();
        assert_eq!(s.pid(), None);
        assert!(s.annotations.is_empty());
        let zero = br#"{"id":"abc","status":"stopped","pid":0}"#;
        assert_eq!(State::parse(zero).unwrap().pid(), None);
        let bare = State::parse(br#"{"id":"abc","pid":7}"#).unwrap();
        assert_eq!((bare.status.as_str(), bare.pid()), ("", Some(7)));
    }

    #[test]
    fn bad_states_are_errors() {
        for bad in [
            &b""[..],
            b"{",
            br#"{"status":"creating"}"#,
            br#"{"id":"","status":"creating"}"#,
            br#"{"id":"a b","status":"creating"}"#,
            br#"{"id":"a","status":"creating","pid":"x"}"#,
            br#"{"id":"a","status":"creating","annotations":{"k":1}}"#,
            br#"[1,2]"#,
        ] {
            assert!(
                State::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // An id refused is quoted cut, however long the runtime sent it.
        let long = format!(
            r#"{{"id":"{} x","status":"creating"}}"#,
            "a".repeat(500_000)
        );
        let e = State::parse(long.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("is not usable") && e.len() < 400, "{}", e.len());
        let big = vec![b' '; MAX_STATE_BYTES as usize + 10];
        assert!(matches!(
            State::read(&big[..]),
            Err(HookError::StateTooLarge)
        ));
    }
}
