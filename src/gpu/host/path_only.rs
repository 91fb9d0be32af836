//! Descriptors opened with `O_PATH`, which name a device node without
//! opening it: the kernel neither calls the driver's open nor checks the
//! device cgroup for them (open(2), `do_dentry_open` in fs/open.c), and no
//! read, write or ioctl goes through one. Any pod can hold one for a GPU's
//! node (a node it made with `mknod`, or one its image carries), so such a
//! descriptor is no use of the GPU and must not keep it from being handed on.

use std::ffi::CStr;
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Where a descriptor's `fdinfo` lies from its fd directory: procfs has
/// `<pid>/fdinfo` beside `<pid>/fd`, and `<pid>/task/<tid>/fdinfo` beside
/// each thread's.
const FDINFO: &[u8] = b"../fdinfo/";

/// Whether the kernel says descriptor `name` of the fd directory `dir` was
/// opened with `O_PATH` (the `flags:` line of its fdinfo, octal; proc(5)).
/// Anything else, a file that cannot be read among them (a tree without
/// fdinfo, the descriptor closed meanwhile), counts as a real open: never
/// is a holder left out on a guess.
pub(super) fn opened_as_path(dir: BorrowedFd<'_>, name: &CStr) -> bool {
    let mut path = [0u8; 48];
    let name = name.to_bytes();
    let len = FDINFO.len() + name.len();
    if len >= path.len() {
        return false;
    }
    path[..FDINFO.len()].copy_from_slice(FDINFO);
    path[FDINFO.len()..len].copy_from_slice(name);
    let Ok(path) = CStr::from_bytes_until_nul(&path) else {
        return false;
    };
    // SAFETY: a NUL-terminated path relative to an open directory.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: a descriptor just opened and owned by nothing else.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    // `pos:` then `flags:` lead the file; what follows is not read.
    let mut buf = [0u8; 128];
    let Ok(n) = file.read(&mut buf) else {
        return false;
    };
    flags_of(&buf[..n]).is_some_and(|flags| flags & libc::O_PATH as u32 != 0)
}

/// The `flags:` value of fdinfo text, `None` where there is none to read.
pub(super) fn flags_of(text: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(text).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("flags:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_line_is_read_in_octal() {
        let table: [(&[u8], Option<u32>); 6] = [
            (
                b"pos:\t0\nflags:\t010000000\nmnt_id:\t22\n",
                Some(0o10000000),
            ),
            (b"pos:\t0\nflags:\t02100002\nmnt_id:\t22\n", Some(0o2100002)),
            (b"pos:\t0\n", None),
            (b"pos:\t0\nflags:\t0129\n", None),
            (b"pos:\t0\nflags:\t077777777777\n", None),
            (b"\xff\xfe", None),
        ];
        for (text, want) in table {
            assert_eq!(flags_of(text), want, "{text:?}");
        }
    }
}
