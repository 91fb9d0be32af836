//! Moving a child into cgroups between fork and exec, shared by the test
//! files that need it (each includes this file with `#[path]`).

use std::ffi::CString;

/// Moves the calling process into each `cgroup.procs` file of `procs`
/// (writing 0 names the writer, cgroups(7)); runs between fork and exec, so
/// only raw calls on prepared strings.
pub fn join(procs: &[CString]) -> std::io::Result<()> {
    for p in procs {
        // SAFETY: p is a valid C string; the fd is closed below.
        let fd = unsafe { libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: writes one byte from a static buffer to fd.
        let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        if n != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
