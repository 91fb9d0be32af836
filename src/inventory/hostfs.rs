//! Reads under a host root with every symlink resolved inside that root.
//!
//! A host root holds a host's `sys/` and `proc/`: `/` on the node, the host's root mounted into
//! a pod, or a fixture. sysfs links are relative (`../../../devices/...`), but a copied or
//! hand-made tree may hold absolute ones; both resolve as if the root were `/` (chroot
//! semantics, like the kernel's path walk in fs/namei.c), so nothing outside the root is read.
//! Reads are bounded in size, entry count and symlink hops.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, openat2, readlinkat, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};

use super::error::InventoryError;
use super::hostdir::HostDir;

/// sysfs attributes are at most a page; 64 KiB also covers `proc/devices`.
pub(crate) const MAX_FILE_BYTES: u64 = 64 * 1024;
/// Above any real `sys/bus/pci/devices` or `sys/class/infiniband_mad`: the
/// latter has a `umad` and an `issm` per port, 4096 for 16 PFs of 127 VFs,
/// and the kernel allows 8192 ports of each (`RDMA_MAX_PORTS`).
pub(crate) const MAX_DIR_ENTRIES: usize = 32768;
/// The kernel's own limit per lookup (MAXSYMLINKS, include/linux/namei.h).
pub(crate) const MAX_SYMLINKS: usize = 40;
/// `openat2` attempts before resolving in user space instead.
const OPENAT2_TRIES: usize = 8;

type Result<T> = std::result::Result<T, InventoryError>;

/// A path relative to the host root whose components are all real (no symlinks).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct RealPath(PathBuf);

impl RealPath {
    pub(crate) fn as_path(&self) -> &Path {
        &self.0
    }

    /// The last component as UTF-8, e.g. the BDF of a PCI device directory.
    pub(crate) fn name(&self) -> Option<&str> {
        self.0.file_name().and_then(|n| n.to_str())
    }

    /// The parent of a real path is real too.
    pub(crate) fn parent(&self) -> Option<RealPath> {
        self.0.parent().map(|p| RealPath(p.to_path_buf()))
    }
}

/// What a lookup found, remembered for one discovery: device paths share their
/// `sys/devices/pci.../` prefixes, so each is looked up once.
#[derive(Debug, Clone)]
enum Node {
    Dir,
    Link(Rc<Path>),
    Other,
}

/// Root-relative, read-only access to a host root.
///
/// Where the kernel offers `openat2(RESOLVE_IN_ROOT)` (Linux 5.6, include/uapi/linux/openat2.h)
/// it resolves each read inside the root in one call; elsewhere (older kernels, seccomp
/// profiles that refuse it) the same resolution is done here, one component at a time.
#[derive(Debug)]
pub(crate) struct HostFs {
    root: PathBuf,
    root_fd: Option<OwnedFd>,
    in_root: bool,
    nodes: RefCell<HashMap<PathBuf, Node>>,
}

impl HostFs {
    pub(crate) fn new(root: &Path) -> Self {
        // The root itself may be a symlink (a mount point path, say): follow it once.
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let root_fd = open_at(None, root, flags).ok();
        // Whether the kernel (5.6+) and any seccomp filter allow `openat2` does
        // not change while the process runs: probed once, on the first root
        // that opens, rather than at each of the plan's GID table reads.
        static OPENAT2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let in_root = root_fd.as_ref().is_some_and(|fd| {
            *OPENAT2.get_or_init(|| open_in_root(fd.as_raw_fd(), Path::new("."), flags).is_ok())
        });
        HostFs {
            root: root.to_path_buf(),
            root_fd,
            in_root,
            nodes: RefCell::new(HashMap::new()),
        }
    }

    /// Without `openat2`, as on kernels before 5.6.
    #[cfg(test)]
    pub(crate) fn without_openat2(mut self) -> Self {
        self.in_root = false;
        self
    }

    /// The host root itself.
    pub(crate) fn top(&self) -> RealPath {
        RealPath::default()
    }

    /// How to name the root-relative `path` for an `*at` call: relative to the root's
    /// descriptor, or by its full path when the root could not be opened.
    fn at<'p>(&self, path: &'p Path) -> (Option<RawFd>, Cow<'p, Path>) {
        match &self.root_fd {
            Some(fd) if !path.as_os_str().is_empty() => (Some(fd.as_raw_fd()), Cow::Borrowed(path)),
            Some(fd) => (Some(fd.as_raw_fd()), Cow::Borrowed(Path::new("."))),
            None => (None, Cow::Owned(self.root.join(path))),
        }
    }

    /// Looks up a root-relative path whose parent is real, without following a final symlink.
    fn lookup(&self, path: &Path) -> Result<Node> {
        if let Some(node) = self.nodes.borrow().get(path) {
            return Ok(node.clone());
        }
        let (fd, at) = self.at(path);
        let stat = fstatat(fd, at.as_ref(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| io_err(path, e.into()))?;
        let node = match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => Node::Dir,
            SFlag::S_IFLNK => {
                let target = readlinkat(fd, at.as_ref()).map_err(|e| io_err(path, e.into()))?;
                Node::Link(PathBuf::from(target).into())
            }
            _ => Node::Other,
        };
        self.nodes
            .borrow_mut()
            .insert(path.to_path_buf(), node.clone());
        Ok(node)
    }

    /// Resolves `rel` (relative to the root, or absolute meaning "from the root").
    pub(crate) fn resolve(&self, rel: impl AsRef<Path>) -> Result<RealPath> {
        self.resolve_in(&self.top(), rel)
    }

    /// Resolves `rel` below the already-resolved `base`, following symlinks inside the root.
    pub(crate) fn resolve_in(&self, base: &RealPath, rel: impl AsRef<Path>) -> Result<RealPath> {
        let mut done = base.0.clone();
        let mut todo: Vec<OsString> = Vec::new();
        push_components(&mut todo, &mut done, rel.as_ref());
        let mut hops = 0;
        while let Some(part) = todo.pop() {
            if part == ".." {
                // `..` of the root is the root, as for a chroot.
                done.pop();
                continue;
            }
            done.push(&part);
            match self.lookup(&done)? {
                Node::Link(target) => {
                    hops += 1;
                    if hops > MAX_SYMLINKS {
                        return Err(InventoryError::SymlinkLoop { path: done });
                    }
                    done.pop();
                    push_components(&mut todo, &mut done, &target);
                }
                Node::Other if !todo.is_empty() => {
                    return Err(io_err(&done, Errno::ENOTDIR.into()));
                }
                Node::Dir | Node::Other => {}
            }
        }
        Ok(RealPath(done))
    }

    /// Opens the root-relative `path`, following symlinks inside the root only.
    fn open(&self, path: &Path, flags: OFlag) -> Result<(OwnedFd, PathBuf)> {
        if let (true, Some(root)) = (self.in_root, &self.root_fd) {
            // EAGAIN: a rename somewhere on the system raced a `..` of the walk, and the
            // kernel cannot prove the walk stayed inside the root (openat2(2)). Retry, then
            // resolve here instead.
            let mut result = Err(Errno::EAGAIN);
            for _ in 0..OPENAT2_TRIES {
                result = open_in_root(root.as_raw_fd(), path, flags);
                if !matches!(result, Err(Errno::EAGAIN)) {
                    break;
                }
            }
            match result {
                Ok(fd) => return Ok((fd, path.to_path_buf())),
                Err(Errno::EAGAIN) => {}
                Err(Errno::ELOOP) => {
                    let path = path.to_path_buf();
                    return Err(InventoryError::SymlinkLoop { path });
                }
                Err(e) => return Err(io_err(path, e.into())),
            }
        }
        let real = self.resolve(path)?;
        let (fd, at) = self.at(&real.0);
        let fd =
            open_at(fd, &at, flags | OFlag::O_NOFOLLOW).map_err(|e| io_err(&real.0, e.into()))?;
        Ok((fd, real.0))
    }

    /// Reads a whole small text file at `rel` below `base`.
    pub(crate) fn read_in(&self, base: &RealPath, rel: impl AsRef<Path>) -> Result<String> {
        // O_NONBLOCK: a FIFO planted in a malformed tree must not hang discovery.
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let (fd, path) = self.open(&base.0.join(rel), flags)?;
        read_bounded(fd.into(), &path)
    }

    /// Reads a root-relative file.
    pub(crate) fn read(&self, rel: impl AsRef<Path>) -> Result<String> {
        self.read_in(&self.top(), rel)
    }

    /// Names in the directory `rel` below `base`, sorted; non-UTF-8 names are skipped.
    pub(crate) fn list_in(&self, base: &RealPath, rel: impl AsRef<Path>) -> Result<Vec<String>> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let (fd, path) = self.open(&base.0.join(rel), flags)?;
        let mut dir = Dir::from(fd).map_err(|e| io_err(&path, e.into()))?;
        list_dir(&mut dir, &path)
    }

    /// Opens the root-relative directory `rel` for reading the files right in it.
    pub(crate) fn open_dir(&self, rel: impl AsRef<Path>) -> Result<HostDir> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let (fd, path) = self.open(rel.as_ref(), flags)?;
        Ok(HostDir::new(fd, path))
    }

    /// Names in a root-relative directory; a missing directory is an empty list.
    pub(crate) fn list_optional(&self, rel: impl AsRef<Path>) -> Result<Vec<String>> {
        match self.list_in(&self.top(), rel) {
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            other => other,
        }
    }

    /// The last component of the target of the symlink `name` in `dir`: the kernel names a
    /// bound driver by the basename of `driver` (drivers/base/bus.c links it to the driver).
    pub(crate) fn link_name_in(&self, dir: &RealPath, name: &str) -> Result<String> {
        let path = dir.0.join(name);
        let (fd, at) = self.at(&path);
        let target = readlinkat(fd, at.as_ref()).map_err(|e| io_err(&path, e.into()))?;
        let target = PathBuf::from(target);
        target
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
            .ok_or_else(|| InventoryError::malformed(&path, &target.to_string_lossy()))
    }

    /// Whether `name` exists in `dir` (as anything, a dangling link included).
    pub(crate) fn exists_in(&self, dir: &RealPath, name: &str) -> bool {
        let path = dir.0.join(name);
        let (fd, at) = self.at(&path);
        fstatat(fd, at.as_ref(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }
}

/// The names of an open directory, sorted and bounded. A name that is not
/// UTF-8 is listed with its bad bytes replaced (U+FFFD) rather than left
/// out: a netdev may be renamed to any bytes but `/`, `:` and whitespace
/// (`dev_valid_name`), and a VF's second netdev dropped here would hide it
/// from the plan, which refuses a VF with several netdevs and any netdev
/// name that is not plain. Opened, such a name finds no entry: its bytes are
/// not the entry's.
pub(super) fn list_dir(dir: &mut Dir, path: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|e| io_err(path, e.into()))?;
        let name = entry.file_name().to_string_lossy();
        if name == "." || name == ".." {
            continue;
        }
        if names.len() == MAX_DIR_ENTRIES {
            return Err(InventoryError::TooManyEntries {
                path: path.to_path_buf(),
            });
        }
        names.push(name.into_owned());
    }
    names.sort();
    Ok(names)
}

pub(super) fn open_at(
    dir: Option<RawFd>,
    path: &Path,
    flags: OFlag,
) -> std::result::Result<OwnedFd, Errno> {
    let raw = openat(dir, path, flags, Mode::empty())?;
    // SAFETY: `openat` just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `openat2` with the root as `/`; magic links (`/proc/<pid>/root`, ...) are refused.
fn open_in_root(root: RawFd, path: &Path, flags: OFlag) -> std::result::Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let raw = openat2(root, path, how)?;
    // SAFETY: `openat2` just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Pushes the components of `path` onto the stack `todo` (first component on top); an
/// absolute path restarts the walk at the root.
fn push_components(todo: &mut Vec<OsString>, done: &mut PathBuf, path: &Path) {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => {
                done.clear();
                parts.clear();
            }
            Component::CurDir => {}
            Component::ParentDir => parts.push(OsString::from("..")),
            Component::Normal(n) => parts.push(n.to_os_string()),
        }
    }
    todo.extend(parts.into_iter().rev());
}

/// Reads at most `MAX_FILE_BYTES`. One read usually suffices: sysfs returns a whole
/// attribute per read (fs/sysfs/file.c), and a short read of a regular file means its end.
pub(super) fn read_bounded(mut file: File, path: &Path) -> Result<String> {
    let mut page = [0u8; 4096];
    let n = loop {
        match file.read(&mut page) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other.map_err(|e| io_err(path, e))?,
        }
    };
    let mut buf = page[..n].to_vec();
    if n == page.len() {
        file.take(MAX_FILE_BYTES + 1 - n as u64)
            .read_to_end(&mut buf)
            .map_err(|e| io_err(path, e))?;
    }
    if buf.len() as u64 > MAX_FILE_BYTES {
        return Err(InventoryError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    utf8(buf, path)
}

/// A file's bytes as text.
pub(super) fn utf8(bytes: Vec<u8>, path: &Path) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| InventoryError::NotUtf8 {
        path: path.to_path_buf(),
    })
}

pub(super) fn io_err(path: &Path, source: std::io::Error) -> InventoryError {
    InventoryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
#[path = "hostfs_tests.rs"]
mod tests;
