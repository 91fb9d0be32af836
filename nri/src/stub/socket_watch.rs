//! Waiting between dials: a restarted runtime creates its socket anew, and the
//! plugin must be back within the runtime's first seconds (NRI plugins are never
//! dialled by the runtime), whatever its backoff has grown to. The wait ends at
//! the backoff's end or as soon as a file is created in the socket's directory
//! (inotify(7): `IN_CREATE` for `bind(2)` of a unix socket, `IN_MOVED_TO` for a
//! rename onto it). A directory removed or moved away ends the watch (the kernel
//! sends `IN_IGNORED` once and nothing after); the caller then watches anew.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// An inotify watch on the directory of the runtime's socket.
pub(super) struct SocketWatch {
    fd: OwnedFd,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Woken {
    /// Something was created in the directory: dial now.
    Created,
    /// The backoff ran out.
    TimedOut,
    /// The directory was removed or moved: this watch sees nothing more.
    Gone,
}

impl SocketWatch {
    /// Watches the directory of `socket`; `None` where inotify is unavailable
    /// (the caller then sleeps out its backoff).
    pub fn new(socket: &Path) -> Option<SocketWatch> {
        let dir = socket.parent().filter(|d| !d.as_os_str().is_empty())?;
        let dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: plain syscalls; the descriptor is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just returned by inotify_init1 and is not owned elsewhere.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mask = libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;
        // SAFETY: `dir` is a NUL-terminated path that outlives the call.
        if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), dir.as_ptr(), mask) } < 0 {
            return None;
        }
        Some(SocketWatch { fd })
    }

    /// Waits up to `limit` for a file to be created in the directory.
    pub fn wait(&self, limit: Duration) -> Woken {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(limit.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one pollfd on a descriptor this struct owns.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 {
            // A signal cut the wait short: the next dial comes early, which is harmless.
            return Woken::TimedOut;
        }
        if self.drain() {
            Woken::Gone
        } else {
            Woken::Created
        }
    }

    /// Reads the pending events; true when one says the directory itself is
    /// gone. Which file was created does not matter, only that one was.
    fn drain(&self) -> bool {
        let mut buf = [0u8; 4096];
        let mut gone = false;
        loop {
            // SAFETY: reads into a buffer of the length given.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            let Ok(n) = usize::try_from(n) else {
                return gone;
            };
            if n == 0 {
                return gone;
            }
            gone |= any_gone(&buf[..n]);
        }
    }
}

/// Whether a read of `struct inotify_event`s (wd, mask, cookie, len: four
/// 32-bit fields, then `len` bytes of name) holds one for the watched
/// directory itself going away.
fn any_gone(mut events: &[u8]) -> bool {
    const HEADER: usize = 16;
    let gone = libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;
    while events.len() >= HEADER {
        let field = |at: usize| {
            u32::from_ne_bytes([events[at], events[at + 1], events[at + 2], events[at + 3]])
        };
        if field(4) & gone != 0 {
            return true;
        }
        let next = HEADER.saturating_add(field(12) as usize);
        events = events.get(next..).unwrap_or_default();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_bound_in_the_directory_ends_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nri.sock");
        let watch = SocketWatch::new(&socket).expect("inotify");
        assert_eq!(watch.wait(Duration::from_millis(20)), Woken::TimedOut);
        let path = socket.clone();
        let binder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::os::unix::net::UnixListener::bind(path).unwrap()
        });
        assert_eq!(watch.wait(Duration::from_secs(30)), Woken::Created);
        let _listener = binder.join().unwrap();
        // The events were drained: the next wait times out again.
        assert_eq!(watch.wait(Duration::from_millis(20)), Woken::TimedOut);
    }

    /// The runtime's directory removed and made again (a tmpfs remount): the
    /// old watch says so, and a new one sees the socket bound in the new one.
    #[test]
    fn a_removed_directory_ends_the_watch() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("nri");
        std::fs::create_dir(&dir).unwrap();
        let socket = dir.join("nri.sock");
        let watch = SocketWatch::new(&socket).expect("inotify");
        std::fs::remove_dir(&dir).unwrap();
        assert_eq!(watch.wait(Duration::from_secs(10)), Woken::Gone);
        std::fs::create_dir(&dir).unwrap();
        let watch = SocketWatch::new(&socket).expect("inotify");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        assert_eq!(watch.wait(Duration::from_secs(10)), Woken::Created);
    }

    #[test]
    fn no_watch_without_a_directory() {
        assert!(SocketWatch::new(Path::new("/nonexistent-dir/nri.sock")).is_none());
    }
}
