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
    /// When the file was last looked at for having been removed.
    looked: std::time::Instant,
}

/// How often a write looks whether the log was removed (one `fstat`).
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl RotatingFile {
    /// `path` opened for appending, its directory made (0700) if need be.
    pub fn open(path: &Path, max: u64) -> io::Result<RotatingFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
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
    /// A log removed by hand (its link count 0) is made anew, at most a
    /// second later, rather than written into the unlinked file for good.
    fn reopen_if_removed(&mut self) {
        use std::os::unix::fs::MetadataExt;
        if self.looked.elapsed() < LOOK_EVERY {
            return;
        }
        self.looked = std::time::Instant::now();
        if self.file.metadata().is_ok_and(|m| m.nlink() == 0) {
            if let Ok(file) = append(&self.path) {
                self.file = file;
                self.len = 0;
            }
        }
    }

    /// Moves the log aside and starts anew. Whatever fails, the count starts
    /// again, so that a full disk is not asked at every line; a log moved
    /// aside but not made anew (no space, no inode) is written on where it
    /// now is, until the next rotation.
    fn rotate(&mut self) {
        self.len = 0;
        // A log removed meanwhile is made anew too.
        let _ = fs::rename(&self.path, rotated(&self.path));
        if let Ok(file) = append(&self.path) {
            self.file = file;
        }
    }
}

impl Write for &RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.reopen_if_removed();
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
