//! Waiting for the runtime's next bytes without being woken by its reads.
//!
//! A unix stream socket's readers and writers sleep on one wait queue, and
//! each time the peer consumes bytes this side sent, the kernel wakes that
//! queue for writing (`unix_write_space`, net/unix/af_unix.c). A thread
//! blocked in `recv` wakes for it, finds nothing to read and sleeps again: a
//! plugin blocked that way after its reply was woken once more per request
//! when the runtime read the reply (a switch in and out, its dearest cost on
//! a virtual machine). `poll`'s wake function drops wake-ups for events it
//! was not asked for (`pollwake`, fs/select.c), so the plugin waits there for
//! input only and then reads without blocking.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
    time::{Duration, Instant},
};

/// Waits until `fd` has bytes to read, its peer hung up, or `deadline`
/// (`None`: wait forever) passes, which is `WouldBlock` as for a socket's
/// receive timeout.
pub(super) fn wait_readable(fd: BorrowedFd<'_>, deadline: Option<Instant>) -> io::Result<()> {
    loop {
        let timeout = match deadline {
            None => -1,
            Some(at) => match at.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => poll_millis(left),
                _ => return Err(io::ErrorKind::WouldBlock.into()),
            },
        };
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call; `fd` is borrowed open.
        match unsafe { libc::poll(&mut pfd, 1, timeout) } {
            // Readable, hung up or in error: the read that follows reports which.
            1 => return Ok(()),
            0 => {} // the deadline, checked at the loop's start
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// `left` in whole milliseconds for `poll`, rounded up so that it never
/// returns before the deadline.
fn poll_millis(left: Duration) -> libc::c_int {
    let ms = left.as_nanos().div_ceil(1_000_000);
    libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
}

/// One read of what is there, without blocking: `WouldBlock` when nothing is.
pub(super) fn recv_now(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its length; `fd` is borrowed open.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_timeouts_round_up_and_saturate() {
        for (left, ms) in [
            (Duration::from_nanos(1), 1),
            (Duration::from_millis(5), 5),
            (Duration::from_micros(5_001), 6),
            (Duration::from_secs(u64::MAX), libc::c_int::MAX),
        ] {
            assert_eq!(poll_millis(left), ms, "{left:?}");
        }
    }
}
