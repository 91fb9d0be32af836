//! What the connected runtime can take, decided from ConfigureRequest alone
//! (runtime name and version, and the NRI version when the runtime states it),
//! and the record of it that `devgate status` shows.
//!
//! - Explicit `linux.resources.devices` rules take effect from NRI v0.10
//!   (nri#168); before that the runtime drops them silently.
//! - `CDI_devices` in an adjustment are injected by containerd from 2.1.0 and
//!   CRI-O from 1.34. containerd 1.7.30+ injects them only with `enable_cdi`,
//!   which is off by default in 1.7 and invisible to a plugin, and 1.7.26-1.7.29
//!   and 2.0 drop them silently (containerd#12650), so those get raw nodes.
//! - Events: the stub subscribes only to events the runtime's NRI accepts.
use std::path::{Path, PathBuf};

use nri::RuntimeInfo;
use serde::{Deserialize, Serialize};

use crate::config::DeviceMode;
use crate::fsutil::{self, FsError};

use super::devices::RuntimeFeatures;

/// The record's file in the state directory.
pub const RUNTIME_FILE: &str = "runtime.json";
/// Upper bound when reading the record back.
const MAX_RECORD_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FeaturesError {
    #[error("write runtime record {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: FsError,
    },
    #[error("read runtime record {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("runtime record {path} is larger than {MAX_RECORD_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("encode runtime record {path}")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("decode runtime record {path}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The features of `runtime`.
pub fn detect(runtime: &RuntimeInfo) -> RuntimeFeatures {
    RuntimeFeatures {
        explicit_cgroup_rules: runtime
            .nri_version
            .is_some_and(|v| v >= nri::NriVersion::new(0, 10, 0)),
        cdi_devices: injects_cdi(&runtime.name, &runtime.version),
    }
}

fn injects_cdi(name: &str, version: &str) -> bool {
    let Some(v) = release(version) else {
        return false;
    };
    match name {
        "containerd" => v >= (2, 1, 0),
        "cri-o" | "crio" | "CRI-O" => v >= (1, 34, 0),
        _ => false,
    }
}

/// `2.1.9+unknown`, `v1.7.24`, `1.7.24~ds1` → (major, minor, patch).
fn release(version: &str) -> Option<(u32, u32, u32)> {
    let core = version.trim().trim_start_matches('v');
    let core = core.split(['-', '+', '~']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().unwrap_or(Some(0))?;
    Some((major, minor, patch))
}

/// How devices reach containers under `mode` on a runtime with `features`.
pub fn devices_as(mode: DeviceMode, features: RuntimeFeatures) -> DeviceMode {
    match mode {
        DeviceMode::Cdi if features.cdi_devices => DeviceMode::Cdi,
        _ => DeviceMode::Nodes,
    }
}

/// The runtime devgate last configured with, and what it uses there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeRecord {
    pub runtime: String,
    pub version: String,
    /// Stated by the runtime (NRI v0.12+) or inferred from its release.
    pub nri_version: Option<String>,
    /// The subscription sent, e.g. `0x60c`.
    pub events: String,
    pub explicit_cgroup_rules: bool,
    pub cdi_devices: bool,
    /// `device_mode` of the config.
    pub device_mode: DeviceMode,
    /// What the adjustment uses: `cdi` only where the runtime injects CDI devices.
    pub devices_as: DeviceMode,
    pub configured_unix: u64,
}

impl RuntimeRecord {
    pub fn new(runtime: &RuntimeInfo, features: RuntimeFeatures, mode: DeviceMode) -> Self {
        RuntimeRecord {
            runtime: runtime.name.chars().take(64).collect(),
            version: runtime.version.chars().take(64).collect(),
            nri_version: runtime.nri_version.map(|v| v.to_string()),
            events: runtime.events.to_string(),
            explicit_cgroup_rules: features.explicit_cgroup_rules,
            cdi_devices: features.cdi_devices,
            device_mode: mode,
            devices_as: devices_as(mode, features),
            configured_unix: crate::ledger::now_unix(),
        }
    }

    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(RUNTIME_FILE)
    }

    /// Replaces the record atomically.
    pub fn save(&self, state_dir: &Path) -> Result<(), FeaturesError> {
        let path = Self::path(state_dir);
        let bytes = serde_json::to_vec_pretty(self).map_err(|source| FeaturesError::Encode {
            path: path.clone(),
            source,
        })?;
        fsutil::replace_file(&path, &bytes).map_err(|source| FeaturesError::Write { path, source })
    }

    /// The record, or `None` when no runtime has configured devgate yet.
    pub fn load(state_dir: &Path) -> Result<Option<RuntimeRecord>, FeaturesError> {
        use std::io::Read as _;
        let path = Self::path(state_dir);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(FeaturesError::Read { path, source }),
        };
        let mut bytes = Vec::new();
        file.take(MAX_RECORD_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| FeaturesError::Read {
                path: path.clone(),
                source,
            })?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(FeaturesError::TooLarge { path });
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| FeaturesError::Decode { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nri::NriVersion;

    fn info(name: &str, version: &str, nri: Option<NriVersion>) -> RuntimeInfo {
        RuntimeInfo {
            name: name.into(),
            version: version.into(),
            nri_version: nri.or_else(|| NriVersion::infer_from_runtime(name, version)),
            ..RuntimeInfo::default()
        }
    }

    #[test]
    fn containerd_lines_get_what_they_apply() {
        let cases = [
            // (version, explicit rules, cdi)
            ("1.7.24~ds1", false, false),
            ("1.7.30", false, false),
            ("2.0.4", false, false),
            ("2.1.0", false, true),
            ("2.1.9+unknown", false, true),
            ("v2.2.1", true, true),
            ("dev", false, false),
        ];
        for (version, rules, cdi) in cases {
            let f = detect(&info("containerd", version, None));
            assert_eq!(
                (f.explicit_cgroup_rules, f.cdi_devices),
                (rules, cdi),
                "{version}"
            );
        }
    }

    #[test]
    fn stated_nri_version_wins_and_other_runtimes_get_no_cdi() {
        let f = detect(&info(
            "containerd",
            "2.1.9",
            Some(NriVersion::new(0, 12, 0)),
        ));
        assert!(f.explicit_cgroup_rules);
        assert!(detect(&info("cri-o", "1.34.0", None)).cdi_devices);
        assert!(!detect(&info("cri-o", "1.33.2", None)).cdi_devices);
        assert!(!detect(&info("podman", "5.0.0", None)).cdi_devices);
    }

    #[test]
    fn cdi_mode_falls_back_to_nodes_without_runtime_support() {
        let with = RuntimeFeatures {
            cdi_devices: true,
            ..RuntimeFeatures::default()
        };
        assert_eq!(devices_as(DeviceMode::Cdi, with), DeviceMode::Cdi);
        let without = RuntimeFeatures::default();
        assert_eq!(devices_as(DeviceMode::Cdi, without), DeviceMode::Nodes);
        assert_eq!(devices_as(DeviceMode::Nodes, with), DeviceMode::Nodes);
    }

    #[test]
    fn record_round_trips_and_absent_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(RuntimeRecord::load(dir.path()).unwrap(), None);
        let runtime = info("containerd", "2.1.9+unknown", None);
        let f = detect(&runtime);
        let rec = RuntimeRecord::new(&runtime, f, DeviceMode::Cdi);
        rec.save(dir.path()).unwrap();
        let back = RuntimeRecord::load(dir.path()).unwrap().unwrap();
        assert_eq!(back, rec);
        assert_eq!(back.nri_version.as_deref(), Some("v0.8.0"));
        assert_eq!(back.devices_as, DeviceMode::Cdi);
    }

    #[test]
    fn oversized_or_garbage_record_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = RuntimeRecord::path(dir.path());
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(
            RuntimeRecord::load(dir.path()),
            Err(FeaturesError::Decode { .. })
        ));
        std::fs::write(&path, vec![b' '; 70 * 1024]).unwrap();
        assert!(matches!(
            RuntimeRecord::load(dir.path()),
            Err(FeaturesError::TooLarge { .. })
        ));
    }
}
