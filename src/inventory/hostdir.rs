//! A directory of the host root held open, its files read by plain name.

use std::cell::RefCell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::error::InventoryError;
use super::hostfs::{io_err, list_dir, open_at, read_bounded, utf8};

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
    /// Files kept open by [`HostDir::reread`], by name.
    held: RefCell<Vec<(String, OwnedFd)>>,
}

/// Files [`HostDir::reread`] keeps open per directory: a GID table's default
/// entries and its first addresses' (slots 0 to 5 with an IPv4 and an IPv6
/// address), not every slot of a table without a match.
pub(super) const MAX_HELD: usize = 8;

/// Bigger is not a sysfs attribute (at most a page, fs/sysfs/file.c): read by name.
const HELD_BYTES: usize = 4096;

impl HostDir {
    /// `fd`, a directory opened at the root-relative `path`.
    pub(super) fn new(fd: OwnedFd, path: PathBuf) -> HostDir {
        HostDir {
            fd,
            path,
            held: RefCell::default(),
        }
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

    /// Reads the small text file `name` right in this directory. Only a plain
    /// name is taken (no `/`, `.` or `..`), and a final symlink is not followed,
    /// so the read stays in the directory resolved inside the root.
    ///
    /// The file is kept open for the next read of `name` (up to [`MAX_HELD`]
    /// files), which reads it again from offset 0: sysfs
    /// shows an attribute afresh at each read from the start (fs/seq_file.c,
    /// `seq_read_iter`), and a regular file gives what it holds now. A file
    /// replaced or removed since leaves the held one behind: callers forget the
    /// held files when the directory's [`HostDir::stamp`] changes.
    pub(crate) fn reread(&self, name: &str) -> Result<String> {
        let mut held = self.held.borrow_mut();
        if let Some(at) = held.iter().position(|(n, _)| n == name) {
            // A failed read is tried again by name: a sysfs file whose node
            // was removed fails with ENODEV, its name with ENOENT.
            match read_from_start(&held[at].1, &self.path.join(name)) {
                Some(Ok(text)) => return Ok(text),
                _ => drop(held.swap_remove(at)),
            }
        }
        let (fd, path) = self.open(name)?;
        match read_from_start(&fd, &path) {
            Some(Ok(text)) => {
                if held.len() < MAX_HELD {
                    held.push((name.to_owned(), fd));
                }
                Ok(text)
            }
            Some(Err(e)) => Err(e),
            None => read_bounded(fd.into(), &path),
        }
    }

    /// How many files [`HostDir::reread`] keeps open.
    #[cfg(test)]
    pub(crate) fn held_count(&self) -> usize {
        self.held.borrow().len()
    }

    /// Closes the files [`HostDir::reread`] kept open.
    pub(crate) fn forget_held(&self) {
        self.held.borrow_mut().clear();
    }

    fn open(&self, name: &str) -> Result<(OwnedFd, PathBuf)> {
        let path = self.path.join(name);
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(InventoryError::malformed(&path, name));
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let fd = open_at(Some(self.fd.as_raw_fd()), Path::new(name), flags)
            .map_err(|e| io_err(&path, e.into()))?;
        Ok((fd, path))
    }
}

/// The whole of a small file read from offset 0; `None` when it fills the
/// buffer (too big to be a sysfs attribute) or the descriptor cannot be read
/// from an offset (a FIFO): then it is read as [`read_bounded`] reads.
fn read_from_start(fd: &OwnedFd, path: &Path) -> Option<Result<String>> {
    let mut buf = [0u8; HELD_BYTES];
    let n = loop {
        match nix::sys::uio::pread(fd, &mut buf, 0) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::ESPIPE) => return None,
            Err(e) => return Some(Err(io_err(path, e.into()))),
            Ok(n) => break n,
        }
    };
    if n == buf.len() {
        return None;
    }
    Some(utf8(buf[..n].to_vec(), path))
}
