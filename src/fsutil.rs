//! Files shared by the ledger, the GPU health store and the saved VF state: an
//! exclusive `flock` between processes, whole-file replacement that a crash
//! leaves either old or new, never torn, and reads bounded in size (every file
//! and stream devgate parses has a limit).

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{openat, Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

mod below;
mod replace;

pub use below::{below_root, follow_below_root, resolve_below_root};
#[cfg(test)]
use replace::parent_dir;
pub use replace::{
    replace_file, replace_file_meta, replace_file_mode, replace_in, Durability, FileKey,
};

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

/// Makes entries added, renamed or removed in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(at(dir))
}

#[cfg(test)]
#[path = "fsutil_tests.rs"]
mod tests;
