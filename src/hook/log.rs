//! The hook's log: a file, never stdout or stderr (the runtime owns those and
//! shows them only inside a failure message). It lives in the state directory,
//! on tmpfs by default, so it is kept to two files of at most [`MAX_LOG_BYTES`]:
//! one past that is moved to `<name>.1` (replacing the previous one) and
//! started anew.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;

use crate::logging_file::{append, make_dir_of, rotate_if_current};

/// Past this the log is rotated: about 20 000 hook runs at the info level.
pub const MAX_LOG_BYTES: u64 = 8 << 20;

/// Sends tracing events to `path`, appending. A log that cannot be opened
/// means no log: the hook's job matters more than its diary.
pub fn init_log(path: &Path, level: LevelFilter) -> io::Result<()> {
    make_dir_of(path)?;
    let file = open_rotated(path, MAX_LOG_BYTES)?;
    tracing_subscriber::fmt()
        .with_writer(Mutex::new(file))
        .with_ansi(false)
        .with_max_level(level)
        .with_target(false)
        .try_init()
        .map_err(|e| io::Error::other(e.to_string()))
}

/// `path` opened for appending; when it already holds more than `max` bytes,
/// it becomes `<path>.1` first.
fn open_rotated(path: &Path, max: u64) -> io::Result<File> {
    let file = append(path)?;
    if file.metadata()?.len() <= max {
        return Ok(file);
    }
    rotate_if_current(&file, path)?;
    append(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging_file::rotated;
    use std::fs;
    use std::io::Write;

    /// A hook that found the log full after another rotated it leaves the
    /// new log and the rotated one alone.
    #[test]
    fn a_log_rotated_by_another_hook_is_not_rotated_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hook.log");
        fs::write(&path, "0123456789full").unwrap();
        let late = append(&path).unwrap();
        let mut first = open_rotated(&path, 10).unwrap();
        first.write_all(b"fresh").unwrap();
        assert!(!rotate_if_current(&late, &path).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"fresh");
        assert_eq!(fs::read(rotated(&path)).unwrap(), b"0123456789full");
        // Gone meanwhile: nothing to rotate.
        let gone = append(&path).unwrap();
        fs::remove_file(&path).unwrap();
        assert!(!rotate_if_current(&gone, &path).unwrap());
        assert_eq!(fs::read(rotated(&path)).unwrap(), b"0123456789full");
    }

    #[test]
    fn a_log_past_its_limit_is_rotated_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hook.log");
        fs::write(dir.path().join("hook.log.1"), "older").unwrap();
        fs::write(&path, "0123456789").unwrap();
        // At the limit: kept and appended to.
        let mut f = open_rotated(&path, 10).unwrap();
        f.write_all(b"x").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"0123456789x");
        // Past it: moved aside, replacing the older one, and started anew.
        let mut f = open_rotated(&path, 10).unwrap();
        f.write_all(b"new").unwrap();
        assert_eq!(
            fs::read(dir.path().join("hook.log.1")).unwrap(),
            b"0123456789x"
        );
        assert_eq!(fs::read(&path).unwrap(), b"new");
    }
}
