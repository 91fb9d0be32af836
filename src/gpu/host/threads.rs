//! The file tables of a process's threads. Threads share their process's
//! table unless one was made without `CLONE_FILES` or called
//! `unshare(CLONE_FILES)` (unprivileged): such a thread's descriptors, a GPU
//! passed to it over a socket among them, are under `<pid>/task/<tid>/fd`
//! only, never under `<pid>/fd`, which is the main thread's table.

use std::os::fd::AsFd;

use super::{char_devices_in, open_dir, ProcHost};

/// Tables told apart by `kcmp` before each is read; past this many distinct
/// ones, every further thread's table is read without comparing, so that a
/// process of many unshared threads costs a listing per thread, not a
/// comparison with every table before it.
const MAX_COMPARED: usize = 16;

/// `kcmp(2)`'s `KCMP_FILES`: whether two tasks share one file table.
const KCMP_FILES: libc::c_int = 2;

impl ProcHost {
    /// Appends the char devices open in the tables of `pid`'s threads that
    /// differ from its main thread's, which the caller listed (`main_read`:
    /// a main thread that exited has no table, and then every thread's is
    /// read). Threads sharing a table already read are told by `kcmp` and
    /// skipped, on a proc root that is the kernel's; on another tree (a test
    /// or benchmark's), every thread's table is read.
    pub(super) fn thread_tables(&self, pid: u32, main_read: bool, out: &mut Vec<u64>) {
        let Ok(tasks) = std::fs::read_dir(self.pid_path(pid, "task")) else {
            return;
        };
        let compare = self.is_procfs();
        let mut read: Vec<u32> = Vec::new();
        if main_read {
            read.push(pid);
        }
        for task in tasks.flatten() {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if tid == pid && main_read {
                continue;
            }
            if compare && read.len() <= MAX_COMPARED {
                match tables(&read, tid) {
                    Table::Shared => continue,
                    // kcmp asks the access a listing asks (ptrace read,
                    // fs/kcmp.c): the listing would be refused too.
                    Table::Refused => return,
                    Table::Own => {}
                }
            }
            // A thread that ended meanwhile has nothing to list.
            let Ok(dir) = open_dir(None, task.path().join("fd").as_path()) else {
                continue;
            };
            match char_devices_in(dir.as_fd(), out) {
                Ok(listed) if listed.refused => return,
                Ok(_) => read.push(tid),
                Err(_) => {}
            }
        }
    }

    /// Whether the proc root is the kernel's procfs, whose pids `kcmp` takes.
    fn is_procfs(&self) -> bool {
        *self.procfs.get_or_init(|| {
            nix::sys::statfs::statfs(self.proc_root.as_path())
                .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC)
        })
    }
}

/// How thread `tid`'s file table stands to those `read` already.
enum Table {
    Shared,
    /// Access to the process refused.
    Refused,
    /// Its own, or the kernel cannot say (no `kcmp`, a task gone): it is
    /// read, which is never wrong, only slower.
    Own,
}

fn tables(read: &[u32], tid: u32) -> Table {
    for &other in read {
        let (Ok(a), Ok(b)) = (libc::pid_t::try_from(other), libc::pid_t::try_from(tid)) else {
            return Table::Own;
        };
        // SAFETY: kcmp takes two pids, a type and two unused words, and
        // touches no memory of ours.
        let rc = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_FILES, 0, 0) };
        if rc == 0 {
            return Table::Shared;
        }
        if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
            return Table::Refused;
        }
    }
    Table::Own
}
