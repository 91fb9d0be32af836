//! HAMi-core's shared lock directory on the host, which the plan binds
//! read-write into every HAMi-core container. runc's bind follows links in
//! its source, so a directory any user could make first, or replace, would
//! let that user hand containers a host directory of their choice: the
//! directory must be root's, and so must every directory above it, none of
//! them writable by others unless sticky (as `/tmp` is), where only root
//! could move it away.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Any container user makes its lock file there; sticky, so that none
/// removes another's.
const MODE: u32 = 0o1777;

#[derive(Debug, thiserror::Error)]
#[error("hami.host_lock_dir {path}: {reason}")]
pub struct HamiLockError {
    pub path: PathBuf,
    pub reason: String,
}

/// Makes `path` where it is missing (root's, mode 1777, its missing parents
/// root's, mode 0755) and checks that it, as the kernel resolves it, and
/// every directory above it are root's and writable by no one else but
/// where sticky.
pub fn ensure_hami_lock_dir(path: &Path) -> Result<(), HamiLockError> {
    let err = |reason: String| HamiLockError {
        path: path.to_path_buf(),
        reason,
    };
    if std::fs::symlink_metadata(path).is_err() {
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(|e| err(format!("create its parent: {e}")))?;
        }
        match std::fs::DirBuilder::new().mode(MODE).create(path) {
            // The mode without the umask's cut; made by another meanwhile,
            // it is checked below as any is.
            Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(MODE))
                .map_err(|e| err(format!("set its mode: {e}")))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(format!("create it: {e}"))),
        }
    }
    let real = std::fs::canonicalize(path).map_err(|e| err(format!("resolve it: {e}")))?;
    let meta = std::fs::symlink_metadata(&real).map_err(|e| err(e.to_string()))?;
    if !meta.is_dir() {
        return Err(err(format!("{} is not a directory", real.display())));
    }
    // The path as written, its links among it, and where they lead.
    for dir in path.ancestors().chain(real.ancestors()) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let meta = std::fs::symlink_metadata(dir).map_err(|e| err(e.to_string()))?;
        if meta.uid() != 0 {
            return Err(err(format!(
                "{} is owned by uid {}, not root",
                dir.display(),
                meta.uid()
            )));
        }
        let mode = meta.mode();
        if meta.is_dir() && mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(err(format!(
                "{} is writable by others (mode {:o}) and not sticky",
                dir.display(),
                mode & 0o7777
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root: it makes files of other owners"
        );
    }

    #[test]
    fn a_missing_directory_is_made_roots_and_sticky() {
        root();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("devgate/vgpulock");
        ensure_hami_lock_dir(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_dir());
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, MODE));
        // Again: the same directory, untouched.
        ensure_hami_lock_dir(&path).unwrap();
    }

    #[test]
    fn what_another_user_could_have_made_is_refused() {
        root();
        let dir = tempfile::tempdir().unwrap();
        // A link another user made, to a directory of their choosing.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/etc", &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let e = ensure_hami_lock_dir(&link).unwrap_err().to_string();
        assert!(e.contains("link is owned by uid 65534, not root"), "{e}");
        let target = dir.path().join("theirs");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::chown(&target, Some(65534), Some(65534)).unwrap();
        let e = ensure_hami_lock_dir(&target).unwrap_err().to_string();
        assert!(e.contains("owned by uid 65534, not root"), "{e}");
        let via = dir.path().join("via");
        std::os::unix::fs::symlink(&target, &via).unwrap();
        let e = ensure_hami_lock_dir(&via).unwrap_err().to_string();
        assert!(e.contains("owned by uid 65534, not root"), "{e}");
        // A parent others may write to, not sticky: they could move it away.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_hami_lock_dir(&open.join("vgpulock")).unwrap_err();
        assert!(
            e.to_string()
                .contains("is writable by others (mode 777) and not sticky"),
            "{e}"
        );
        // A file where the directory should be.
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = ensure_hami_lock_dir(&file).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }
}
