//! Network namespaces: handles, per-thread entry with guaranteed return, and
//! finding a pod's namespace again from its saved identity.
//!
//! `setns(2)` with CLONE_NEWNET changes only the calling thread, and a netlink
//! socket stays bound to the namespace it was created in (af_netlink.c), so the
//! pattern is: enter, create the socket, leave; then use the socket from anywhere.

use std::fs;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("open netns {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("enter netns {id}: {source}")]
    Enter {
        id: NetnsId,
        #[source]
        source: nix::Error,
    },
}

/// A namespace's identity: the nsfs device and inode (`stat -L /proc/<pid>/ns/net`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

impl std::fmt::Display for NetnsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "net:[{}]", self.ino)
    }
}

/// An open network namespace; holding it keeps the namespace alive.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    id: NetnsId,
}

impl Netns {
    /// Opens a namespace file (`/proc/<pid>/ns/net`, `/run/netns/<name>`).
    pub fn open(path: &Path) -> Result<Netns, NetnsError> {
        Netns::open_in(None, path, || path.to_path_buf())
    }

    /// Opens `name` under the open directory `dir` (a process's proc
    /// directory: `ns/net`), whose path `shown` names it in errors.
    pub fn open_at(dir: BorrowedFd<'_>, name: &Path, shown: &Path) -> Result<Netns, NetnsError> {
        Netns::open_in(Some(dir), name, || shown.join(name))
    }

    fn open_in(
        dir: Option<BorrowedFd<'_>>,
        name: &Path,
        shown: impl FnOnce() -> PathBuf,
    ) -> Result<Netns, NetnsError> {
        // Whatever the path turns out to be, opening it neither waits (a
        // FIFO) nor takes a terminal; the identity is checked by the caller.
        let flags = nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_NONBLOCK
            | nix::fcntl::OFlag::O_NOCTTY
            | nix::fcntl::OFlag::O_CLOEXEC;
        let opened = nix::fcntl::openat(
            dir.map(|d| d.as_raw_fd()),
            name,
            flags,
            nix::sys::stat::Mode::empty(),
        );
        let opened = opened.map_err(std::io::Error::from).and_then(|fd| {
            // SAFETY: openat returned a new descriptor that nothing else owns.
            Netns::of_file(unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        });
        opened.map_err(|source| NetnsError::Open {
            path: shown(),
            source,
        })
    }

    fn of_file(file: fs::File) -> std::io::Result<Netns> {
        let meta = file.metadata()?;
        Ok(Netns {
            fd: file.into(),
            id: NetnsId {
                dev: meta.dev(),
                ino: meta.ino(),
            },
        })
    }

    /// The calling thread's namespace.
    pub fn current() -> Result<Netns, NetnsError> {
        Netns::open(Path::new("/proc/thread-self/ns/net"))
    }

    /// The namespace of a process, through a proc root (normally `/proc`).
    pub fn of_pid(proc_root: &Path, pid: u32) -> Result<Netns, NetnsError> {
        Netns::open(&proc_root.join(pid.to_string()).join("ns/net"))
    }

    pub fn id(&self) -> NetnsId {
        self.id
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Moves the calling thread into this namespace until the guard drops.
    pub fn enter(&self) -> Result<NetnsGuard, NetnsError> {
        let prev = Netns::current()?;
        if prev.id == self.id {
            return Ok(NetnsGuard {
                prev: None,
                _thread: PhantomData,
            });
        }
        setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
            id: self.id,
            source,
        })?;
        Ok(NetnsGuard {
            prev: Some(prev),
            _thread: PhantomData,
        })
    }

    /// A handle whose identity is made up, for logic tests against a fake kernel.
    #[cfg(test)]
    pub fn fake(ino: u64) -> Netns {
        let file = fs::File::open("/dev/null").expect("open /dev/null");
        Netns {
            fd: file.into(),
            id: NetnsId { dev: 0, ino },
        }
    }
}

/// Returns the thread to the namespace it was in. It stays on the thread
/// that entered:
///
/// ```compile_fail
/// fn sent<T: Send>(_: T) {}
/// let ns = devgate::netdev::Netns::current().unwrap();
/// sent(ns.enter().unwrap());
/// ```
#[must_use = "the thread leaves the namespace when the guard drops"]
pub struct NetnsGuard {
    prev: Option<Netns>,
    /// Neither `Send` nor `Sync`: `setns` moves the calling thread, so the
    /// guard must drop on the thread that entered.
    _thread: PhantomData<*const ()>,
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let Some(prev) = self.prev.take() else {
            return;
        };
        if let Err(e) = setns(prev.fd.as_fd(), CloneFlags::CLONE_NEWNET) {
            // A thread stranded in a pod's namespace would act on the wrong
            // devices from here on; stopping is the only safe outcome.
            tracing::error!(error = %nri::ErrorChain(&e), netns = %prev.id, "cannot return to the original netns");
            std::process::abort();
        }
    }
}

/// Where to look for a namespace again: the saved path first, then the bind-mount
/// directories `ip netns` and CNI use, then every process's `ns/net`.
#[derive(Debug, Clone)]
pub struct NetnsRoots {
    pub proc_root: PathBuf,
    pub bind_dirs: Vec<PathBuf>,
}

impl Default for NetnsRoots {
    fn default() -> Self {
        NetnsRoots {
            proc_root: PathBuf::from("/proc"),
            bind_dirs: vec![PathBuf::from("/run/netns"), PathBuf::from("/var/run/netns")],
        }
    }
}

/// Most processes examined when searching `/proc` for a namespace.
const MAX_PROC_SCAN: usize = 1 << 20;

impl NetnsRoots {
    /// Opens the namespace `id` if it still exists. `hint` is a path saved when
    /// the namespace was known (it may now name another namespace, so it is checked).
    pub fn find(&self, id: NetnsId, hint: Option<&Path>) -> Option<Netns> {
        let try_open = |p: &Path| Netns::open(p).ok().filter(|ns| ns.id == id);
        if let Some(ns) = hint.and_then(try_open) {
            return Some(ns);
        }
        for dir in &self.bind_dirs {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let same = entry
                    .metadata()
                    .map(|m| m.dev() == id.dev && m.ino() == id.ino)
                    .unwrap_or(false);
                if same {
                    if let Some(ns) = try_open(&entry.path()) {
                        return Some(ns);
                    }
                }
            }
        }
        super::netns_mounts::find(&self.proc_root, id).or_else(|| self.scan_proc(id))
    }

    fn scan_proc(&self, id: NetnsId) -> Option<Netns> {
        pids_in(&self.proc_root, id).find_map(|(_, dir)| {
            // The process may have exited or changed namespace since the readlink.
            Netns::open(&dir.join("ns/net"))
                .ok()
                .filter(|ns| ns.id == id)
        })
    }
}

/// The processes under `proc_root` whose network namespace link names `id`'s
/// inode, each with its directory, at most [`MAX_PROC_SCAN`] looked at. The
/// link is read, not opened: a caller that needs the namespace itself opens
/// it and checks its identity, since the process may have moved meanwhile.
pub(crate) fn pids_in(proc_root: &Path, id: NetnsId) -> impl Iterator<Item = (u32, PathBuf)> {
    let want = id.to_string();
    fs::read_dir(proc_root)
        .into_iter()
        .flatten()
        .flatten()
        .take(MAX_PROC_SCAN)
        .filter_map(move |entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let dir = entry.path();
            links_to(&dir, &want).then_some((pid, dir))
        })
}

/// Whether the process of `proc_dir` (`/proc/<pid>`) is in the namespace
/// whose link text (`NetnsId`'s display, `net:[<inode>]`) is `want`; read,
/// not opened.
pub(crate) fn links_to(proc_dir: &Path, want: &str) -> bool {
    fs::read_link(proc_dir.join("ns/net")).is_ok_and(|link| link.as_os_str() == want)
}

impl AsRawFd for Netns {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}
