//! What the connected runtime can take, decided from ConfigureRequest alone
//! (runtime name and version, and the NRI version when the runtime states it),
//! and the record of it that `devgate status` shows.
//!
//! - Explicit `linux.resources.devices` rules take effect from NRI v0.10
//!   (nri#168); before that the runtime drops them silently.
//! - `CDI_devices` in an adjustment are injected by containerd from 2.1.0 and
//!   CRI-O from 1.34. containerd 1.7.30+ injects them only with `enable_cdi`,
//!   which is off by default in 1.7 and invisible to a plugin: the operator
//!   states it with `runtime_cdi = "on"`. 1.7.26-1.7.29 and 2.0 drop them
//!   silently (containerd#12650), so those get raw nodes whatever the config
//!   says; `runtime_cdi = "off"` keeps raw nodes everywhere.
//! - Events: the stub subscribes only to events the runtime's NRI accepts.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::Flock;
use nri::RuntimeInfo;
use serde::{Deserialize, Serialize};

use crate::config::{DeviceMode, RuntimeCdi};
use crate::fsutil::{self, FsError};

use super::devices::RuntimeFeatures;

/// The record's file in the state directory, replaced at every Configure:
/// `devgate doctor` and `install/bootstrap.sh` (after its restarts, where a
/// pre-installed plugin without a new record is undone) take it as the
/// runtime's acceptance of the plugin.
pub const RUNTIME_FILE: &str = "runtime.json";
/// Held while a plugin replaces the record or marks it: two plugins
/// overlapping (a rollout) must not write one's read back over the other's.
const RUNTIME_LOCK: &str = "runtime.lock";
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
    #[error("lock runtime record")]
    Lock(#[source] FsError),
}

/// The features of `runtime`, with what the config states about its CDI injection.
pub fn detect(runtime: &RuntimeInfo, cdi: RuntimeCdi) -> RuntimeFeatures {
    RuntimeFeatures {
        explicit_cgroup_rules: runtime
            .nri_version
            .is_some_and(|v| v >= nri::NriVersion::new(0, 10, 0)),
        cdi_devices: injects_cdi(&runtime.name, &runtime.version, cdi),
    }
}

/// `on` only adds containerd 1.7.30+, where injection depends on `enable_cdi`;
/// it never enables a release that drops CDI devices silently: a container
/// would then start without its devices.
fn injects_cdi(name: &str, version: &str, cdi: RuntimeCdi) -> bool {
    let Some(v) = release(version) else {
        return false;
    };
    let stated_on = cdi == RuntimeCdi::On;
    match (name, cdi) {
        (_, RuntimeCdi::Off) => false,
        ("containerd", _) => v >= (2, 1, 0) || (stated_on && ((1, 7, 30)..(1, 8, 0)).contains(&v)),
        ("cri-o" | "crio" | "CRI-O", _) => v >= (1, 34, 0),
        _ => false,
    }
}

/// `2.1.9+unknown`, `v1.7.24`, `1.7.24~ds1` → (major, minor, patch).
pub fn release(version: &str) -> Option<(u32, u32, u32)> {
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
    /// `runtime_cdi` of the config (absent in records of older releases).
    #[serde(default)]
    pub runtime_cdi: RuntimeCdi,
    /// What the adjustment uses: `cdi` only where the runtime injects CDI devices.
    pub devices_as: DeviceMode,
    pub configured_unix: u64,
    /// The plugin process that wrote the record: `devgate clear` counts its
    /// NVML handles as no GPU's user while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<crate::ledger::InitProcess>,
    /// The plugin's `--host-root`, absolute: where `devgate status` reads the
    /// PCIe placement of held devices when not given a root of its own
    /// (absent in records of older releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_root: Option<PathBuf>,
    /// Why the config the runtime sent a plugin it launched is invalid:
    /// containers that need devgate are refused until the runtime sends a
    /// valid one, and `devgate ready` says not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
    /// How long the runtime waits for an answer, in milliseconds, where it
    /// states it (NRI v0.7 and later); the waits of a request are shares of
    /// it (`plugin::budget`), of 2 s where it is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// When the runtime closed the connection this record's Configure came
    /// on (a runtime restarting, or one that dropped the plugin): the
    /// plugin serves no creation until a runtime configures it again, which
    /// writes a record without it. `devgate ready` says not ready meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disconnected_unix: Option<u64>,
}

impl RuntimeRecord {
    pub fn new(
        runtime: &RuntimeInfo,
        features: RuntimeFeatures,
        mode: DeviceMode,
        runtime_cdi: RuntimeCdi,
        host_root: &Path,
    ) -> Self {
        RuntimeRecord {
            runtime: runtime.name.chars().take(64).collect(),
            version: runtime.version.chars().take(64).collect(),
            nri_version: runtime.nri_version.map(|v| v.to_string()),
            events: runtime.events.to_string(),
            explicit_cgroup_rules: features.explicit_cgroup_rules,
            cdi_devices: features.cdi_devices,
            device_mode: mode,
            runtime_cdi,
            devices_as: devices_as(mode, features),
            configured_unix: crate::ledger::now_unix(),
            plugin: crate::hook::liveness::identify(Path::new("/proc"), std::process::id()),
            host_root: std::path::absolute(host_root).ok(),
            config_error: None,
            request_timeout_ms: runtime
                .stated_request_timeout()
                .map(|t| t.as_millis() as u64),
            disconnected_unix: None,
        }
    }

    /// Marks the record of this process's last Configure as disconnected,
    /// once; a record of another process (a successor's) is left as it is.
    /// Whether it marked one.
    pub fn note_disconnected(state_dir: &Path) -> Result<bool, FeaturesError> {
        let _held = Self::lock(state_dir)?;
        let Some(mut record) = Self::load(state_dir)? else {
            return Ok(false);
        };
        let me = crate::hook::liveness::identify(Path::new("/proc"), std::process::id());
        if record.plugin.is_none() || record.plugin != me || record.disconnected_unix.is_some() {
            return Ok(false);
        }
        record.disconnected_unix = Some(crate::ledger::now_unix());
        record.save(state_dir).map(|()| true)
    }

    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(RUNTIME_FILE)
    }

    /// [`Self::save`] under the record's lock, as a plugin's Configure does:
    /// a predecessor marking its own record waits, then finds this one.
    pub fn store(&self, state_dir: &Path) -> Result<(), FeaturesError> {
        let _held = Self::lock(state_dir)?;
        self.save(state_dir)
    }

    fn lock(state_dir: &Path) -> Result<Flock<File>, FeaturesError> {
        fsutil::lock_exclusive(&state_dir.join(RUNTIME_LOCK)).map_err(FeaturesError::Lock)
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
        use crate::fsutil::BoundedError;
        let path = Self::path(state_dir);
        let bytes = match crate::fsutil::read_file_bounded(&path, MAX_RECORD_BYTES) {
            Ok(bytes) => bytes,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(BoundedError::Io(source)) => return Err(FeaturesError::Read { path, source }),
            Err(BoundedError::TooLarge { .. }) => return Err(FeaturesError::TooLarge { path }),
        };
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
            let f = detect(&info("containerd", version, None), RuntimeCdi::Auto);
            assert_eq!(
                (f.explicit_cgroup_rules, f.cdi_devices),
                (rules, cdi),
                "{version}"
            );
        }
    }

    #[test]
    fn stated_nri_version_wins_and_other_runtimes_get_no_cdi() {
        let auto = RuntimeCdi::Auto;
        let f = detect(
            &info("containerd", "2.1.9", Some(NriVersion::new(0, 12, 0))),
            auto,
        );
        assert!(f.explicit_cgroup_rules);
        assert!(detect(&info("cri-o", "1.34.0", None), auto).cdi_devices);
        assert!(!detect(&info("cri-o", "1.33.2", None), auto).cdi_devices);
        assert!(!detect(&info("podman", "5.0.0", None), auto).cdi_devices);
    }

    /// containerd 1.7.30+ injects only with `enable_cdi`, which the plugin cannot
    /// see: `on` states it, and never enables a release that drops CDI devices.
    #[test]
    fn runtime_cdi_overrides_only_where_the_runtime_can_inject() {
        let cases = [
            // (runtime, version, auto, on, off)
            ("containerd", "1.7.24~ds1", false, false, false),
            ("containerd", "1.7.29", false, false, false),
            ("containerd", "1.7.30", false, true, false),
            ("containerd", "v1.7.31", false, true, false),
            ("containerd", "2.0.7", false, false, false),
            ("containerd", "2.1.9+unknown", true, true, false),
            ("cri-o", "1.34.0", true, true, false),
            ("podman", "5.0.0", false, false, false),
            ("containerd", "garbage", false, false, false),
        ];
        for (name, version, auto, on, off) in cases {
            let rt = info(name, version, None);
            let got = [RuntimeCdi::Auto, RuntimeCdi::On, RuntimeCdi::Off]
                .map(|c| detect(&rt, c).cdi_devices);
            assert_eq!(got, [auto, on, off], "{name} {version}");
        }
    }

    #[test]
    fn runtime_cdi_parses_and_defaults_to_auto() {
        use crate::config::Config;
        assert_eq!(Config::default().runtime_cdi, RuntimeCdi::Auto);
        let c = Config::parse("runtime_cdi = \"on\"\n", "test").unwrap();
        assert_eq!(c.runtime_cdi, RuntimeCdi::On);
        assert!(Config::parse("runtime_cdi = \"yes\"\n", "test").is_err());
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
        let f = detect(&runtime, RuntimeCdi::Auto);
        let rec = RuntimeRecord::new(
            &runtime,
            f,
            DeviceMode::Cdi,
            RuntimeCdi::Auto,
            Path::new("fixture/host"),
        );
        rec.save(dir.path()).unwrap();
        let back = RuntimeRecord::load(dir.path()).unwrap().unwrap();
        assert_eq!(back, rec);
        let host_root = back.host_root.as_deref().unwrap();
        assert!(host_root.is_absolute() && host_root.ends_with("fixture/host"));
        let mut old: serde_json::Value = serde_json::to_value(&rec).unwrap();
        old.as_object_mut().unwrap().remove("host_root");
        let old: RuntimeRecord = serde_json::from_value(old).unwrap();
        assert_eq!(old.host_root, None);
        let mut old: serde_json::Value = serde_json::to_value(&rec).unwrap();
        old.as_object_mut().unwrap().remove("runtime_cdi");
        let old: RuntimeRecord = serde_json::from_value(old).unwrap();
        assert_eq!(old.runtime_cdi, RuntimeCdi::Auto);
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
