//! The hook's log: a file, never stdout or stderr (the runtime owns those and
//! shows them only inside a failure message).

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;

/// Sends tracing events to `path`, appending. A log that cannot be opened
/// means no log: the hook's job matters more than its diary.
pub fn init_log(path: &Path, level: LevelFilter) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    tracing_subscriber::fmt()
        .with_writer(Mutex::new(file))
        .with_ansi(false)
        .with_max_level(level)
        .with_target(false)
        .try_init()
        .map_err(|e| io::Error::other(e.to_string()))
}
