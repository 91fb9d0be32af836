//! What the proc root says of a process without a listing: how many threads
//! it has and how many descriptors it holds, each one stat.

use std::ffi::CStr;
use std::io::{self, Write};
use std::os::fd::AsRawFd;

use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, stat, FileStat};

use super::ProcHost;

impl ProcHost {
    /// Whether `pid` has more than one thread, from the link count of its
    /// `task` directory: the kernel gives it 2 plus the thread group's count
    /// (`proc_task_getattr`, fs/proc/base.c), which counts a main thread that
    /// exited while others live. `true` whenever the count cannot be read or
    /// makes no sense (some filesystems give a tree's directories 1).
    pub(super) fn has_other_threads(&self, pid: u32) -> bool {
        !matches!(self.stat_of(pid, "task"), Ok(st) if st.st_nlink == 3)
    }

    /// How many descriptors `pid` holds, where the kernel gives `<pid>/fd` that
    /// count as its size (`proc_fd_getattr`, fs/proc/fd.c, Linux 6.2); `None`
    /// where it does not.
    pub(super) fn fd_count(&self, pid: u32) -> io::Result<Option<u64>> {
        if !self.sizes_fd_dirs() {
            return Ok(None);
        }
        Ok(Some(self.stat_of(pid, "fd")?.st_size as u64))
    }

    /// Whether `<proc root>/self/fd` has a size: this process always holds
    /// descriptors, so an older kernel's 0, or a tree without `self`, says
    /// that sizes count nothing.
    pub(super) fn sizes_fd_dirs(&self) -> bool {
        *self.fd_dir_sizes.get_or_init(|| {
            stat(self.proc_root.join("self/fd").as_path()).is_ok_and(|st| st.st_size > 0)
        })
    }

    /// `<pid>/<leaf>`'s own status (links not followed), relative to the
    /// root when it could be opened.
    fn stat_of(&self, pid: u32, leaf: &str) -> io::Result<FileStat> {
        let st = match self.root() {
            Some(root) => {
                let name = PidName::new(pid, leaf)?;
                fstatat(
                    Some(root.as_raw_fd()),
                    name.as_cstr(),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )
            }
            None => nix::sys::stat::lstat(self.pid_path(pid, leaf).as_path()),
        };
        st.map_err(io::Error::from)
    }
}

/// `<pid>/<leaf>` as a C string on the stack: the scan names a few files
/// of every process of the node.
pub(super) struct PidName {
    buf: [u8; 24], // "4294967295/" and a leaf of up to 12 bytes, and its NUL
}

impl PidName {
    pub(super) fn new(pid: u32, leaf: &str) -> io::Result<PidName> {
        let mut buf = [0u8; 24];
        // Too long a name fails the write (WriteZero) rather than cut it.
        write!(&mut buf[..23], "{pid}/{leaf}")?;
        Ok(PidName { buf })
    }

    pub(super) fn as_cstr(&self) -> &CStr {
        // The buffer's last byte is never written, so a NUL is always found.
        CStr::from_bytes_until_nul(&self.buf).unwrap_or_default()
    }
}
