//! The probe annotation: proves the CreateContainer path end to end.
//!
//! A pod annotated `devgate.io/probe=<value>` gets `DEVGATE_PROBE=<value>`
//! in the environment of each of its containers. Pod annotations reach NRI
//! from the CRI sandbox config (containerd `pkg/cri/nri`), so this is what a
//! Kubernetes pod author sets.

use nri::api::{KeyValue, PodSandbox};

/// Pod annotation read by the probe.
pub const PROBE_ANNOTATION: &str = "devgate.io/probe";
/// Environment variable the probe sets.
pub const PROBE_ENV: &str = "DEVGATE_PROBE";
/// Longest accepted value; the annotation is pod-author input.
pub const MAX_PROBE_BYTES: usize = 256;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbeError {
    #[error("pod annotation {PROBE_ANNOTATION} is {len} bytes long, limit {MAX_PROBE_BYTES}")]
    TooLong { len: usize },
    // exec(2) takes environment strings NUL-terminated; the runtime would fail later.
    #[error("pod annotation {PROBE_ANNOTATION} contains a NUL byte")]
    Nul,
}

/// The environment entry the probe adds to containers of `pod`, if any.
pub fn probe_env(pod: &PodSandbox) -> Result<Option<KeyValue>, ProbeError> {
    let Some(value) = super::reads::annotations(pod).get(PROBE_ANNOTATION) else {
        return Ok(None);
    };
    if value.len() > MAX_PROBE_BYTES {
        return Err(ProbeError::TooLong { len: value.len() });
    }
    if value.contains('\0') {
        return Err(ProbeError::Nul);
    }
    Ok(Some(KeyValue {
        key: PROBE_ENV.to_string(),
        value: value.to_string(),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_with(value: Option<&str>) -> PodSandbox {
        let mut pod = PodSandbox::default();
        if let Some(v) = value {
            pod.annotations
                .insert(PROBE_ANNOTATION.to_string(), v.to_string());
        }
        pod
    }

    /// Annotation value (None = absent) and the expected env value.
    type Case<'a> = (Option<&'a str>, Result<Option<&'a str>, ProbeError>);

    #[test]
    fn table() {
        let long = "x".repeat(MAX_PROBE_BYTES + 1);
        let limit = "y".repeat(MAX_PROBE_BYTES);
        let cases: [Case; 6] = [
            (None, Ok(None)),
            (Some("hello"), Ok(Some("hello"))),
            (Some(""), Ok(Some(""))),
            (Some(&limit), Ok(Some(&limit))),
            (
                Some(&long),
                Err(ProbeError::TooLong {
                    len: MAX_PROBE_BYTES + 1,
                }),
            ),
            (Some("a\0b"), Err(ProbeError::Nul)),
        ];
        for (input, want) in cases {
            let got = probe_env(&pod_with(input));
            let got = got.map(|kv| {
                kv.map(|kv| {
                    assert_eq!(kv.key, PROBE_ENV);
                    kv.value
                })
            });
            assert_eq!(got, want.map(|v| v.map(str::to_string)), "{input:?}");
        }
    }

    #[test]
    fn other_annotations_are_ignored() {
        let mut pod = PodSandbox::default();
        pod.annotations
            .insert("devgate.io/probe-not".to_string(), "v".to_string());
        assert_eq!(probe_env(&pod), Ok(None));
    }

    #[test]
    fn error_names_the_annotation() {
        let err = probe_env(&pod_with(Some(&"z".repeat(300)))).unwrap_err();
        assert!(err.to_string().contains(PROBE_ANNOTATION), "{err}");
    }
}
