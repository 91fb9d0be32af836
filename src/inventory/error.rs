//! Why one part of a host root could not be read. Discovery turns these into warnings.

use std::io;
use std::path::PathBuf;

use super::hostfs::{MAX_DIR_ENTRIES, MAX_FILE_BYTES, MAX_SYMLINKS};

/// One thing discovery could not read; `path` is relative to the host root.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: more than {MAX_SYMLINKS} symbolic links (a loop?)")]
    SymlinkLoop { path: PathBuf },
    #[error("{path} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} is not utf-8")]
    NotUtf8 { path: PathBuf },
    #[error("{path} has more than {MAX_DIR_ENTRIES} entries")]
    TooManyEntries { path: PathBuf },
    #[error("{path}: unexpected value {value:?}")]
    Malformed { path: PathBuf, value: String },
    #[error("{path}: no {field:?} line")]
    MissingField { path: PathBuf, field: &'static str },
    #[error("{device}: {what}")]
    Device { device: String, what: String },
}

impl InventoryError {
    /// Builds `Malformed`, keeping at most 64 characters of the bad value.
    pub(crate) fn malformed(path: impl Into<PathBuf>, value: &str) -> Self {
        InventoryError::Malformed {
            path: path.into(),
            value: value.trim_end().chars().take(64).collect(),
        }
    }

    /// True when the error is "no such file": optional files are allowed to be missing.
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, InventoryError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// One line with the whole cause chain, for `Inventory.warnings`. Control characters
    /// (a newline in a file name of a malformed tree) are escaped to keep it one line.
    pub(crate) fn to_warning(&self) -> String {
        let mut line = nri::ErrorChain(self).to_string();
        if line.contains(char::is_control) {
            line = line.chars().flat_map(escape_control).collect();
        }
        line
    }
}

fn escape_control(c: char) -> Vec<char> {
    if c.is_control() {
        c.escape_default().collect()
    } else {
        vec![c]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_one_line_with_their_causes() {
        let err = InventoryError::Io {
            path: PathBuf::from("sys/class/net/a\nb"),
            source: io::ErrorKind::NotFound.into(),
        };
        assert_eq!(
            err.to_warning(),
            "read sys/class/net/a\\nb: entity not found"
        );
        assert!(err.is_not_found());
        let bad = InventoryError::malformed("numa_node", &"x".repeat(100));
        assert_eq!(
            bad.to_warning(),
            format!("numa_node: unexpected value {:?}", "x".repeat(64))
        );
    }
}
