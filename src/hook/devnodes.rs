//! Device nodes in a container's `/dev`, made by the hook in hooks-only mode
//! (no NRI plugin puts them into the OCI spec).
//!
//! runc runs prestart and createRuntime hooks after it has mounted the
//! container's `/dev` and before `pivot_root` (libcontainer `prepareRootfs` →
//! `syncParentHooks`). The container's mount tree is then reachable from the
//! runtime's namespace through `/proc/<pid>/root`, with the rootfs at the
//! bundle's `root.path`. Every path below that is resolved inside the root
//! (`openat2(RESOLVE_IN_ROOT)`, or the same walk in user space on kernels
//! before 5.6: `super::inroot`) and directories under `/dev` are opened
//! without following a symlink, so a symlink planted in an image cannot send
//! a node outside the container (the NVIDIA container toolkit's CVE-2024-0132
//! class of bug).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::stat::{fchmodat, fstat, mkdirat, mknodat, FchmodatFlags, Mode, SFlag};

use super::inroot::{open_dir_in_root, open_entry, Resolver};
use crate::plan::{DeviceKind, DeviceNode};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("open {path} in the container: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("device path {path:?} is not /dev/<name> or /dev/<dir>/<name> with plain names")]
    BadPath { path: String },
    #[error("create {path} in the container: {source}")]
    Create {
        path: String,
        #[source]
        source: Errno,
    },
    #[error("{path} already exists in the container and is not char device {major}:{minor}")]
    Occupied {
        path: String,
        major: u32,
        minor: u32,
    },
    #[error("the container runs in a user namespace of its own: device nodes made for it could not be opened (the kernel refuses device nodes on a filesystem mounted in another user namespace, SB_I_NODEV); hooks-only mode cannot give it devices: use NRI or CDI")]
    UserNamespace,
}

/// Refuses a container in a user namespace other than this process's:
/// its `/dev` is a tmpfs mounted there, which the kernel marks nodev
/// (`alloc_super`: `SB_I_NODEV` unless the namespace is the initial one), and
/// a node made there either cannot be created (EOVERFLOW: root has no mapping)
/// or cannot be opened. runc bind-mounts host nodes for such containers.
pub fn check_user_ns(proc_root: &Path, pid: u32) -> Result<(), NodeError> {
    let ns = |who: &str| {
        let path = proc_root.join(who).join("ns/user");
        std::fs::metadata(&path)
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            })
            .map_err(|e| NodeError::Open {
                path,
                source: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
            })
    };
    if ns(&pid.to_string())? != ns("self")? {
        return Err(NodeError::UserNamespace);
    }
    Ok(())
}

/// The container's rootfs as seen from its mount namespace: `rootfs` resolved
/// inside `<proc_root>/<pid>/root`, so absolute symlinks on the way stay there.
pub fn open_rootfs(proc_root: &Path, pid: u32, rootfs: &Path) -> Result<OwnedFd, NodeError> {
    open_rootfs_with(Resolver::Kernel, proc_root, pid, rootfs)
}

fn open_rootfs_with(
    resolver: Resolver,
    proc_root: &Path,
    pid: u32,
    rootfs: &Path,
) -> Result<OwnedFd, NodeError> {
    let root_path = proc_root.join(pid.to_string()).join("root");
    let root = File::open(&root_path).map_err(|e| NodeError::Open {
        path: root_path.clone(),
        source: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })?;
    let rel = rootfs.strip_prefix("/").unwrap_or(rootfs);
    open_dir_in_root(resolver, root.as_fd(), rel).map_err(|source| NodeError::Open {
        path: root_path.join(rel),
        source,
    })
}

/// `/dev/<name>` → (None, name); `/dev/<dir>/<name>` → (Some(dir), name).
fn split(path: &str) -> Option<(Option<&str>, &str)> {
    let rest = path.strip_prefix("/dev/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s != "."
            && s != ".."
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    };
    if !parts.iter().all(|p| plain(p)) {
        return None;
    }
    match parts[..] {
        [name] => Some((None, name)),
        [dir, name] => Some((Some(dir), name)),
        _ => None,
    }
}

/// Creates `nodes` below `rootfs` (an `O_PATH` directory, normally from
/// [`open_rootfs`]); a node already there with the same type and numbers is
/// kept (a second stage, or the runtime made it). Returns how many were made.
pub fn make_nodes(rootfs: BorrowedFd<'_>, nodes: &[DeviceNode]) -> Result<usize, NodeError> {
    make_nodes_with(Resolver::Kernel, rootfs, nodes)
}

fn make_nodes_with(
    resolver: Resolver,
    rootfs: BorrowedFd<'_>,
    nodes: &[DeviceNode],
) -> Result<usize, NodeError> {
    let mut made = 0;
    if nodes.is_empty() {
        return Ok(0);
    }
    let dev =
        open_dir_in_root(resolver, rootfs, Path::new("dev")).map_err(|source| NodeError::Open {
            path: PathBuf::from("/dev"),
            source,
        })?;
    for node in nodes {
        let (sub, name) = split(&node.path).ok_or_else(|| NodeError::BadPath {
            path: node.path.chars().take(128).collect(),
        })?;
        let dir = match sub {
            None => None,
            Some(sub) => Some(open_subdir(resolver, &dev, sub)?),
        };
        let dir_fd = dir.as_ref().unwrap_or(&dev).as_fd();
        if make_node(resolver, dir_fd, name, node)? {
            made += 1;
        }
    }
    Ok(made)
}

/// `/dev/<sub>`, created 0755 when missing; never through a symlink. It may be
/// a volume (a hostPath `/dev/infiniband`), even one a running container
/// shares: every node in it is checked and changed through a descriptor of
/// the node itself, never by name (`make_node`).
fn open_subdir(resolver: Resolver, dev: &OwnedFd, sub: &str) -> Result<OwnedFd, NodeError> {
    let path = format!("/dev/{sub}");
    let mode = Mode::from_bits_truncate(0o755);
    let made = match mkdirat(Some(dev.as_raw_fd()), sub, mode) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(source) => return Err(NodeError::Create { path, source }),
    };
    let dir = open_entry(resolver, dev.as_fd(), sub, true).map_err(|source| NodeError::Open {
        path: PathBuf::from(&path),
        source,
    })?;
    // mkdir applied the umask the hook inherited from its runtime (podman
    // from a shell with umask 077 would leave /dev/infiniband 0700, closed to
    // a non-root workload); set through the descriptor, as `make_node` does.
    if made {
        let link = format!("/proc/self/fd/{}", dir.as_raw_fd());
        fchmodat(None, link.as_str(), mode, FchmodatFlags::FollowSymlink)
            .map_err(|source| NodeError::Create { path, source })?;
    }
    Ok(dir)
}

/// True when the node was created, false when the same node was there.
fn make_node(
    resolver: Resolver,
    dir: BorrowedFd<'_>,
    name: &str,
    node: &DeviceNode,
) -> Result<bool, NodeError> {
    let kind = match node.kind {
        DeviceKind::Char => SFlag::S_IFCHR,
    };
    let rdev = libc::makedev(node.major, node.minor);
    let perm = Mode::from_bits_truncate(node.file_mode & 0o777);
    let create = |source| NodeError::Create {
        path: node.path.clone(),
        source,
    };
    let made = match mknodat(Some(dir.as_raw_fd()), name, kind, perm, rdev) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(create(e)),
    };
    let occupied = || NodeError::Occupied {
        path: node.path.clone(),
        major: node.major,
        minor: node.minor,
    };
    // Everything from here works on the node itself, never on its name again:
    // a process sharing the directory could rename a symlink over it.
    // The node itself, as an `O_PATH` descriptor: a symlink there is refused, not followed.
    let fd = match open_entry(resolver, dir, name, false) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return Err(occupied()),
        Err(e) => return Err(create(e)),
    };
    let st = fstat(fd.as_raw_fd()).map_err(create)?;
    let same =
        SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == kind && st.st_rdev == rdev;
    if !same {
        return Err(occupied());
    }
    // mknod applied the umask; the plan's mode is the contract. chmod goes
    // through the descriptor's magic link, which names the inode it was
    // opened on (as glibc's fchmodat with AT_SYMLINK_NOFOLLOW does). A node
    // that was there already is left as it is: it may be the host's own,
    // bind-mounted by the runtime (`--device`), whose mode is not the
    // container's to change.
    if made {
        let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
        fchmodat(None, link.as_str(), perm, FchmodatFlags::FollowSymlink).map_err(create)?;
    }
    Ok(made)
}

#[cfg(test)]
#[path = "devnodes_tests.rs"]
mod tests;
