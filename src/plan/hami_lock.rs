//! HAMi-core's shared lock directory on the host, which the plan binds
//! read-write into every HAMi-core container. runc's bind follows links in
//! its source, so a directory any user could make first, or replace, would
//! let that user hand containers a host directory of their choice: the path
//! must hold no link, the directory and every one above it must be root's,
//! none of them writable by others unless sticky (as `/tmp` is), where only
//! root could move it away. The path is walked one directory at a time from
//! descriptors opened without following links, and what is missing is made
//! there, so no link put in meanwhile is ever followed by a `mkdir` or a
//! `chmod` of root's.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode};

/// Any container user makes its lock file there; sticky, so that none
/// removes another's.
const MODE: u32 = 0o1777;
/// A directory made above it.
const PARENT_MODE: u32 = 0o755;

#[derive(Debug, thiserror::Error)]
#[error("hami.host_lock_dir {path}: {reason}")]
pub struct HamiLockError {
    pub path: PathBuf,
    pub reason: String,
}

/// Makes `path` where it is missing (root's, mode 1777, its missing parents
/// root's, mode 0755) and checks that no link is on it, that it and every
/// directory above it are root's and writable by no one else but where
/// sticky, and that it is mode 1777. A directory that was there is never
/// changed: one of another mode (`/etc`, say) is refused.
pub fn ensure_hami_lock_dir(path: &Path) -> Result<(), HamiLockError> {
    let err = |at: &Path, reason: String| HamiLockError {
        path: path.to_path_buf(),
        reason: if at == path {
            reason
        } else {
            format!("{}: {reason}", at.display())
        },
    };
    let mut names = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(name) => names.push(name),
            _ => return Err(err(path, "must be an absolute path without ..".into())),
        }
    }
    if !path.is_absolute() {
        return Err(err(path, "must be an absolute path without ..".into()));
    }
    let mut at = PathBuf::from("/");
    let mut dir = open(None, OsStr::new("/")).map_err(|e| err(&at, format!("open: {e}")))?;
    check(&dir, false).map_err(|r| err(&at, r))?;
    for (i, name) in names.iter().enumerate() {
        at.push(name);
        let leaf = i + 1 == names.len();
        let next = open_or_make(&dir, name, leaf).map_err(|r| err(&at, r))?;
        check(&next, leaf).map_err(|r| err(&at, r))?;
        dir = next;
    }
    Ok(())
}

/// `name` under `dir`, made where missing.
fn open_or_make(dir: &OwnedFd, name: &OsStr, leaf: bool) -> Result<OwnedFd, String> {
    let mut made = false;
    // Twice at most: made by another between the open and the mkdir.
    for _ in 0..2 {
        match open(Some(dir), name) {
            Ok(fd) => {
                if made {
                    // The umask cut the mode; set on the directory opened,
                    // which is root's (checked next, before anything else).
                    if leaf {
                        let st = fstat(fd.as_raw_fd()).map_err(|e| format!("stat: {e}"))?;
                        if st.st_uid == 0 {
                            fchmod(fd.as_raw_fd(), Mode::from_bits_retain(MODE))
                                .map_err(|e| format!("set its mode: {e}"))?;
                        }
                    }
                }
                return Ok(fd);
            }
            Err(Errno::ENOENT) if !made => {
                let mode = if leaf { MODE } else { PARENT_MODE };
                match mkdirat(Some(dir.as_raw_fd()), name, Mode::from_bits_retain(mode)) {
                    Ok(()) => made = true,
                    Err(Errno::EEXIST) => {}
                    Err(e) => return Err(format!("create it: {e}")),
                }
            }
            // O_NOFOLLOW with O_DIRECTORY answers a link ENOTDIR or ELOOP.
            Err(Errno::ELOOP | Errno::ENOTDIR) if is_link(dir, name) => {
                return Err("is a symbolic link: give the path it leads to".into())
            }
            Err(Errno::ENOTDIR) => return Err("is not a directory".into()),
            Err(e) => return Err(format!("open: {e}")),
        }
    }
    Err("open: made and gone again".into())
}

/// Root's, writable by others only where sticky; the lock directory itself
/// mode 1777, as made.
fn check(dir: &OwnedFd, leaf: bool) -> Result<(), String> {
    let st = fstat(dir.as_raw_fd()).map_err(|e| format!("stat: {e}"))?;
    if st.st_uid != 0 {
        return Err(format!("is owned by uid {}, not root", st.st_uid));
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(format!(
            "is writable by others (mode {mode:o}) and not sticky"
        ));
    }
    if leaf && mode & MODE != MODE {
        return Err(format!(
            "has mode {mode:o}, not {MODE:o}: containers of any user make their lock files there"
        ));
    }
    Ok(())
}

fn is_link(dir: &OwnedFd, name: &OsStr) -> bool {
    nix::sys::stat::fstatat(
        Some(dir.as_raw_fd()),
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
}

/// A directory, never through a link in its last part (`O_NOFOLLOW`:
/// ELOOP), relative to `dir`.
fn open(dir: Option<&OwnedFd>, name: &OsStr) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir.map(|d| d.as_raw_fd()), name, flags, Mode::empty())?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root: it makes files of other owners"
        );
    }

    #[test]
    fn a_missing_directory_is_made_roots_and_sticky() {
        root();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("devgate/vgpulock");
        ensure_hami_lock_dir(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_dir());
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, MODE));
        // Again: the same directory, untouched.
        ensure_hami_lock_dir(&path).unwrap();
    }

    #[test]
    fn what_another_user_could_have_made_is_refused() {
        root();
        let dir = tempfile::tempdir().unwrap();
        // A link another user made, to a directory of their choosing.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/etc", &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let e = ensure_hami_lock_dir(&link).unwrap_err().to_string();
        assert!(
            e.contains("is a symbolic link: give the path it leads to"),
            "{e}"
        );
        let target = dir.path().join("theirs");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::chown(&target, Some(65534), Some(65534)).unwrap();
        let e = ensure_hami_lock_dir(&target).unwrap_err().to_string();
        assert!(e.contains("owned by uid 65534, not root"), "{e}");
        // Links are refused whoever made them and wherever they lead, a
        // link above the directory too: what they lead to could be another
        // user's link further on.
        let mine = dir.path().join("mine");
        ensure_hami_lock_dir(&mine.join("vgpulock")).unwrap();
        let via = dir.path().join("via");
        std::os::unix::fs::symlink(&mine, &via).unwrap();
        for path in [via.clone(), via.join("vgpulock")] {
            let e = ensure_hami_lock_dir(&path).unwrap_err().to_string();
            assert!(e.contains("via: is a symbolic link"), "{e}");
        }
        // Nothing was made through the link: the walk stopped at it.
        let e = ensure_hami_lock_dir(&via.join("new"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        assert!(!mine.join("new").exists());
        // A parent others may write to, not sticky: they could move it away.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_hami_lock_dir(&open.join("vgpulock")).unwrap_err();
        assert!(
            e.to_string()
                .contains("is writable by others (mode 777) and not sticky"),
            "{e}"
        );
        // A file where the directory should be.
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = ensure_hami_lock_dir(&file).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }

    /// A directory that was there is never changed, whatever it is: one of
    /// root's with another mode, such as `/etc` given by mistake or a lock
    /// directory a tmpfiles rule made 0755, is refused, naming its mode.
    #[test]
    fn a_directory_of_another_mode_is_refused_and_left_as_it_is() {
        root();
        let e = ensure_hami_lock_dir(Path::new("/etc"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has mode 755, not 1777"), "{e}");
        assert_eq!(std::fs::metadata("/etc").unwrap().mode() & 0o7777, 0o755);
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("vgpulock");
        std::fs::create_dir(&made).unwrap();
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure_hami_lock_dir(&made).unwrap_err().to_string();
        assert!(e.contains("has mode 755, not 1777"), "{e}");
        assert_eq!(std::fs::metadata(&made).unwrap().mode() & 0o7777, 0o755);
        for bad in ["relative/vgpulock", "/run/../etc"] {
            let e = ensure_hami_lock_dir(Path::new(bad))
                .unwrap_err()
                .to_string();
            assert!(e.contains("must be an absolute path without .."), "{e}");
        }
    }
}
