//! Whole-file replacement: a temporary file beside the target, renamed over
//! it, with the syncs a crash-safe write needs where the filesystem keeps
//! data past a power loss.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;

use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::Mode;

use super::{at, sync_dir, FsError};

/// Replaces `path` with `bytes`: a temporary file beside it (mode 0600), fsync,
/// rename over `path`, then fsync of the directory, since the rename is durable
/// only once the directory entry is on disk. Callers hold the file's lock.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    replace_file_meta(path, bytes).map(drop)
}

/// [`replace_file`], returning the new file's metadata (the rename keeps its
/// inode, size and mtime) for callers that cache what they wrote.
pub fn replace_file_meta(path: &Path, bytes: &[u8]) -> Result<fs::Metadata, FsError> {
    let dir = parent_dir(path);
    replace(
        None,
        dir,
        path.file_name().unwrap_or_default(),
        ".tmp",
        bytes,
        0o600,
        Durability::Sync,
    )
    .map(|(meta, _)| meta)
}

/// [`replace_file`] with the new file's `mode` set before the rename, so that
/// the file is never seen with another one. For files written without a lock
/// (`devgate cdi generate` into a spec directory): the temporary name carries
/// the pid, so two writers at once never write into one temporary file and
/// rename a torn one; the last rename wins whole.
pub fn replace_file_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    let dir = parent_dir(path);
    let name = path.file_name().unwrap_or_default();
    let tmp = format!(".{}.tmp", std::process::id());
    replace(None, dir, name, &tmp, bytes, mode, Durability::Sync).map(drop)
}

/// What identifies one version of a file replaced whole at every write (see
/// [`replace_in`]): every replace is a new inode. A cache keyed by it keeps the
/// version open, since filesystems such as ext4 hand a freed inode number to
/// the next file created and mtime moves once per timer tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl FileKey {
    pub fn of_stat(st: &nix::sys::stat::FileStat) -> FileKey {
        FileKey {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec,
        }
    }

    pub fn of(meta: &fs::Metadata) -> FileKey {
        use std::os::unix::fs::MetadataExt;
        FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

/// Whether a replacement must be flushed to stable storage to survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync the file before the rename and the directory after it.
    Sync,
    /// The directory lives in memory (tmpfs, ramfs), where fsync of a file or a
    /// directory is `noop_fsync` (mm/shmem.c, fs/libfs.c): the data survives
    /// exactly as long as the machine's memory whether or not it is called, so
    /// the two syscalls are left out.
    Memory,
}

impl Durability {
    /// What the filesystem holding the open directory `dir` needs; `Sync`
    /// whenever it cannot be told.
    pub fn of_dir(dir: &File) -> Durability {
        match nix::sys::statfs::fstatfs(dir) {
            Ok(fs) if is_memory_fs(fs.filesystem_type()) => Durability::Memory,
            _ => Durability::Sync,
        }
    }
}

fn is_memory_fs(kind: nix::sys::statfs::FsType) -> bool {
    use nix::sys::statfs::{FsType, TMPFS_MAGIC};
    // include/uapi/linux/magic.h; nix names no constant for ramfs.
    const RAMFS_MAGIC: FsType = FsType(0x8584_58f6_u32 as _);
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// [`replace_file_meta`] for a file directly in the open directory `dir` (at
/// `dir_path`, for errors): every step is relative to the directory, so a caller
/// that keeps the directory open walks no path per replacement. `durability`
/// comes from [`Durability::of_dir`] on the same directory. Returns the new
/// file still open with its metadata: while a caller keeps it open, the file's
/// inode number cannot be given to another file (ext4 reuses freed ones), so
/// (device, inode) keeps naming this version.
pub fn replace_in(
    dir: &File,
    dir_path: &Path,
    name: &str,
    bytes: &[u8],
    durability: Durability,
) -> Result<(fs::Metadata, File), FsError> {
    replace(
        Some(dir),
        dir_path,
        OsStr::new(name),
        ".tmp",
        bytes,
        0o600,
        durability,
    )
}

/// The directory holding `path`: `.` for a bare name, whose parent is the
/// empty path (which no open, so no directory sync, accepts).
pub(super) fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// The replacement itself: names relative to `open` when the caller holds the
/// directory open, whole paths under `dir_path` otherwise.
fn replace(
    open: Option<&File>,
    dir_path: &Path,
    name: &OsStr,
    tmp_suffix: &str,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> Result<(fs::Metadata, File), FsError> {
    let mut tmp_name = name.to_os_string();
    tmp_name.push(tmp_suffix);
    let (tmp, dst) = (dir_path.join(&tmp_name), dir_path.join(name));
    let (at_fd, tmp_at, dst_at) = match open {
        Some(d) => (Some(d.as_raw_fd()), Path::new(&tmp_name), Path::new(name)),
        None => (None, tmp.as_path(), dst.as_path()),
    };
    // Never through a symbolic link planted as the temporary name: root
    // would truncate whatever it points at.
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    let fd = openat(at_fd, tmp_at, flags, Mode::from_bits_truncate(0o600))
        .map_err(|e| at(&tmp)(e.into()))?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    if mode != 0o600 {
        // The umask applies at creation; the mode asked for is set outright.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(at(&tmp))?;
    }
    file.write_all(bytes).map_err(at(&tmp))?;
    let durable = durability == Durability::Sync;
    if durable {
        file.sync_all().map_err(at(&tmp))?;
    }
    let meta = file.metadata().map_err(at(&tmp))?;
    renameat(at_fd, tmp_at, at_fd, dst_at).map_err(|e| at(&dst)(e.into()))?;
    // The rename is done: every reader sees the new file from here on. A
    // directory that fails to sync leaves only its survival of a power loss
    // in doubt; an error would tell the caller nothing was written (a claim
    // reported refused while every reader sees it held).
    let synced = match open {
        Some(d) if durable => d.sync_all().map_err(at(dir_path)),
        Some(_) => Ok(()),
        None => sync_dir(dir_path),
    };
    if let Err(e) = synced {
        tracing::warn!(file = %dst.display(), error = %nri::ErrorChain(&e), "replaced, but its directory did not sync");
    }
    Ok((meta, file))
}
