//! Waiting between dials: a restarted runtime creates its socket anew, and the
//! plugin must be back within the runtime's first seconds (NRI plugins are never
//! dialled by the runtime), whatever its backoff has grown to. The wait ends at
//! the backoff's end or as soon as a file is created in the socket's directory
//! (inotify(7): `IN_CREATE` for `bind(2)` of a unix socket, `IN_MOVED_TO` for a
//! rename onto it).

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
        let mask = libc::IN_CREATE | libc::IN_MOVED_TO;
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
        self.drain();
        Woken::Created
    }

    /// Reads the pending events; their content does not matter, only that the
    /// directory changed.
    fn drain(&self) {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into a buffer of the length given.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

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
        let start = Instant::now();
        assert_eq!(watch.wait(Duration::from_secs(30)), Woken::Created);
        assert!(start.elapsed() < Duration::from_secs(10));
        let _listener = binder.join().unwrap();
        // The events were drained: the next wait times out again.
        assert_eq!(watch.wait(Duration::from_millis(20)), Woken::TimedOut);
    }

    #[test]
    fn no_watch_without_a_directory() {
        assert!(SocketWatch::new(Path::new("/nonexistent-dir/nri.sock")).is_none());
    }
}
