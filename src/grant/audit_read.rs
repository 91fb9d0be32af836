//! The counters as another process (`devgate status`) reads them.

use std::path::{Path, PathBuf};

use super::{GrantCounters, COUNTERS_FILE, MAX_COUNTERS_BYTES};
use crate::fsutil;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("decode {path}: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The counters as the plugin last wrote them; zero when it never did.
pub fn read_counters(state_dir: &Path) -> Result<GrantCounters, AuditError> {
    let path = state_dir.join(COUNTERS_FILE);
    match fsutil::read_file_bounded(&path, MAX_COUNTERS_BYTES) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map_err(|source| AuditError::Decode { path, source })
        }
        Err(e) if e.is_not_found() => Ok(GrantCounters::default()),
        Err(e) => Err(AuditError::Read {
            path,
            source: e.into(),
        }),
    }
}

/// `devgate status`'s lines for the counters.
pub fn table(c: &GrantCounters) -> String {
    let reasons: Vec<String> = c
        .refused_by_reason
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let mut out = format!(
        "GRANTS granted {} unchecked {} unverified {} refused {}",
        c.granted, c.unchecked, c.unverified, c.refused
    );
    if !reasons.is_empty() {
        out.push_str(&format!(" ({})", reasons.join(", ")));
    }
    out.push('\n');
    if let Some(r) = &c.last_refusal {
        out.push_str(&format!(
            "last refusal: {} container {}: {}\n",
            r.pod, r.container, r.reason
        ));
    }
    out
}
