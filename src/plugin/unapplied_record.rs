//! The containers Synchronize found running without their allocation
//! ([`super::unapplied`]), kept in `<state-dir>/unapplied.json` for
//! `devgate status`: the log line alone scrolls away, and such a container has
//! neither its GPUs nor its VFs until it is restarted. An entry goes when the
//! runtime removes the container or its pod, when the container is created
//! again (kubelet's restart, which keeps the exited one until the pod goes),
//! or when a later Synchronize no longer finds it running (one removed while
//! the runtime synchronized sends no event).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::fsutil::{self, BoundedError, FsError};

pub const UNAPPLIED_FILE: &str = "unapplied.json";
/// Containers listed at most; a node runs a few hundred.
const MAX_LISTED: usize = 4096;
/// 4096 entries of the longest names Kubernetes allows, in compact JSON.
const MAX_FILE_BYTES: u64 = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum UnappliedError {
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: BoundedError,
    },
    #[error("decode {path}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("encode {path}")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: FsError,
    },
}

/// A container created while devgate was not connected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unapplied {
    pub namespace: String,
    pub pod: String,
    pub sandbox_id: String,
    pub container: String,
    pub id: String,
    /// When a Synchronize first found it.
    pub found_unix: u64,
}

/// The file's document.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Document {
    containers: Vec<Unapplied>,
}

/// The list as the plugin keeps it, written through on every change.
#[derive(Debug)]
pub struct UnappliedRecord {
    path: PathBuf,
    list: Mutex<Vec<Unapplied>>,
}

impl UnappliedRecord {
    /// The list a previous run left, so that removals prune it and a
    /// container found again keeps when it was first found.
    pub fn new(state_dir: &Path) -> UnappliedRecord {
        let list = load(state_dir).unwrap_or_else(|e| {
            tracing::warn!(error = %nri::ErrorChain(&e), "unapplied containers of a previous run not read");
            Vec::new()
        });
        UnappliedRecord {
            path: state_dir.join(UNAPPLIED_FILE),
            list: Mutex::new(list),
        }
    }

    /// What a Synchronize found: the list becomes exactly these, each keeping
    /// the time it was first found.
    pub fn set(&self, mut found: Vec<Unapplied>) {
        if found.len() > MAX_LISTED {
            tracing::warn!(
                found = found.len(),
                listed = MAX_LISTED,
                "more containers without their allocation than are listed"
            );
            found.truncate(MAX_LISTED);
        }
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        for f in &mut found {
            if let Some(old) = list.iter().find(|o| o.id == f.id) {
                f.found_unix = old.found_unix;
            }
        }
        *list = found;
        self.write(&list);
    }

    /// The runtime removed a container, or a whole pod (`sandbox`).
    pub fn forget(&self, sandbox: &str, container: Option<&str>) {
        self.forget_where(|u| u.sandbox_id == sandbox && container.is_none_or(|c| c == u.id));
    }

    /// A container `name` of `sandbox` was created (admitted, or given
    /// nothing): an earlier one of that name, listed, was replaced.
    pub fn forget_replaced(&self, sandbox: &str, name: &str) {
        self.forget_where(|u| u.sandbox_id == sandbox && u.container == name);
    }

    fn forget_where(&self, gone: impl Fn(&Unapplied) -> bool) {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        // The usual case, on every creation and removal: nothing listed,
        // nothing written.
        if list.is_empty() {
            return;
        }
        let before = list.len();
        list.retain(|u| !gone(u));
        if list.len() != before {
            self.write(&list);
        }
    }

    /// A failed write is logged: the list is a report, and the next change
    /// writes it whole again.
    fn write(&self, list: &[Unapplied]) {
        if let Err(e) = save(&self.path, list) {
            tracing::warn!(error = %nri::ErrorChain(&e), "unapplied containers not recorded");
        }
    }
}

fn save(path: &Path, list: &[Unapplied]) -> Result<(), UnappliedError> {
    let doc = Document {
        containers: list.to_vec(),
    };
    let bytes = serde_json::to_vec(&doc).map_err(|source| UnappliedError::Encode {
        path: path.to_path_buf(),
        source,
    })?;
    fsutil::replace_file_mode(path, &bytes, 0o644).map_err(|source| UnappliedError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The containers listed under `state_dir`; none when the file is not there.
pub fn load(state_dir: &Path) -> Result<Vec<Unapplied>, UnappliedError> {
    let path = state_dir.join(UNAPPLIED_FILE);
    let bytes = match fsutil::read_file_bounded(&path, MAX_FILE_BYTES) {
        Ok(bytes) => bytes,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(source) => return Err(UnappliedError::Read { path, source }),
    };
    let doc: Document =
        serde_json::from_slice(&bytes).map_err(|source| UnappliedError::Decode { path, source })?;
    Ok(doc.containers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sandbox: &str, id: &str, found: u64) -> Unapplied {
        Unapplied {
            namespace: "team".into(),
            pod: format!("pod-{sandbox}"),
            sandbox_id: sandbox.into(),
            container: "main".into(),
            id: id.into(),
            found_unix: found,
        }
    }

    #[test]
    fn found_containers_stay_listed_until_removed() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), vec![]);
        let record = UnappliedRecord::new(dir.path());
        record.set(vec![
            entry("a", "a1", 10),
            entry("a", "a2", 10),
            entry("b", "b1", 10),
        ]);
        assert_eq!(load(dir.path()).unwrap().len(), 3);
        // Found again later: the first time is kept; one gone meanwhile goes.
        record.set(vec![entry("a", "a1", 20), entry("a", "a2", 20)]);
        let listed = load(dir.path()).unwrap();
        assert_eq!(listed, [entry("a", "a1", 10), entry("a", "a2", 10)]);
        record.forget("a", Some("a2"));
        assert_eq!(load(dir.path()).unwrap(), [entry("a", "a1", 10)]);
        // Another pod's removal, or another container's, changes nothing.
        record.forget("b", None);
        record.forget("a", Some("a9"));
        assert_eq!(load(dir.path()).unwrap().len(), 1);
        record.forget("a", None);
        assert_eq!(load(dir.path()).unwrap(), vec![]);
    }

    /// A restart of the container (kubelet creates one of the same name)
    /// unlists the exited one; a new run of the plugin prunes what an
    /// earlier one listed, and keeps when it was first found.
    #[test]
    fn a_recreated_container_and_a_restarted_plugin_keep_the_list_true() {
        let dir = tempfile::tempdir().unwrap();
        let record = UnappliedRecord::new(dir.path());
        record.set(vec![entry("a", "a1", 10), entry("b", "b1", 10)]);
        record.forget_replaced("a", "sidecar");
        assert_eq!(load(dir.path()).unwrap().len(), 2);
        record.forget_replaced("a", "main");
        assert_eq!(load(dir.path()).unwrap(), [entry("b", "b1", 10)]);
        let again = UnappliedRecord::new(dir.path());
        again.set(vec![entry("b", "b1", 30)]);
        assert_eq!(load(dir.path()).unwrap(), [entry("b", "b1", 10)]);
        again.forget("b", Some("b1"));
        assert_eq!(load(dir.path()).unwrap(), vec![]);
    }

    #[test]
    fn an_unreadable_list_is_an_error_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(UNAPPLIED_FILE), "{not json").unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(err.to_string().starts_with("decode "), "{err}");
    }
}
