//! Every touch of the host that GPU teardown needs: procfs, signals, sleeping and the
//! optional reset command. [`ProcHost`] is the real one, rooted at a proc directory
//! that tests and benchmarks point at a tree of their own.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::fsutil::{
    open_dir_at as open_dir, read_proc_stat, read_proc_text, MAX_PROC_CGROUP_BYTES,
};
use crate::proc_stat::StatLine;

/// The devices a listing keeps: those given, or every one (`None`).
pub type Wanted<'a> = Option<&'a [u64]>;

/// A signal teardown sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Kill => "SIGKILL",
        }
    }
}

/// The host as GPU teardown sees it.
pub trait Host: Send + Sync {
    /// The pids under the proc root.
    fn pids(&self) -> io::Result<Vec<u32>>;
    /// Appends the device numbers (`st_rdev`) of the char devices `pid` holds open,
    /// of those in `wanted` only where it is given; a descriptor opened with
    /// `O_PATH`, which opens nothing, is left out. `NotFound` when the
    /// process is gone.
    fn open_char_devices(&self, pid: u32, wanted: Wanted<'_>, out: &mut Vec<u64>)
        -> io::Result<()>;
    /// The text of `<proc>/<pid>/cgroup`.
    fn cgroup(&self, pid: u32) -> io::Result<String>;
    /// The start time of a live process (field 22 of `<proc>/<pid>/stat`), `None` once it
    /// is gone or a zombie. Guards signals against pid reuse.
    fn start_time(&self, pid: u32) -> io::Result<Option<u64>>;
    /// Sends `signal` to `pid` while it is still the process that started
    /// at `start` ([`Self::start_time`]): never to one that took the pid since.
    fn signal(&self, pid: u32, start: u64, signal: Signal) -> io::Result<Sent>;
    fn sleep(&self, duration: Duration);
    /// Runs a command to completion within `timeout`; the error is its reason, one line.
    fn run(&self, argv: &[String], timeout: Duration) -> Result<(), String>;
    /// Whether the NVIDIA kernel driver is loaded (`<proc>/driver/nvidia/version`):
    /// then a GPU without NVML is one that cannot be reset, not a node without GPUs.
    fn nvidia_driver_loaded(&self) -> bool {
        false
    }
    /// Whether `pid` runs the executable file this process runs (the same
    /// device and inode through `<pid>/exe`): another devgate process.
    fn runs_this_program(&self, _pid: u32) -> bool {
        false
    }
}

/// The real host, reading processes from `proc_root` (normally `/proc`).
#[derive(Debug, Clone)]
pub struct ProcHost {
    proc_root: PathBuf,
    /// The root, opened on first use: `<pid>/fd` is opened relative to it, which
    /// spares a path walk per process.
    root_dir: Arc<OnceLock<Option<OwnedFd>>>,
    /// Whether the kernel gives `<pid>/fd` the count of open descriptors as
    /// its size (Linux 6.2), known on first use.
    fd_dir_sizes: Arc<OnceLock<bool>>,
    /// Whether the proc root is the kernel's procfs, known on first use.
    procfs: Arc<OnceLock<bool>>,
}

impl ProcHost {
    pub fn new(proc_root: &Path) -> ProcHost {
        ProcHost {
            proc_root: proc_root.to_path_buf(),
            root_dir: Arc::default(),
            fd_dir_sizes: Arc::default(),
            procfs: Arc::default(),
        }
    }

    /// The proc root, opened on first use (`None` when it cannot be).
    fn root(&self) -> Option<&OwnedFd> {
        self.root_dir
            .get_or_init(|| open_dir(None, self.proc_root.as_path()).ok())
            .as_ref()
    }

    /// Opens the directory `<pid>/<leaf>`, relative to the root when it
    /// could be opened.
    fn open_pid_dir(&self, pid: u32, leaf: &str) -> io::Result<OwnedFd> {
        match self.root() {
            Some(root) => open_dir(Some(root), PidName::new(pid, leaf)?.as_cstr()),
            None => open_dir(None, self.pid_path(pid, leaf).as_path()),
        }
    }

    fn pid_path(&self, pid: u32, name: &str) -> PathBuf {
        let mut path = self.proc_root.join(pid.to_string());
        path.push(name);
        path
    }
}

impl Host for ProcHost {
    fn pids(&self) -> io::Result<Vec<u32>> {
        let mut pids = Vec::with_capacity(1024);
        let opened;
        let root = match self.root() {
            Some(root) => root,
            None => {
                opened = open_dir(None, self.proc_root.as_path())?;
                &opened
            }
        };
        // A descriptor of its own: reading moves the directory offset, and scans may
        // run on several threads.
        let dir = open_dir(Some(root), c".")?;
        for_each_entry(dir.as_fd(), |name| {
            if let Some(pid) = std::str::from_utf8(name.to_bytes())
                .ok()
                .and_then(|n| n.parse::<u32>().ok())
            {
                pids.push(pid);
            }
            Flow::Next
        })?;
        Ok(pids)
    }

    fn open_char_devices(
        &self,
        pid: u32,
        wanted: Wanted<'_>,
        out: &mut Vec<u64>,
    ) -> io::Result<()> {
        // A process that holds no descriptor (every kernel thread: half the
        // pids of a node) needs no listing where the kernel counts them.
        let listed = if self.fd_count(pid)? == Some(0) {
            Listing::default()
        } else {
            let dir = self.open_pid_dir(pid, "fd")?;
            char_devices_in(dir.as_fd(), wanted, out)?
        };
        // Its threads' tables ask the same access of the same process.
        if listed.refused {
            return Ok(());
        }
        // A process of one thread (every kernel thread) has no other table
        // to look at, and one stat spares the walk of its tasks. Any other
        // may have threads with tables of their own (`threads`), and one
        // whose main thread exited (a killed CUDA process with a thread stuck
        // in the driver) lists nothing under `<pid>/fd`: the exited leader
        // has no file table (exit_files), its live threads' are under
        // `<pid>/task/<tid>/fd`.
        if self.has_other_threads(pid) {
            self.thread_tables(pid, listed.entries > 0, wanted, out)?;
        }
        Ok(())
    }

    fn cgroup(&self, pid: u32) -> io::Result<String> {
        Ok(read_proc_text(
            &self.pid_path(pid, "cgroup"),
            MAX_PROC_CGROUP_BYTES,
        )?)
    }

    fn nvidia_driver_loaded(&self) -> bool {
        self.proc_root.join("driver/nvidia/version").exists()
    }

    fn runs_this_program(&self, pid: u32) -> bool {
        use std::os::unix::fs::MetadataExt;
        static OWN: OnceLock<Option<(u64, u64)>> = OnceLock::new();
        let id = |m: std::fs::Metadata| (m.dev(), m.ino());
        // `exe` is followed to the file itself, whatever mount namespace
        // its path is in: a tenant's copy of the binary is another inode.
        let own = OWN.get_or_init(|| std::fs::metadata("/proc/self/exe").ok().map(id));
        own.is_some_and(|own| {
            std::fs::metadata(self.pid_path(pid, "exe")).is_ok_and(|m| id(m) == own)
        })
    }

    fn start_time(&self, pid: u32) -> io::Result<Option<u64>> {
        match read_proc_stat(&self.pid_path(pid, "stat")).map_err(io::Error::from) {
            Ok(text) => Ok(parse_stat(&text)),
            Err(e) if gone(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn signal(&self, pid: u32, start: u64, signal: Signal) -> io::Result<Sent> {
        let sig = match signal {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
        };
        pidfd::signal_pinned(pid, sig, || Ok(self.start_time(pid)? == Some(start)))
    }

    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    fn run(&self, argv: &[String], timeout: Duration) -> Result<(), String> {
        command::run(argv, timeout)
    }
}

/// What [`char_devices_in`] listed of an fd directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Listing {
    /// How many entries it listed.
    entries: usize,
    /// Whether it stopped refused access to the process.
    refused: bool,
}

/// The char devices open in an fd directory, into `out`; what it listed.
/// Each fd's magic link is followed to the open file itself, whatever
/// mount namespace its path lives in (a path name would not say
/// which device it is), with `AT_STATX_DONT_SYNC`: a file on a hung network
/// or FUSE mount is answered from cached attributes instead of blocking the
/// teardown (statx(2)).
///
/// Following a descriptor needs ptrace read access to its process
/// (`proc_fd_access_allowed`, fs/proc/base.c), so a follow refused for that
/// reason stops the listing: every other descriptor of the process would be
/// refused too. A refusal of the file itself (a security module's) is that
/// descriptor's alone.
///
/// Only a wanted device's descriptor is asked how it was opened
/// ([`path_only`]): three more syscalls, where every process holds some
/// char device (`/dev/null`, a terminal) and few a GPU.
fn char_devices_in(
    dir: BorrowedFd<'_>,
    wanted: Wanted<'_>,
    out: &mut Vec<u64>,
) -> io::Result<Listing> {
    let mut listed = Listing::default();
    for_each_entry(dir, |name| {
        listed.entries += 1;
        let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
        // SAFETY: a NUL-terminated name relative to an open directory, and a
        // buffer of the size statx fills.
        let rc = unsafe {
            libc::statx(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_STATX_DONT_SYNC,
                libc::STATX_TYPE,
                stx.as_mut_ptr(),
            )
        };
        if rc != 0 {
            // Closed meanwhile, or a dangling link in a test tree; or refused.
            return if last_call_refused() && process_refused(dir, name) {
                listed.refused = true;
                Flow::Stop
            } else {
                Flow::Next
            };
        }
        // SAFETY: statx succeeded and filled the buffer.
        let stx = unsafe { stx.assume_init() };
        if u32::from(stx.stx_mode) & libc::S_IFMT != libc::S_IFCHR {
            return Flow::Next;
        }
        let rdev = libc::makedev(stx.stx_rdev_major, stx.stx_rdev_minor);
        if wanted.is_none_or(|w| w.contains(&rdev)) && !path_only::opened_as_path(dir, name) {
            out.push(rdev);
        }
        Flow::Next
    })?;
    Ok(listed)
}

/// Whether a refused follow of `name` was its process's: reading the link,
/// which asks the same ptrace access and nothing of the file, is refused too.
fn process_refused(dir: BorrowedFd<'_>, name: &CStr) -> bool {
    let mut buf = [0u8; 64];
    // SAFETY: a NUL-terminated name relative to an open directory, and a
    // buffer writable for the length given.
    let rc = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    rc < 0 && last_call_refused()
}

/// Whether the last failed call was refused access (EACCES or EPERM).
fn last_call_refused() -> bool {
    matches!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES | libc::EPERM)
    )
}

/// Whether [`for_each_entry`] goes on to the next entry.
#[derive(PartialEq, Eq)]
enum Flow {
    Next,
    Stop,
}

/// Calls `f` with each entry of a directory but `.` and `..`, straight from
/// getdents64(2), until it says stop: a libc DIR stream adds fcntl and lseek
/// calls, a third more syscalls per process on a node scan.
fn for_each_entry(dir: BorrowedFd<'_>, mut f: impl FnMut(&CStr) -> Flow) -> io::Result<()> {
    let mut buf = [0u8; 8192];
    loop {
        // SAFETY: the buffer is writable for its length; the fd is open.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let n = match usize::try_from(n) {
            Ok(0) => return Ok(()),
            Ok(n) => n.min(buf.len()),
            Err(_) => return Err(io::Error::last_os_error()),
        };
        let mut at = 0;
        while at < n {
            // struct linux_dirent64: u64 d_ino, i64 d_off, u16 d_reclen, u8 d_type, name.
            let bad = || io::Error::from(io::ErrorKind::InvalidData);
            let len = buf.get(at + 16..at + 18).ok_or_else(bad)?;
            let len = usize::from(u16::from_ne_bytes([len[0], len[1]]));
            if len < 20 || at + len > n {
                return Err(bad());
            }
            let name = CStr::from_bytes_until_nul(&buf[at + 19..at + len]).map_err(|_| bad())?;
            if !is_dot(name) && f(name) == Flow::Stop {
                return Ok(());
            }
            at += len;
        }
    }
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// ENOENT and ESRCH both mean the process went away while we looked.
pub fn gone(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ESRCH)
}

/// The start time of a `stat` line, `None` for a process that has exited
/// ([`StatLine::exited`]: dead, or a zombie with no thread left).
pub fn parse_stat(text: &str) -> Option<u64> {
    StatLine::parse(text)
        .filter(|stat| !stat.exited())
        .map(|stat| stat.start_ticks)
}

mod command;
mod counts;
mod path_only;
mod pidfd;
mod threads;
use counts::PidName;
pub use pidfd::Sent;

#[cfg(test)]
mod tests;
