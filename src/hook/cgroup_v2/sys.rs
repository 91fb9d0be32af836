//! The `bpf(2)` commands device programs need, behind [`BpfSys`].
//!
//! Attribute layouts are the prefixes of `union bpf_attr` each command reads
//! (include/uapi/linux/bpf.h); the kernel zero-extends a shorter attribute
//! (kernel/bpf/syscall.c `bpf_check_uarg_tail_zero`), so older and newer
//! kernels take them alike.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::program::{Insn, MAX_INSNS};

// Commands (enum bpf_cmd).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_PROG_QUERY: libc::c_long = 16;

/// enum bpf_prog_type `BPF_PROG_TYPE_CGROUP_DEVICE`.
const PROG_TYPE_CGROUP_DEVICE: u32 = 15;
/// enum bpf_attach_type `BPF_CGROUP_DEVICE`.
const ATTACH_CGROUP_DEVICE: u32 = 6;
/// Several programs on one cgroup, all of which must allow (bpf.h).
pub const BPF_F_ALLOW_MULTI: u32 = 1 << 1;
/// Swap `replace_bpf_fd` for the new program in one step (Linux 5.6).
pub const BPF_F_REPLACE: u32 = 1 << 2;
/// kernel/bpf/cgroup.c `BPF_CGROUP_MAX_PROGS`: no cgroup holds more.
pub const MAX_ATTACHED: usize = 64;
/// Verifier log kept when a load fails.
const LOG_BYTES: usize = 16 * 1024;

/// An errno from one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{command}: {errno}")]
pub struct SysError {
    pub command: &'static str,
    pub errno: nix::errno::Errno,
}

/// A failed load, with what the verifier said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("load: {errno}: {log}")]
pub struct LoadError {
    pub errno: nix::errno::Errno,
    pub log: String,
}

/// The device-program side of `bpf(2)`.
pub trait BpfSys {
    /// Loads a device program; its fd.
    fn load(&mut self, insns: &[Insn], license: &CStr) -> Result<OwnedFd, LoadError>;
    /// Ids of the device programs attached to the cgroup itself (not its
    /// ancestors').
    fn query(&mut self, cgroup: BorrowedFd<'_>) -> Result<Vec<u32>, SysError>;
    /// A program by id.
    fn prog_fd(&mut self, id: u32) -> Result<OwnedFd, SysError>;
    /// Attaches with `BPF_F_ALLOW_MULTI`, replacing `replace` in the same
    /// step when given (`BPF_F_REPLACE`).
    fn attach(
        &mut self,
        cgroup: BorrowedFd<'_>,
        prog: BorrowedFd<'_>,
        replace: Option<BorrowedFd<'_>>,
    ) -> Result<(), SysError>;
    fn detach(&mut self, cgroup: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> Result<(), SysError>;
}

/// The real `bpf(2)`.
#[derive(Debug, Default)]
pub struct SysBpf;

#[repr(C)]
#[derive(Default)]
struct LoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Default)]
struct GetFdAttr {
    prog_id: u32,
    next_id: u32,
    open_flags: u32,
}

/// # Safety
/// `attr` must be the layout `cmd` reads, and every pointer in it valid for
/// the kernel to read or write for the call's duration.
unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> Result<libc::c_long, nix::errno::Errno> {
    let size = std::mem::size_of::<T>() as libc::c_uint;
    // SAFETY: per this function's contract.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size) };
    if rc < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(rc)
    }
}

fn fd(raw: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel returned a new fd that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(raw as i32) }
}

fn raw(fd: BorrowedFd<'_>) -> u32 {
    fd.as_raw_fd() as u32
}

impl SysBpf {
    fn load_once(
        insns: &[Insn],
        license: &CStr,
        log: Option<&mut [u8]>,
    ) -> Result<OwnedFd, nix::errno::Errno> {
        let mut attr = LoadAttr {
            prog_type: PROG_TYPE_CGROUP_DEVICE,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            expected_attach_type: ATTACH_CGROUP_DEVICE,
            ..LoadAttr::default()
        };
        attr.prog_name[..7].copy_from_slice(b"devgate");
        if let Some(log) = log {
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
        }
        // SAFETY: LoadAttr is the BPF_PROG_LOAD prefix; insns, license and
        // log outlive the call.
        unsafe { bpf(BPF_PROG_LOAD, &mut attr) }.map(fd)
    }
}

impl BpfSys for SysBpf {
    fn load(&mut self, insns: &[Insn], license: &CStr) -> Result<OwnedFd, LoadError> {
        if insns.is_empty() || insns.len() > MAX_INSNS {
            return Err(LoadError {
                errno: nix::errno::Errno::E2BIG,
                log: format!("{} instructions", insns.len()),
            });
        }
        // Kernels before 5.11 charge the program to RLIMIT_MEMLOCK.
        match super::memlock::raise(&mut super::memlock::SysMemlock) {
            Ok(raised) => tracing::debug!(?raised, "rlimit_memlock before the program load"),
            Err(e) => {
                tracing::warn!(error = %nri::ErrorChain(&e), "rlimit_memlock not raised: the load may fail before linux 5.11")
            }
        }
        let errno = match Self::load_once(insns, license, None) {
            Ok(fd) => return Ok(fd),
            Err(e) => e,
        };
        // Again with the verifier's log, so the error says why.
        let mut log = vec![0u8; LOG_BYTES];
        match Self::load_once(insns, license, Some(&mut log)) {
            Ok(fd) => Ok(fd),
            Err(_) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                let tail: String = text
                    .trim()
                    .lines()
                    .rev()
                    .take(4)
                    .collect::<Vec<_>>()
                    .join(" / ");
                Err(LoadError { errno, log: tail })
            }
        }
    }

    fn query(&mut self, cgroup: BorrowedFd<'_>) -> Result<Vec<u32>, SysError> {
        let mut ids = [0u32; MAX_ATTACHED];
        let mut attr = QueryAttr {
            target_fd: raw(cgroup),
            attach_type: ATTACH_CGROUP_DEVICE,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: MAX_ATTACHED as u32,
            ..QueryAttr::default()
        };
        // SAFETY: QueryAttr is the BPF_PROG_QUERY prefix; ids holds prog_cnt.
        unsafe { bpf(BPF_PROG_QUERY, &mut attr) }.map_err(|errno| SysError {
            command: "query",
            errno,
        })?;
        let n = (attr.prog_cnt as usize).min(MAX_ATTACHED);
        Ok(ids[..n].to_vec())
    }

    fn prog_fd(&mut self, id: u32) -> Result<OwnedFd, SysError> {
        let mut attr = GetFdAttr {
            prog_id: id,
            ..GetFdAttr::default()
        };
        // SAFETY: GetFdAttr is the BPF_PROG_GET_FD_BY_ID prefix.
        unsafe { bpf(BPF_PROG_GET_FD_BY_ID, &mut attr) }
            .map(fd)
            .map_err(|errno| SysError {
                command: "get program by id",
                errno,
            })
    }

    fn attach(
        &mut self,
        cgroup: BorrowedFd<'_>,
        prog: BorrowedFd<'_>,
        replace: Option<BorrowedFd<'_>>,
    ) -> Result<(), SysError> {
        let mut attr = AttachAttr {
            target_fd: raw(cgroup),
            attach_bpf_fd: raw(prog),
            attach_type: ATTACH_CGROUP_DEVICE,
            attach_flags: BPF_F_ALLOW_MULTI,
            ..AttachAttr::default()
        };
        if let Some(old) = replace {
            attr.attach_flags |= BPF_F_REPLACE;
            attr.replace_bpf_fd = raw(old);
        }
        // SAFETY: AttachAttr is the BPF_PROG_ATTACH prefix.
        unsafe { bpf(BPF_PROG_ATTACH, &mut attr) }
            .map(|_| ())
            .map_err(|errno| SysError {
                command: if replace.is_some() {
                    "attach with replace"
                } else {
                    "attach"
                },
                errno,
            })
    }

    fn detach(&mut self, cgroup: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> Result<(), SysError> {
        let mut attr = AttachAttr {
            target_fd: raw(cgroup),
            attach_bpf_fd: raw(prog),
            attach_type: ATTACH_CGROUP_DEVICE,
            ..AttachAttr::default()
        };
        // SAFETY: AttachAttr is the BPF_PROG_DETACH prefix.
        unsafe { bpf(BPF_PROG_DETACH, &mut attr) }
            .map(|_| ())
            .map_err(|errno| SysError {
                command: "detach",
                errno,
            })
    }
}
