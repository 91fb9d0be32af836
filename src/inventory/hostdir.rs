//! A directory of the host root held open, its files read by plain name.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::error::InventoryError;
use super::hostfs::{io_err, list_dir, open_at, read_bounded};

type Result<T> = std::result::Result<T, InventoryError>;

/// A directory's times, size and link count ([`HostDir::stamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirStamp([i64; 6]);

/// A directory of the host root held open: its files are read by name, one
/// component each, without walking the path from the root again. sysfs tables
/// such as a port's GID entries are hundreds of files in one directory.
pub(crate) struct HostDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl HostDir {
    /// `fd`, a directory opened at the root-relative `path`.
    pub(super) fn new(fd: OwnedFd, path: PathBuf) -> HostDir {
        HostDir { fd, path }
    }

    /// Names in the directory, sorted; non-UTF-8 names are skipped.
    pub(crate) fn list(&self) -> Result<Vec<String>> {
        // A stream of its own, closed at once: a held `DIR` would keep libc's
        // 32 KiB entry buffer for as long as the directory is held.
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut dir = Dir::openat(Some(self.fd.as_raw_fd()), ".", flags, Mode::empty())
            .map_err(|e| io_err(&self.path, e.into()))?;
        list_dir(&mut dir, &self.path)
    }

    /// What changes when an entry is added to or removed from the directory, or
    /// the directory itself is removed: its change and modification times (fine
    /// grained once looked at, since Linux 6.13's multigrain timestamps), size and
    /// link count. `None` when it cannot be read.
    pub(crate) fn stamp(&self) -> Option<DirStamp> {
        let st = nix::sys::stat::fstat(self.fd.as_raw_fd()).ok()?;
        Some(DirStamp([
            st.st_mtime,
            st.st_mtime_nsec,
            st.st_ctime,
            st.st_ctime_nsec,
            st.st_size,
            i64::try_from(st.st_nlink).unwrap_or(i64::MAX),
        ]))
    }

    /// Reads the small text file `name` right in this directory. Only a plain name
    /// is taken (no `/`, `.` or `..`), and a final symlink is not followed, so the
    /// read stays in the directory resolved inside the root.
    pub(crate) fn read(&self, name: &str) -> Result<String> {
        let path = self.path.join(name);
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(InventoryError::malformed(&path, name));
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let fd = open_at(Some(self.fd.as_raw_fd()), Path::new(name), flags)
            .map_err(|e| io_err(&path, e.into()))?;
        read_bounded(fd.into(), &path)
    }
}
