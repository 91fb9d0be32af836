//! Whether a container's init still runs, from procfs: a pid is reused, so
//! the identity is the pid and its start time (proc(5) `/proc/<pid>/stat`
//! field 22, `starttime`, clock ticks after boot).

use std::path::{Path, PathBuf};

use crate::fsutil::read_proc_stat;
use crate::ledger::InitProcess;
use crate::proc_stat::StatLine;

#[derive(Debug, thiserror::Error)]
pub enum LivenessError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no start time field")]
    Malformed { path: PathBuf },
}

/// The start time of `pid` under `proc_root`.
pub fn start_ticks(proc_root: &Path, pid: u32) -> Result<u64, LivenessError> {
    let path = proc_root.join(pid.to_string()).join("stat");
    let read = |source| LivenessError::Read {
        path: path.clone(),
        source,
    };
    let text = read_proc_stat(&path).map_err(|e| read(e.into()))?;
    StatLine::parse(&text)
        .map(|stat| stat.start_ticks)
        .ok_or(LivenessError::Malformed { path })
}

/// The identity of `pid` now, or None when it cannot be read (the record
/// then never counts as gone: only a proven exit releases anything).
pub fn identify(proc_root: &Path, pid: u32) -> Option<InitProcess> {
    match start_ticks(proc_root, pid) {
        Ok(start_ticks) => Some(InitProcess { pid, start_ticks }),
        Err(e) => {
            tracing::warn!(pid, error = %nri::ErrorChain(&e), "container init not identified");
            None
        }
    }
}

/// True only when `init` has certainly exited: its stat is gone, or the pid
/// now belongs to a process started at another time.
pub fn is_gone(proc_root: &Path, init: &InitProcess) -> bool {
    match start_ticks(proc_root, init.pid) {
        Ok(t) => t != init.start_ticks,
        Err(LivenessError::Read { source, .. }) => {
            matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ESRCH))
        }
        Err(LivenessError::Malformed { .. }) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(comm: &str, start: u64) -> String {
        format!("42 ({comm}) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start} 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n")
    }

    #[test]
    fn start_time_is_field_22_whatever_the_command_name() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path();
        std::fs::create_dir_all(proc.join("42")).unwrap();
        for comm in ["sleep", "a b) S 9 (x", ""] {
            std::fs::write(proc.join("42/stat"), stat(comm, 98765)).unwrap();
            assert_eq!(start_ticks(proc, 42).unwrap(), 98765, "{comm:?}");
        }
        let init = identify(proc, 42).unwrap();
        assert_eq!(
            init,
            InitProcess {
                pid: 42,
                start_ticks: 98765
            }
        );
        assert!(!is_gone(proc, &init));
        // The pid reused by a later process.
        std::fs::write(proc.join("42/stat"), stat("other", 99999)).unwrap();
        assert!(is_gone(proc, &init));
        // Unreadable or strange: not proven gone.
        std::fs::write(proc.join("42/stat"), "42 (x) S 1\n").unwrap();
        assert!(!is_gone(proc, &init));
        assert!(identify(proc, 42).is_none());
        // No such process.
        std::fs::remove_dir_all(proc.join("42")).unwrap();
        assert!(is_gone(proc, &init));
        assert!(identify(proc, 42).is_none());
    }

    /// A command name cut inside a character (the kernel keeps 15 bytes of
    /// what a process names itself) is no reason not to identify it.
    #[test]
    fn a_command_name_that_is_not_utf8_leaves_the_start_time_readable() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path();
        std::fs::create_dir_all(proc.join("42")).unwrap();
        let bytes = stat("a", 98765).into_bytes();
        // After `(a`: the first two bytes of a three-byte character.
        let at = bytes.iter().position(|&b| b == b'(').unwrap() + 2;
        let cut = [&bytes[..at], b"\xe6\x95", &bytes[at..]].concat();
        std::fs::write(proc.join("42/stat"), cut).unwrap();
        assert_eq!(start_ticks(proc, 42).unwrap(), 98765);
    }

    #[test]
    fn the_real_procfs_knows_this_process() {
        let me = std::process::id();
        let init = identify(Path::new("/proc"), me).unwrap();
        assert!(!is_gone(Path::new("/proc"), &init));
    }
}
