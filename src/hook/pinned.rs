//! The container's init process, held from the hook's start by its proc
//! directory. The hook runs for seconds (releases of exited pods, lock
//! waits); an init that dies meanwhile (an OOM kill in a small memory
//! cgroup) frees its pid, which another pod's process may take. Looked up by
//! number at the move, that process's network namespace would get the VF
//! with the tenant's settings. Opened relative to the directory opened at
//! the start, a dead process's files are gone (ENOENT from `proc_pident_lookup`
//! once `get_proc_task` finds no task), never another's.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::netdev::{Netns, NetnsError};

pub(crate) struct Pinned {
    pid: u32,
    dir: OwnedFd,
    path: PathBuf,
}

impl Pinned {
    /// `<proc_root>/<pid>`, opened now.
    pub(crate) fn open(proc_root: &Path, pid: u32) -> Result<Pinned, NetnsError> {
        let path = proc_root.join(pid.to_string());
        let dir = crate::fsutil::open_dir_at(None, &path).map_err(|source| NetnsError::Open {
            path: path.clone(),
            source,
        })?;
        Ok(Pinned { pid, dir, path })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The process's network namespace, if it is still the process opened.
    pub(crate) fn netns(&self) -> Result<Netns, NetnsError> {
        Netns::open_at(self.dir.as_fd(), Path::new("ns/net"), &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that exits after it was pinned yields no namespace, though
    /// its pid may name another process by then.
    #[test]
    fn a_pinned_process_that_exited_has_no_namespace() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pinned = Pinned::open(Path::new("/proc"), child.id()).unwrap();
        let live = pinned.netns().unwrap();
        assert_eq!(live.id(), Netns::current().unwrap().id());
        child.kill().unwrap();
        child.wait().unwrap();
        let e = pinned.netns().unwrap_err().to_string();
        assert!(e.contains(&format!("/proc/{}/ns/net", child.id())), "{e}");
        assert!(Pinned::open(Path::new("/proc"), u32::MAX).is_err());
    }
}
