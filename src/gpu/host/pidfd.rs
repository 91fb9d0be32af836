//! Signalling a process only while its pid still names it: through a pidfd
//! (pidfd_open(2), Linux 5.3), opened before the process's start time is
//! checked, so the signal reaches the process that was checked or nobody.
//!
//! A pid number is freed when its process is reaped and may be reused at
//! once (kernel/pid.c `free_pid`). A `kill(2)` after a start-time check can
//! so hit a new process that took the pid in between; a pidfd keeps naming
//! the process it was opened for: `pidfd_send_signal(2)` to one that is gone
//! fails with ESRCH. If the start time read after the open is the one
//! pinned, the pidfd was opened for that process (a pid goes to a new
//! process only after the old one is gone, and the old one never returns).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// What a checked signal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Sent to the pinned process.
    Sent,
    /// The pid no longer names it (gone, a zombie, or reused).
    Gone,
}

/// Sends `signal` to `pid` if `same()` (the start-time check) holds once the
/// process is pinned. Without pidfds (an older kernel, or a seccomp filter)
/// it falls back to the check, then `kill(2)`, which leaves the window this
/// closes.
pub fn signal_pinned(
    pid: u32,
    signal: libc::c_int,
    same: impl FnOnce() -> io::Result<bool>,
) -> io::Result<Sent> {
    let raw =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let pidfd = match pidfd_open(raw) {
        Ok(fd) => Some(fd),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(Sent::Gone),
        // No pidfds (before 5.3), or a seccomp filter refusing the call
        // (pidfd_open(2) itself never answers EPERM).
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => None,
        Err(e) => return Err(e),
    };
    if !same()? {
        return Ok(Sent::Gone);
    }
    // SAFETY: kill(2) takes any pid and signal number.
    let kill = || cvt(unsafe { libc::kill(raw, signal) });
    let sent = match &pidfd {
        Some(fd) => match pidfd_send_signal(fd, signal) {
            // A filter that lets pidfd_open(2) through and not this (its
            // EPERM is also kill's own answer where the signal is not
            // allowed): the check above was just made, as without pidfds.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                tracing::debug!(pid, error = %e, "pidfd_send_signal refused: kill after the check");
                kill()
            }
            other => other,
        },
        None => kill(),
    };
    match sent {
        Ok(()) => Ok(Sent::Sent),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(Sent::Gone),
        Err(e) => Err(e),
    }
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags (none), and returns a new
    // descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: a descriptor the kernel just returned and nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidfd_send_signal(pidfd: &OwnedFd, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: pidfd_send_signal(2) with a pidfd, a signal number, no siginfo
    // (the kernel fills it as kill(2) does) and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    cvt(if rc < 0 { -1 } else { 0 })
}

fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    fn sleeper() -> std::process::Child {
        Command::new("sleep").arg("30").spawn().unwrap()
    }

    #[test]
    fn a_process_that_is_still_itself_gets_the_signal() {
        let mut child = sleeper();
        let sent = signal_pinned(child.id(), libc::SIGTERM, || Ok(true)).unwrap();
        assert_eq!(sent, Sent::Sent);
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn a_pid_that_names_another_process_gets_nothing() {
        let mut child = sleeper();
        // The check says the pid names another process now.
        let sent = signal_pinned(child.id(), libc::SIGKILL, || Ok(false)).unwrap();
        assert_eq!(sent, Sent::Gone);
        assert_eq!(child.try_wait().unwrap(), None, "still running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_process_that_died_after_the_check_is_gone_not_an_error() {
        let mut child = sleeper();
        let pid = child.id();
        // It dies and is reaped between the pidfd's open and the signal: the
        // pidfd names the dead process, never whatever takes the pid next.
        let sent = signal_pinned(pid, libc::SIGTERM, || {
            child.kill()?;
            child.wait()?;
            Ok(true)
        })
        .unwrap();
        assert_eq!(sent, Sent::Gone);
        let unused = signal_pinned(u32::MAX / 2, libc::SIGTERM, || Ok(true));
        assert_eq!(unused.unwrap(), Sent::Gone);
    }
}
