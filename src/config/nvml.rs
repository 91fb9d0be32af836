//! `[gpu] nvml_library`: where NVML is loaded from. One name, or a list tried in
//! order until one loads, so that one ConfigMap serves nodes whose distributions
//! keep the driver's library in different directories.
//!
//! ```toml
//! [gpu]
//! nvml_library = ["/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/host/usr/lib64/libnvidia-ml.so.1"]
//! ```
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// More would only be a typo'd list; each is one `dlopen(3)` at first use.
const MAX_CANDIDATES: usize = 8;
/// Linux's PATH_MAX.
const MAX_NAME_BYTES: usize = 4096;

#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    One(String),
    Many(Vec<String>),
}

/// The candidates, in the order they are tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Written", into = "Vec<String>")]
pub struct NvmlLibraries(Vec<String>);

impl From<Written> for NvmlLibraries {
    fn from(w: Written) -> Self {
        match w {
            Written::One(name) => NvmlLibraries(vec![name]),
            Written::Many(names) => NvmlLibraries(names),
        }
    }
}

impl From<NvmlLibraries> for Vec<String> {
    fn from(l: NvmlLibraries) -> Self {
        l.0
    }
}

impl Default for NvmlLibraries {
    fn default() -> Self {
        NvmlLibraries(vec![crate::gpu::nvml::NVML_LIBRARY.to_string()])
    }
}

impl NvmlLibraries {
    pub fn new(names: &[&str]) -> NvmlLibraries {
        NvmlLibraries(names.iter().map(|n| n.to_string()).collect())
    }

    pub fn candidates(&self) -> &[String] {
        &self.0
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            key: "gpu.nvml_library".to_string(),
            reason,
        };
        if self.0.is_empty() || self.0.len() > MAX_CANDIDATES {
            return Err(invalid(format!(
                "{} names; give 1 to {MAX_CANDIDATES}",
                self.0.len()
            )));
        }
        for lib in &self.0 {
            // dlopen(3) takes a name without a slash as a soname to search for, so
            // a relative path would be looked up in the library path, not where it says.
            let reason = if lib.is_empty() {
                Some("empty")
            } else if lib.len() > MAX_NAME_BYTES {
                Some("longer than 4096 bytes")
            } else if lib.contains('/') && !lib.starts_with('/') {
                Some("a path must be absolute")
            } else if lib.contains('\0') {
                Some("contains a NUL byte")
            } else {
                None
            };
            if let Some(reason) = reason {
                let shown: String = lib.chars().take(64).collect();
                return Err(invalid(format!("{reason}: {shown:?}")));
            }
        }
        Ok(())
    }
}
