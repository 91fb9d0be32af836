//! Finding a namespace by its bind mount anywhere in the mount table. Once a
//! pod's last process has exited (its sandbox stopped), the runtime's bind
//! mount is the namespace's only handle until the runtime removes it, and
//! runtimes keep it in different places: `/var/run/netns` (containerd's
//! default, CRI-O, `ip netns`), or under containerd's state directory
//! (`netns_mounts_under_state_dir`). Every such mount shows in mountinfo with
//! the file system type `nsfs` (proc(5)). The host's mount table is pid 1's:
//! a plugin run by the DaemonSet (`hostPID`, privileged) sees it there and
//! reaches its mount points through `/proc/1/root`; its own table, read when
//! pid 1's cannot be, shows only the bind mounts propagated into its
//! container.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::netns::{Netns, NetnsId};

/// Bound on the mount table read: a node with thousands of containers has a
/// few MiB of it at most.
const MAX_MOUNTINFO_BYTES: u64 = 16 << 20;

/// The namespace `id`, opened through an `nsfs` mount of pid 1's mount
/// table under `proc_root`, or of this process's where that is another.
pub(super) fn find(proc_root: &Path, id: NetnsId) -> Option<Netns> {
    let host = proc_root.join("1");
    let own = proc_root.join("self");
    find_in(&host, id).or_else(|| {
        let mnt = |p: &Path| std::fs::read_link(p.join("ns/mnt")).ok();
        let host_mnt = mnt(&host);
        // Pid 1's table, read already, is this process's too.
        let same = host_mnt.is_some() && host_mnt == mnt(&own);
        (!same).then(|| find_in(&own, id)).flatten()
    })
}

/// [`find`] in the mount table of the process at `proc_pid`, its mount
/// points reached through its root.
fn find_in(proc_pid: &Path, id: NetnsId) -> Option<Netns> {
    let text =
        crate::fsutil::read_file_bounded(&proc_pid.join("mountinfo"), MAX_MOUNTINFO_BYTES).ok()?;
    let root = proc_pid.join("root");
    text.split(|&b| b == b'\n')
        .filter_map(nsfs_mount_point)
        .find_map(|point| {
            let path = root.join(point.strip_prefix("/").ok()?);
            // The mount point's stat is the namespace's inode: the same test
            // as the saved identity, before anything is opened.
            let meta = std::fs::metadata(&path).ok()?;
            if meta.dev() != id.dev || meta.ino() != id.ino {
                return None;
            }
            Netns::open(&path).ok().filter(|ns| ns.id() == id)
        })
}

/// The mount point of one mountinfo line when its file system is `nsfs`:
/// the fifth field, with the kernel's octal escapes of space, tab, newline
/// and backslash undone; the type is the first field after the ` - `
/// separator, which ends the optional fields.
fn nsfs_mount_point(line: &[u8]) -> Option<PathBuf> {
    let sep = line.windows(3).position(|w| w == b" - ")?;
    let (left, right) = (&line[..sep], &line[sep + 3..]);
    if right.split(|&b| b == b' ').next()? != b"nsfs" {
        return None;
    }
    let field = left.split(|&b| b == b' ').nth(4)?;
    Some(PathBuf::from(OsString::from_vec(unescape(field))))
}

/// `\NNN` (three octal digits) to its byte, as `mangle_path` wrote it.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |n, c| n * 8 + u32::from(c - b'0')));
        match octal.and_then(|n| u8::try_from(n).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nsfs_lines_give_their_mount_points() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "812 29 0:4 net:[4026532713] /run/netns/cni-1 rw shared:391 - nsfs nsfs rw",
                Some("/run/netns/cni-1"),
            ),
            // No optional fields; a mount point with a space and a backslash.
            (
                "90 29 0:4 net:[4026532800] /var/lib/x\\040y\\134z rw - nsfs nsfs rw",
                Some("/var/lib/x y\\z"),
            ),
            // Several optional fields.
            (
                "91 29 0:4 net:[1] /a rw shared:1 master:2 propagate_from:3 - nsfs nsfs rw",
                Some("/a"),
            ),
            ("25 1 0:23 / /proc rw,nosuid - proc proc rw", None),
            // A type that only begins like it.
            ("26 1 0:24 / /b rw - nsfsx nsfs rw", None),
            ("no separator here", None),
            ("1 2 - nsfs", None),
            ("", None),
        ];
        for (line, want) in cases {
            assert_eq!(
                nsfs_mount_point(line.as_bytes()),
                want.map(PathBuf::from),
                "{line}"
            );
        }
    }

    #[test]
    fn escapes_are_undone_and_anything_else_kept() {
        for (field, want) in [
            (&br"a\040b"[..], &b"a b"[..]),
            (br"\011\012\134", b"\t\n\\"),
            (br"\04", br"\04"),
            (br"\400", br"\400"),
            (br"\9aa", br"\9aa"),
            (br"end\", br"end\"),
        ] {
            assert_eq!(
                unescape(field),
                want,
                "{:?}",
                String::from_utf8_lossy(field)
            );
        }
    }

    /// A namespace whose only handle is a bind mount outside the usual
    /// directories is found through the mount table.
    #[test]
    fn a_namespace_held_only_by_a_bind_mount_is_found() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root: it makes a namespace and a bind mount"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pod net");
        std::fs::write(&file, b"").unwrap();
        // A namespace of a process that exits once the mount holds it.
        let held = std::process::Command::new("unshare")
            .args(["-n", "sh", "-c"])
            .arg(format!(
                "mount --bind /proc/self/ns/net '{}'",
                file.display()
            ))
            .status()
            .unwrap();
        assert!(held.success());
        let id = Netns::open(&file).unwrap().id();
        let found = find(Path::new("/proc"), id).map(|ns| ns.id());
        let _ = nix::mount::umount2(&file, nix::mount::MntFlags::MNT_DETACH);
        assert_eq!(found, Some(id));
        assert!(find(Path::new("/proc"), id).is_none(), "unmounted: gone");
    }
}
