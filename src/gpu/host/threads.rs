//! The file tables of a process's threads. Threads share their process's
//! table unless one was made without `CLONE_FILES` or called
//! `unshare(CLONE_FILES)` (unprivileged): such a thread's descriptors, a GPU
//! passed to it over a socket among them, are under `<pid>/task/<tid>/fd`
//! only, never under `<pid>/fd`, which is the main thread's table.
//!
//! Any process on the node is scanned, so its shape is a tenant's choice:
//! each distinct table is read once, however many threads share it, or a
//! process of a few unshared threads and many shared ones holding many
//! descriptors would cost a listing of them per thread.

use std::cmp::Ordering;
use std::io;
use std::os::fd::AsFd;
use std::sync::OnceLock;

use super::counts::PidName;
use super::{char_devices_in, for_each_entry, gone, open_dir, Flow, ProcHost, Wanted};

/// `kcmp(2)`'s `KCMP_FILES`: whether two tasks share one file table.
const KCMP_FILES: libc::c_int = 2;
/// Devices gathered past this many are sorted and their repeats dropped
/// after each thread's table: tables of many threads may each hold the
/// same devices many times over.
const COMPACT_PAST: usize = 256;

impl ProcHost {
    /// Appends the char devices open in the tables of `pid`'s threads that
    /// differ from its main thread's, which the caller listed (`main_read`:
    /// a main thread that exited has no table, and then every thread's is
    /// read). Threads sharing a table already read are told by `kcmp` and
    /// skipped, on a proc root that is the kernel's and where `kcmp` is
    /// allowed; elsewhere (a test or benchmark's tree, a seccomp filter
    /// without `kcmp`) every thread's table is read. A thread gone, or whose
    /// table this process may not follow, adds nothing, as such a process
    /// adds nothing; any other failure is the caller's.
    pub(super) fn thread_tables(
        &self,
        pid: u32,
        main_read: bool,
        wanted: Wanted<'_>,
        out: &mut Vec<u64>,
    ) -> io::Result<()> {
        let tasks = match self.open_pid_dir(pid, "task") {
            Ok(dir) => dir,
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut tids = Vec::new();
        match for_each_entry(tasks.as_fd(), |name| {
            tids.extend(
                std::str::from_utf8(name.to_bytes())
                    .ok()
                    .and_then(|n| n.parse::<u32>().ok()),
            );
            Flow::Next
        }) {
            Err(e) if !gone(&e) => return Err(e),
            _ => {}
        }
        let mut tables = Tables {
            compare: self.is_procfs() && kcmp_allowed(),
            read: Vec::new(),
        };
        if main_read {
            tables.read.push(pid);
        }
        for tid in tids {
            if tid == pid && main_read {
                continue;
            }
            let place = match tables.find(tid) {
                Place::Shared => continue,
                Place::At(at) => Some(at),
                Place::Unknown => None,
            };
            let dir = match open_dir(Some(&tasks), PidName::new(tid, "fd")?.as_cstr()) {
                Ok(dir) => dir,
                Err(e) if gone(&e) || refused(&e) => continue,
                Err(e) => return Err(e),
            };
            let listed = match char_devices_in(dir.as_fd(), wanted, out) {
                Ok(listed) => listed,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(e),
            };
            if out.len() > COMPACT_PAST {
                out.sort_unstable();
                out.dedup();
            }
            if let (Some(at), false) = (place, listed.refused) {
                tables.read.insert(at, tid);
            }
        }
        Ok(())
    }

    /// Whether the proc root is the kernel's procfs, whose pids `kcmp` takes.
    fn is_procfs(&self) -> bool {
        *self.procfs.get_or_init(|| {
            nix::sys::statfs::statfs(self.proc_root.as_path())
                .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC)
        })
    }
}

/// One thread of each table read, sorted by the order `kcmp` gives their
/// tables, so a thread's table is found among them in a few comparisons.
struct Tables {
    compare: bool,
    read: Vec<u32>,
}

/// Where a thread's table stands to those read.
enum Place {
    Shared,
    /// Not read yet: read, then kept at this place.
    At(usize),
    /// The kernel cannot say (a task gone meanwhile, a thread of credentials
    /// this process may not compare): read, which is never wrong, and not
    /// kept.
    Unknown,
}

impl Tables {
    fn find(&mut self, tid: u32) -> Place {
        if !self.compare {
            return Place::Unknown;
        }
        // A thread kept here that exited since fails each comparison with it:
        // dropped, and the search starts again (at most once per thread kept).
        'search: loop {
            let (mut lo, mut hi) = (0, self.read.len());
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                match kcmp_files(self.read[mid], tid) {
                    Some(Ordering::Equal) => return Place::Shared,
                    Some(Ordering::Less) => lo = mid + 1,
                    Some(Ordering::Greater) => hi = mid,
                    None if kcmp_files(self.read[mid], self.read[mid]).is_none() => {
                        self.read.remove(mid);
                        continue 'search;
                    }
                    None => return Place::Unknown,
                }
            }
            return Place::At(lo);
        }
    }
}

/// How the file table of task `a` orders against task `b`'s: the kernel
/// compares the tables' addresses, scrambled by a cookie of the boot, so
/// the order is total and stable (kcmp(2)). `None` where it cannot say.
fn kcmp_files(a: u32, b: u32) -> Option<Ordering> {
    let (a, b) = (
        libc::pid_t::try_from(a).ok()?,
        libc::pid_t::try_from(b).ok()?,
    );
    // SAFETY: kcmp takes two pids, a type and two unused words, and touches
    // no memory of ours.
    match unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_FILES, 0, 0) } {
        0 => Some(Ordering::Equal),
        1 => Some(Ordering::Less),
        2 => Some(Ordering::Greater),
        _ => None,
    }
}

/// Whether this process may use `kcmp` at all: a kernel without
/// `CONFIG_KCMP` answers ENOSYS, and a seccomp filter EPERM even for this
/// process with itself, which says nothing of access to others.
fn kcmp_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| {
        let me = std::process::id();
        kcmp_files(me, me) == Some(Ordering::Equal)
    })
}

fn refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM))
}

#[cfg(test)]
#[path = "threads_tests.rs"]
mod tests;
