//! Path resolution inside a container's rootfs, with `openat2` where the kernel
//! has it and the same resolution done here, one component at a time, where it
//! does not.
//!
//! `openat2` came with Linux 5.6 (include/uapi/linux/openat2.h); RHEL 8 (4.18)
//! and Ubuntu 20.04 (5.4) answer ENOSYS, and a seccomp profile around the
//! runtime may answer EPERM. The walk here keeps the guarantees devgate relies
//! on: every component is opened `O_PATH | O_NOFOLLOW` relative to a directory
//! descriptor it holds, a symlink's text is read from the link itself and
//! resolved from the root (absolute) or the directory holding it (relative),
//! and `..` returns to the directory the walk came through, never above the
//! root. It never asks the kernel to follow a link or to look up `..`, so a
//! concurrent rename cannot carry it outside the root (the race that makes
//! `openat2` answer EAGAIN).

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, readlinkat, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, Mode, SFlag};
use nix::sys::statfs::{fstatfs, PROC_SUPER_MAGIC};

/// The kernel's bound on links followed in one lookup (`MAXSYMLINKS`, include/linux/namei.h).
const MAX_LINKS: u32 = 40;
/// `openat2` attempts that hit a rename race before the walk here takes over.
const OPENAT2_TRIES: usize = 4;

/// Which resolver runs: the kernel's when it answers, or the walk here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resolver {
    /// `openat2`, falling back to [`Resolver::Walk`] where the kernel or a
    /// seccomp filter refuses the call.
    Kernel,
    /// The walk here alone.
    #[cfg(test)]
    Walk,
}

/// The directory `path` names inside `root` (an `O_PATH` descriptor), resolved
/// as if `root` were `/`: absolute links and `..` stay inside it; magic links
/// (procfs's `/proc/<pid>/root`, ...) are refused with ELOOP, as
/// `RESOLVE_NO_MAGICLINKS` does. The walk refuses every link on procfs, the
/// plain ones (`/proc/self`) too: no path devgate resolves in a rootfs goes
/// through procfs.
pub(super) fn open_dir_in_root(
    resolver: Resolver,
    root: BorrowedFd<'_>,
    path: &Path,
) -> Result<OwnedFd, Errno> {
    // The root itself (a rootfs of `/`): `.` to the kernel, which takes no
    // empty path without AT_EMPTY_PATH.
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    if resolver == Resolver::Kernel {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        for _ in 0..OPENAT2_TRIES {
            match kernel_open(root.as_raw_fd(), path, how) {
                Err(Errno::EAGAIN) => continue,
                Err(e) if unavailable(e) => break,
                other => return other,
            }
        }
    }
    walk(root, path)
}

/// The entry `name` (one plain component) of `dir` itself, as an `O_PATH`
/// descriptor: a symlink there is refused with ELOOP, not followed; with
/// `want_dir`, anything but a directory is refused with ENOTDIR.
pub(super) fn open_entry(
    resolver: Resolver,
    dir: BorrowedFd<'_>,
    name: &str,
    want_dir: bool,
) -> Result<OwnedFd, Errno> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Errno::EINVAL);
    }
    let mut opened = None;
    if resolver == Resolver::Kernel {
        // With O_PATH and O_NOFOLLOW a final link is opened itself
        // (openat2(2), RESOLVE_NO_SYMLINKS); the check below refuses it.
        let last = if want_dir {
            OFlag::O_DIRECTORY
        } else {
            OFlag::O_NOFOLLOW
        };
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | last)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        match kernel_open(dir.as_raw_fd(), Path::new(name), how) {
            Err(e) if unavailable(e) => {}
            other => opened = Some(other?),
        }
    }
    let fd = match opened {
        Some(fd) => fd,
        None => open_component(dir, name.as_ref())?,
    };
    match kind(&fd)? {
        SFlag::S_IFLNK => Err(Errno::ELOOP),
        SFlag::S_IFDIR => Ok(fd),
        _ if want_dir => Err(Errno::ENOTDIR),
        _ => Ok(fd),
    }
}

/// ENOSYS: a kernel before 5.6; EPERM: a seccomp filter refusing the call (an
/// `O_PATH` open has no other cause for it).
fn unavailable(e: Errno) -> bool {
    matches!(e, Errno::ENOSYS | Errno::EPERM)
}

fn kernel_open(dir: RawFd, path: &Path, how: OpenHow) -> Result<OwnedFd, Errno> {
    let raw = openat2(dir, path, how)?;
    // SAFETY: `openat2` just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn open_component(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let raw = openat(Some(dir.as_raw_fd()), name, flags, Mode::empty())?;
    // SAFETY: `openat` just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn kind(fd: &OwnedFd) -> Result<SFlag, Errno> {
    let st = fstat(fd.as_raw_fd())?;
    Ok(SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT)
}

/// Pushes the components of `path` onto `todo` so that they pop in order;
/// an absolute path first returns the walk to the root.
fn push_components(todo: &mut Vec<OsString>, dirs: &mut Vec<OwnedFd>, path: &Path) {
    if path.has_root() {
        dirs.clear();
    }
    let parts = path.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n.to_os_string()),
        Component::ParentDir => Some("..".into()),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    });
    let parts: Vec<OsString> = parts.collect();
    todo.extend(parts.into_iter().rev());
}

/// The resolution `open_dir_in_root` asks of the kernel, done here. `dirs`
/// holds the directories walked through below the root, the last the current one.
fn walk(root: BorrowedFd<'_>, path: &Path) -> Result<OwnedFd, Errno> {
    let mut dirs: Vec<OwnedFd> = Vec::new();
    let mut todo: Vec<OsString> = Vec::new();
    push_components(&mut todo, &mut dirs, path);
    let mut links = 0;
    while let Some(part) = todo.pop() {
        if part.as_bytes() == b".." {
            // `..` of the root is the root, as for a chroot.
            dirs.pop();
            continue;
        }
        let here = dirs.last().map_or(root, |d| d.as_fd());
        let fd = open_component(here, &part)?;
        match kind(&fd)? {
            SFlag::S_IFDIR => dirs.push(fd),
            SFlag::S_IFLNK => {
                links += 1;
                if links > MAX_LINKS || is_magic(&fd)? {
                    return Err(Errno::ELOOP);
                }
                // The link's own text, read through its descriptor (readlinkat
                // with an empty path, Linux 2.6.39): no second lookup by name.
                let target = readlinkat(Some(fd.as_raw_fd()), "")?;
                push_components(&mut todo, &mut dirs, Path::new(&target));
            }
            _ => return Err(Errno::ENOTDIR),
        }
    }
    match dirs.pop() {
        Some(fd) => Ok(fd),
        None => root
            .try_clone_to_owned()
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EBADF))),
    }
}

/// A link on procfs: its text does not name what it stands for.
fn is_magic(fd: &OwnedFd) -> Result<bool, Errno> {
    Ok(fstatfs(fd)?.filesystem_type() == PROC_SUPER_MAGIC)
}

#[cfg(test)]
#[path = "inroot_tests.rs"]
pub(super) mod tests;
