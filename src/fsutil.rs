//! Files shared by the ledger, the GPU health store and the saved VF state: an
//! exclusive `flock` between processes, whole-file replacement that a crash
//! leaves either old or new, never torn, and reads bounded in size (every file
//! and stream devgate parses has a limit).

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{openat, renameat, Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

mod below;

pub use below::{below_root, follow_below_root, resolve_below_root};

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

/// Why [`read_bounded`] or [`read_file_bounded`] returned no bytes.
#[derive(Debug, thiserror::Error)]
pub enum BoundedError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("larger than {limit} bytes")]
    TooLarge { limit: u64 },
}

impl BoundedError {
    /// The file was not there: for readers that treat that as empty state.
    pub fn is_not_found(&self) -> bool {
        matches!(self, BoundedError::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// For callers whose errors carry an `io::Error`: too large is `InvalidData`.
impl From<BoundedError> for std::io::Error {
    fn from(e: BoundedError) -> std::io::Error {
        match e {
            BoundedError::Io(e) => e,
            e @ BoundedError::TooLarge { .. } => {
                std::io::Error::new(std::io::ErrorKind::InvalidData, e)
            }
        }
    }
}

/// Appends `input` to `buf` up to its end, refusing more than `limit` bytes.
/// At most `limit + 1` bytes are read, so an endless or hostile input costs no
/// more than that; `buf` keeps what was read either way.
pub fn read_bounded(input: impl Read, limit: u64, buf: &mut Vec<u8>) -> Result<(), BoundedError> {
    let start = buf.len();
    input.take(limit.saturating_add(1)).read_to_end(buf)?;
    if (buf.len() - start) as u64 > limit {
        return Err(BoundedError::TooLarge { limit });
    }
    Ok(())
}

/// The whole file at `path`, at most `limit` bytes, in a buffer sized from
/// `fstat` so that one read usually does.
pub fn read_file_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, BoundedError> {
    let file = File::open(path)?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    // One byte more than the size: the read that finds the end needs room.
    let mut buf = Vec::with_capacity(size.min(limit).saturating_add(1) as usize);
    read_bounded(file, limit, &mut buf)?;
    Ok(buf)
}

/// A whole file as [`read_whole_bounded`] read it.
#[derive(Debug)]
pub struct WholeFile {
    /// Still open: a caller caching what it read keeps the version's inode.
    pub file: File,
    /// What `fstat` gave before the read.
    pub meta: fs::Metadata,
    pub bytes: Vec<u8>,
}

/// [`read_file_bounded`] for callers that cache what they read by the file's
/// version ([`FileKey`]): the open file and its metadata come with the bytes.
/// A file that `fstat` shows over `limit` is refused before any read.
pub fn read_whole_bounded(path: &Path, limit: u64) -> Result<WholeFile, BoundedError> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if meta.len() > limit {
        return Err(BoundedError::TooLarge { limit });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
    read_bounded(&file, limit, &mut bytes)?;
    Ok(WholeFile { file, meta, bytes })
}

/// [`read_file_bounded`] for a text file: bytes that are not UTF-8 are an
/// `InvalidData` read error, as `read_to_string` reports them.
pub fn read_text_bounded(path: &Path, limit: u64) -> Result<String, BoundedError> {
    text(read_file_bounded(path, limit)?)
}

/// Bytes as text; bytes that are not UTF-8 are an `InvalidData` read error,
/// as `read_to_string` reports them.
fn text(bytes: Vec<u8>) -> Result<String, BoundedError> {
    String::from_utf8(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e).into())
}

/// `/proc/<pid>/stat` is one line of a few hundred bytes.
pub const MAX_PROC_STAT_BYTES: u64 = 4096;
/// `/proc/<pid>/cgroup` has one line per hierarchy; a few hundred bytes.
pub const MAX_PROC_CGROUP_BYTES: u64 = 64 * 1024;
/// Room a procfs file's read starts with: a stat or cgroup file is a few
/// hundred bytes.
const PROC_TEXT_ROOM: u64 = 1024;

/// A procfs file, whole, at most `limit` bytes, as text. procfs shows a size
/// of 0 whatever a file holds, so std's `read_to_string` would start with
/// 32-byte probes and double from there (six reads and an `fstat` for a
/// stat line); a buffer with room for a usual file takes it in one read and
/// finds the end with a second. Bytes that are not UTF-8 are `InvalidData`.
pub fn read_proc_text(path: &Path, limit: u64) -> Result<String, BoundedError> {
    text(read_proc_bytes(path, limit)?)
}

/// A `/proc/<pid>/stat` line as [`read_proc_text`] reads it, with bytes that
/// are not UTF-8 replaced (U+FFFD) instead of refused. They can only be in
/// the command name (`comm`): whatever the process named itself
/// (`prctl(PR_SET_NAME)`), cut by the kernel at 15 bytes, perhaps inside a
/// character (`TASK_COMM_LEN`). Every field read follows its closing `)`
/// (proc(5)), digits and a state letter, which the replacement leaves as
/// they are, so such a process is identified like any other.
pub fn read_proc_stat(path: &Path) -> Result<String, BoundedError> {
    let bytes = read_proc_bytes(path, MAX_PROC_STAT_BYTES)?;
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

fn read_proc_bytes(path: &Path, limit: u64) -> Result<Vec<u8>, BoundedError> {
    let file = File::open(path)?;
    let mut buf = Vec::with_capacity(limit.saturating_add(1).min(PROC_TEXT_ROOM) as usize);
    read_bounded(file, limit, &mut buf)?;
    Ok(buf)
}

/// Opens (creating, mode 0600) the lock file `path`, for `flock`.
pub fn open_lock_file(path: &Path) -> Result<File, FsError> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(at(path))
}

/// Opens (creating, mode 0600) `path` and waits for an exclusive lock on it; the
/// lock goes with the returned value.
pub fn lock_exclusive(path: &Path) -> Result<Flock<File>, FsError> {
    let file = open_lock_file(path)?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| FsError {
        path: path.to_path_buf(),
        source: errno.into(),
    })
}

/// [`lock_exclusive`] without waiting: `None` while another holds it.
pub fn try_lock_exclusive(path: &Path) -> Result<Option<Flock<File>>, FsError> {
    let file = open_lock_file(path)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok(Some(held)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(FsError {
            path: path.to_path_buf(),
            source: errno.into(),
        }),
    }
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
    .map(|r| r.meta)
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
) -> Result<Replaced, FsError> {
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
fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A file put in place by [`replace_in`].
#[derive(Debug)]
pub struct Replaced {
    /// The new file's metadata (the rename keeps its inode, size and mtime).
    pub meta: fs::Metadata,
    /// The new file, still open.
    pub file: File,
    /// False where the directory failed to sync after the rename: every
    /// reader sees the new file, but a power loss may bring the old one back.
    pub dir_synced: bool,
}

#[cfg(test)]
thread_local! {
    /// Fails this thread's next directory sync after a durable replace with EIO.
    pub(crate) static FAIL_NEXT_DIR_SYNC: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
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
) -> Result<Replaced, FsError> {
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
    #[cfg(test)]
    let synced = match synced {
        Ok(()) if durable && FAIL_NEXT_DIR_SYNC.take() => {
            Err(at(dir_path)(std::io::Error::from_raw_os_error(libc::EIO)))
        }
        other => other,
    };
    if let Err(e) = &synced {
        tracing::warn!(file = %dst.display(), error = %nri::ErrorChain(e), "replaced, but its directory did not sync");
    }
    Ok(Replaced {
        meta,
        file,
        dir_synced: synced.is_ok(),
    })
}

/// Makes entries added, renamed or removed in `dir` durable.
/// Opens the directory `path`, relative to `at` where given, for reading
/// its entries or opening files beneath it (`openat`).
pub fn open_dir_at<P: ?Sized + nix::NixPath>(
    at: Option<&std::os::fd::OwnedFd>,
    path: &P,
) -> std::io::Result<std::os::fd::OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let fd = openat(at.map(|d| d.as_raw_fd()), path, flags, Mode::empty())?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(at(dir))
}

#[cfg(test)]
#[path = "fsutil_tests.rs"]
mod tests;
