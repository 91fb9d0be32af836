//! Crash-safe files shared by the ledger, the GPU health store and the saved VF
//! state: an exclusive `flock` between processes, and whole-file replacement
//! that a crash leaves either old or new, never torn.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// An I/O failure on one file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FsError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> FsError + '_ {
    move |source| FsError {
        path: path.to_path_buf(),
        source,
    }
}

/// Opens (creating, mode 0600) `path` and waits for an exclusive lock on it; the
/// lock goes with the returned value.
pub fn lock_exclusive(path: &Path) -> Result<Flock<File>, FsError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(at(path))?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| FsError {
        path: path.to_path_buf(),
        source: errno.into(),
    })
}

/// Replaces `path` with `bytes`: a temporary file beside it (mode 0600), fsync,
/// rename over `path`, then fsync of the directory, since the rename is durable
/// only once the directory entry is on disk. Callers hold the file's lock.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    replace_file_meta(path, bytes).map(drop)
}

/// [`replace_file`], returning the new file's metadata (the rename keeps its
/// inode, size and mtime) for callers that cache what they wrote.
pub fn replace_file_meta(path: &Path, bytes: &[u8]) -> Result<fs::Metadata, FsError> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(at(&tmp))?;
    file.write_all(bytes).map_err(at(&tmp))?;
    file.sync_all().map_err(at(&tmp))?;
    let meta = file.metadata().map_err(at(&tmp))?;
    fs::rename(&tmp, path).map_err(at(path))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    Ok(meta)
}

/// [`replace_file_meta`] for a file directly in the open directory `dir` (at
/// `dir_path`, for errors): every step is relative to the directory, so a caller
/// that keeps the directory open walks no path per replacement.
pub fn replace_in(
    dir: &File,
    dir_path: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<fs::Metadata, FsError> {
    use nix::fcntl::{openat, renameat, OFlag};
    use nix::sys::stat::Mode;
    use std::os::fd::{AsRawFd, FromRawFd};
    let tmp_name = format!("{name}.tmp");
    let failed = |name: &str| {
        let path = dir_path.join(name);
        move |source: std::io::Error| FsError { path, source }
    };
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_CLOEXEC;
    let fd = openat(
        Some(dir.as_raw_fd()),
        tmp_name.as_str(),
        flags,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| failed(&tmp_name)(e.into()))?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(bytes).map_err(failed(&tmp_name))?;
    file.sync_all().map_err(failed(&tmp_name))?;
    let meta = file.metadata().map_err(failed(&tmp_name))?;
    let dirfd = Some(dir.as_raw_fd());
    renameat(dirfd, tmp_name.as_str(), dirfd, name).map_err(|e| failed(name)(e.into()))?;
    dir.sync_all().map_err(|source| FsError {
        path: dir_path.to_path_buf(),
        source,
    })?;
    Ok(meta)
}

/// Makes entries added, renamed or removed in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(at(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_leaves_only_the_new_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        replace_file(&path, b"old").unwrap();
        replace_file(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }

    #[test]
    fn errors_name_the_path() {
        let err = replace_file(Path::new("/nonexistent-dir/x.json"), b"x").unwrap_err();
        assert!(
            err.to_string().starts_with("/nonexistent-dir/x.json.tmp: "),
            "{err}"
        );
    }
}
