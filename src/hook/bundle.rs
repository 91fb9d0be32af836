//! `<bundle>/config.json` on the hooks-only path, read and parsed once per hook
//! run for both things taken from it: the rootfs where device nodes are made
//! (runtime-spec config.md, `root.path`) and the device rules the cgroup v2
//! program keeps (config-linux.md, `linux.devices` and
//! `linux.resources.devices`).

use std::path::{Path, PathBuf};

use crate::fsutil::{self, BoundedError};

use super::cgroup_v2::Spec;

/// A runtime's `config.json` is a few KiB to a few hundred with many mounts; a
/// bound keeps a bad bundle from costing memory.
pub const MAX_BUNDLE_CONFIG_BYTES: u64 = 8 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("read bundle config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bundle config {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// What the hook takes from a container's bundle.
#[derive(Debug)]
pub struct Bundle {
    /// The container's root filesystem as the runtime's mount namespace
    /// sees it (relative `root.path` resolved against the bundle).
    pub rootfs: PathBuf,
    pub spec: Spec,
}

impl Bundle {
    pub fn read(bundle: &Path) -> Result<Bundle, BundleError> {
        let path = bundle.join("config.json");
        let invalid = |reason: String| BundleError::Invalid {
            path: path.clone(),
            reason,
        };
        let bytes = match fsutil::read_file_bounded(&path, MAX_BUNDLE_CONFIG_BYTES) {
            Ok(bytes) => bytes,
            Err(BoundedError::Io(source)) => return Err(BundleError::Read { path, source }),
            Err(e @ BoundedError::TooLarge { .. }) => return Err(invalid(e.to_string())),
        };
        let spec: Spec = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        let root = spec
            .root_path()
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or_else(|| invalid("root.path is missing or empty".to_string()))?;
        let rootfs = if root.is_absolute() {
            root.to_path_buf()
        } else {
            bundle.join(root)
        };
        Ok(Bundle { rootfs, spec })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rootfs_and_rules_come_from_one_bounded_read() {
        let bundle = tempfile::tempdir().unwrap();
        let config = bundle.path().join("config.json");
        let write = |v: &str| std::fs::write(&config, v).unwrap();
        assert!(matches!(
            Bundle::read(bundle.path()),
            Err(BundleError::Read { .. })
        ));
        write(r#"{"ociVersion":"1.0.2","root":{"path":"/var/lib/c/merged"},"process":{}}"#);
        let b = Bundle::read(bundle.path()).unwrap();
        assert_eq!(b.rootfs, Path::new("/var/lib/c/merged"));
        let defaults = b.spec.runtime_rules().unwrap().len();
        write(
            r#"{"root":{"path":"rootfs","readonly":true},"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]}}}"#,
        );
        let b = Bundle::read(bundle.path()).unwrap();
        assert_eq!(b.rootfs, bundle.path().join("rootfs"));
        assert_eq!(b.spec.runtime_rules().unwrap().len(), defaults + 1);
        for bad in [r#"{"root":{"path":""}}"#, r#"{}"#, "{", r#"{"root":7}"#] {
            write(bad);
            let e = Bundle::read(bundle.path()).unwrap_err();
            assert!(matches!(e, BundleError::Invalid { .. }), "{bad}: {e}");
        }
        std::fs::File::create(&config)
            .unwrap()
            .set_len(MAX_BUNDLE_CONFIG_BYTES + 1)
            .unwrap();
        let e = Bundle::read(bundle.path()).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
    }
}
