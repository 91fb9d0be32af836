//! `devgate nri`'s log when nobody reads its stderr: a runtime that launches
//! a pre-installed plugin gives it only the connection (fd 3) and three
//! environment variables; Go's `exec.Cmd` with no `Stderr` connects fd 2 to
//! the null device (os/exec: "If Stdout and Stderr are nil, Run connects the
//! corresponding file descriptor to the null device"). The log then goes to a
//! file beside the hook's, kept to two files of at most `max` bytes each: the
//! plugin runs for months and its state directory is a tmpfs.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use nix::fcntl::{Flock, FlockArg};

/// The plugin's log in its state directory, beside `hook.log`.
pub const NRI_LOG_FILE: &str = "nri.log";

/// Whether fd 2 is the null device.
pub fn stderr_is_null() -> bool {
    is_null_device(Path::new("/proc/self/fd/2"))
}

/// Whether `path` is the null device (char 1:3, drivers/char/mem.c).
fn is_null_device(path: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    fs::metadata(path).is_ok_and(|meta| {
        meta.file_type().is_char_device() && meta.rdev() == nix::sys::stat::makedev(1, 3)
    })
}

/// An appending log that moves itself to `<path>.1` (replacing the one
/// before) once a write would take it past its bound, and starts anew.
pub struct RotatingFile {
    open: Mutex<Open>,
}

struct Open {
    path: PathBuf,
    file: File,
    len: u64,
    max: u64,
    /// When the path was last looked at for the file having been removed or
    /// moved aside.
    looked: std::time::Instant,
}

/// How often a write looks whether the log was removed or moved aside (an
/// `fstat` of the file and a `stat` of its path).
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl RotatingFile {
    /// `path` opened for appending, its directory made (0700) if need be.
    pub fn open(path: &Path, max: u64) -> io::Result<RotatingFile> {
        make_dir_of(path)?;
        let file = append(path)?;
        let len = file.metadata()?.len();
        Ok(RotatingFile {
            open: Mutex::new(Open {
                path: path.to_path_buf(),
                file,
                len,
                max,
                looked: std::time::Instant::now(),
            }),
        })
    }
}

impl Open {
    /// The log as found at its path again, at most a second later: one
    /// removed by hand is made anew rather than written into, unlinked, for
    /// good; one another process writing it moved aside (an old plugin
    /// draining beside its successor) is followed to the new file rather
    /// than written on at `<path>.1`, where that process's next rotation
    /// would drop it. What others appended counts towards the bound.
    fn follow_path(&mut self) {
        if self.looked.elapsed() < LOOK_EVERY {
            return;
        }
        self.looked = std::time::Instant::now();
        match self.file.metadata() {
            Ok(ours) if self.is_at_path(&ours) => self.len = self.len.max(ours.len()),
            _ => self.reopen(),
        }
    }

    /// Whether the file at the path is the one written.
    fn is_at_path(&self, ours: &fs::Metadata) -> bool {
        is_file_at(&self.path, ours).unwrap_or(false)
    }

    /// Writes on at the path, counting what is there.
    fn reopen(&mut self) {
        if let Ok(file) = append(&self.path) {
            self.len = file.metadata().map_or(0, |m| m.len());
            self.file = file;
        }
    }

    /// Moves the log aside and starts anew. Whatever fails, the count starts
    /// again, so that a full disk or a refused rename is not asked at every
    /// line; a log moved aside but not made anew (no space, no inode) is
    /// written on where it now is, and one that cannot be moved on where it
    /// is, until the next rotation. Only the file written is moved
    /// ([`rotate_if_current`]): one removed meanwhile is made anew, and one
    /// another process moved aside already is followed to its new file.
    fn rotate(&mut self) {
        self.len = 0;
        if rotate_if_current(&self.file, &self.path).is_ok() {
            self.reopen();
        }
    }
}

impl Write for &RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.follow_path();
        if open.len > 0 && open.len + buf.len() as u64 > open.max {
            open.rotate();
        }
        // Whole events: the formatter hands one line per write.
        open.file.write_all(buf)?;
        open.len += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Appends one line to the log at `path`, its directory made (0700) if need
/// be: for what must be said before logging is set up. A failure is
/// dropped: there is nowhere else to say it.
pub fn append_line(path: &Path, line: &str) {
    let _ = make_dir_of(path);
    if let Ok(mut file) = append(path) {
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

/// Makes the directory of the log at `path` (0700) if need be; the hook's
/// log too.
pub fn make_dir_of(path: &Path) -> io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir),
        None => Ok(()),
    }
}

/// Moves the log `file` to `<path>.1` if it is still the file at `path`;
/// whether it did. Writers that find the same log full at the same moment
/// (hooks of other containers, an old plugin beside its successor) each take
/// the file's lock in turn, and only the one that still finds it at `path`
/// renames it, so none renames another's fresh log over the rotated one.
pub fn rotate_if_current(file: &File, path: &Path) -> io::Result<bool> {
    let locked = Flock::lock(file.try_clone()?, FlockArg::LockExclusive)
        .map_err(|(_, e)| io::Error::from(e))?;
    let current = is_file_at(path, &locked.metadata()?)?;
    if current {
        fs::rename(path, rotated(path))?;
    }
    Ok(current)
}

/// Whether `path` is the file `ours` describes (device and inode); false
/// where nothing is there.
fn is_file_at(path: &Path, ours: &fs::Metadata) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(path) {
        Ok(m) => Ok(m.dev() == ours.dev() && m.ino() == ours.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// A log opened for appending, made (0600) if need be; the hook's log too.
pub fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// Where a full log is moved: `<path>.1`; the hook's log too.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_moves_aside_once_a_line_would_pass_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join(NRI_LOG_FILE);
        let log = RotatingFile::open(&path, 16).unwrap();
        let mut w = &log;
        w.write_all(b"first line\n").unwrap();
        w.write_all(b"second\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second\n");
        assert_eq!(
            fs::read(dir.path().join("state/nri.log.1")).unwrap(),
            b"first line\n"
        );
        // A line longer than the bound is written whole, into a fresh file.
        w.write_all(b"a line past the bound\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"a line past the bound\n");
        assert_eq!(
            fs::read(dir.path().join("state/nri.log.1")).unwrap(),
            b"second\n"
        );
        // Opened again: appends, counting what is there.
        drop(log);
        let again = RotatingFile::open(&path, 64).unwrap();
        (&again).write_all(b"after a restart\n").unwrap();
        assert_eq!(
            fs::read(&path).unwrap(),
            b"a line past the bound\nafter a restart\n"
        );
    }

    #[test]
    fn a_log_removed_by_hand_is_made_anew_within_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NRI_LOG_FILE);
        let log = RotatingFile::open(&path, 1 << 20).unwrap();
        (&log).write_all(b"before\n").unwrap();
        fs::remove_file(&path).unwrap();
        std::thread::sleep(LOOK_EVERY);
        (&log).write_all(b"after\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"after\n");
    }

    #[test]
    fn a_log_removed_meanwhile_is_made_anew_at_the_next_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NRI_LOG_FILE);
        let log = RotatingFile::open(&path, 16).unwrap();
        (&log).write_all(b"first line\n").unwrap();
        fs::remove_file(&path).unwrap();
        (&log).write_all(b"second line\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second line\n");
    }

    /// Two processes writing one log (an old plugin draining beside its
    /// successor): once one moved it aside, the other writes on in the new
    /// file within a second, counting what is there, instead of on at
    /// `<path>.1`; its own rotation then moves the new file aside.
    #[test]
    fn a_log_another_process_moved_aside_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NRI_LOG_FILE);
        let old = dir.path().join("nri.log.1");
        let (a, b) = (
            RotatingFile::open(&path, 20).unwrap(),
            RotatingFile::open(&path, 20).unwrap(),
        );
        (&a).write_all(b"a1\n").unwrap();
        (&b).write_all(b"b1\n").unwrap();
        (&a).write_all(b"a2\n").unwrap();
        (&a).write_all(b"a3, a long line\n").unwrap();
        assert_eq!(fs::read(&old).unwrap(), b"a1\nb1\na2\n");
        std::thread::sleep(LOOK_EVERY);
        (&b).write_all(b"b2\n").unwrap();
        assert_eq!(fs::read(&old).unwrap(), b"a1\nb1\na2\n", "not written on");
        assert_eq!(fs::read(&path).unwrap(), b"a3, a long line\nb2\n");
        // What a wrote there counts: b's next line passes the bound.
        (&b).write_all(b"b3\n").unwrap();
        assert_eq!(fs::read(&old).unwrap(), b"a3, a long line\nb2\n");
        assert_eq!(fs::read(&path).unwrap(), b"b3\n");
    }

    /// A log that cannot be moved aside (here `<path>.1` is a directory) is
    /// written on where it is, and asked to move again only once it has
    /// taken in another bound's worth, not at every line.
    #[test]
    fn a_log_that_cannot_be_moved_aside_is_not_asked_at_every_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NRI_LOG_FILE);
        fs::create_dir_all(dir.path().join("nri.log.1/x")).unwrap();
        let log = RotatingFile::open(&path, 16).unwrap();
        for line in [&b"first line\n"[..], b"second\n", b"third\n"] {
            (&log).write_all(line).unwrap();
        }
        assert_eq!(fs::read(&path).unwrap(), b"first line\nsecond\nthird\n");
        let len = log.open.lock().unwrap().len;
        assert_eq!(len, 13, "counted from the failed move, not from the file");
    }

    #[test]
    fn the_null_device_is_told_from_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, "").unwrap();
        assert!(is_null_device(Path::new("/dev/null")));
        assert!(!is_null_device(&file));
        assert!(!is_null_device(Path::new("/dev/zero")), "char 1:5");
        assert!(!is_null_device(&dir.path().join("missing")));
    }
}
