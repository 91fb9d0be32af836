//! `RLIMIT_MEMLOCK` before a device program is loaded.
//!
//! Before Linux 5.11 the kernel charges a BPF program's pages to the loading
//! user's locked memory and refuses the load with EPERM past the limit
//! (kernel/bpf/syscall.c `bpf_prog_charge_memlock`; 5.11 moved the charge to
//! the memory cgroup). Runtimes and systemd units often start hooks with the
//! 64 KiB or 8 MiB default, so the hook lifts its own soft limit first: to
//! unlimited where it may (CAP_SYS_RESOURCE), else to the hard limit, as runc
//! and libbpf-based loaders do. Only the short-lived hook process is affected.

use nix::errno::Errno;

/// `RLIM_INFINITY`.
pub const UNLIMITED: u64 = libc::RLIM_INFINITY;

#[derive(Debug, thiserror::Error)]
pub enum MemlockError {
    #[error("read rlimit_memlock: {errno}")]
    Get { errno: Errno },
    #[error("set rlimit_memlock to soft {soft} hard {hard}: {errno}")]
    Set { soft: u64, hard: u64, errno: Errno },
}

/// What [`raise`] left in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raised {
    /// Already unlimited, or the soft limit already at an unraisable hard one.
    Unchanged,
    Unlimited,
    /// The soft limit lifted to the hard one, in bytes.
    ToHard(u64),
}

/// The process's `RLIMIT_MEMLOCK` (getrlimit(2)).
pub trait MemlockLimit {
    /// (soft, hard) in bytes.
    fn get(&mut self) -> Result<(u64, u64), Errno>;
    fn set(&mut self, soft: u64, hard: u64) -> Result<(), Errno>;
}

/// The real limit of this process.
#[derive(Debug, Default)]
pub struct SysMemlock;

impl MemlockLimit for SysMemlock {
    fn get(&mut self) -> Result<(u64, u64), Errno> {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid rlimit for the kernel to fill.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
        if rc != 0 {
            return Err(Errno::last());
        }
        Ok((lim.rlim_cur, lim.rlim_max))
    }

    fn set(&mut self, soft: u64, hard: u64) -> Result<(), Errno> {
        let lim = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        // SAFETY: `lim` is a valid rlimit that the kernel only reads.
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
        if rc != 0 {
            return Err(Errno::last());
        }
        Ok(())
    }
}

/// Lifts the soft limit: to unlimited when permitted, else to the hard one.
pub fn raise(limit: &mut dyn MemlockLimit) -> Result<Raised, MemlockError> {
    let (soft, hard) = limit.get().map_err(|errno| MemlockError::Get { errno })?;
    if soft == UNLIMITED {
        return Ok(Raised::Unchanged);
    }
    match limit.set(UNLIMITED, UNLIMITED) {
        Ok(()) => return Ok(Raised::Unlimited),
        // Raising the hard limit needs CAP_SYS_RESOURCE (setrlimit(2)).
        Err(Errno::EPERM) => {}
        Err(errno) => {
            return Err(MemlockError::Set {
                soft: UNLIMITED,
                hard: UNLIMITED,
                errno,
            })
        }
    }
    if soft >= hard {
        return Ok(Raised::Unchanged);
    }
    limit.set(hard, hard).map_err(|errno| MemlockError::Set {
        soft: hard,
        hard,
        errno,
    })?;
    Ok(Raised::ToHard(hard))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit that refuses to raise the hard one unless `privileged`.
    struct Fake {
        soft: u64,
        hard: u64,
        privileged: bool,
        sets: usize,
    }

    impl MemlockLimit for Fake {
        fn get(&mut self) -> Result<(u64, u64), Errno> {
            Ok((self.soft, self.hard))
        }

        fn set(&mut self, soft: u64, hard: u64) -> Result<(), Errno> {
            self.sets += 1;
            if soft > hard || (hard > self.hard && !self.privileged) {
                return Err(if soft > hard {
                    Errno::EINVAL
                } else {
                    Errno::EPERM
                });
            }
            (self.soft, self.hard) = (soft, hard);
            Ok(())
        }
    }

    fn fake(soft: u64, hard: u64, privileged: bool) -> Fake {
        Fake {
            soft,
            hard,
            privileged,
            sets: 0,
        }
    }

    #[test]
    fn privileged_goes_unlimited() {
        let mut l = fake(64 << 10, 64 << 10, true);
        assert_eq!(raise(&mut l).unwrap(), Raised::Unlimited);
        assert_eq!((l.soft, l.hard), (UNLIMITED, UNLIMITED));
    }

    #[test]
    fn unprivileged_lifts_the_soft_limit_to_the_hard_one() {
        let mut l = fake(64 << 10, 8 << 20, false);
        assert_eq!(raise(&mut l).unwrap(), Raised::ToHard(8 << 20));
        assert_eq!((l.soft, l.hard), (8 << 20, 8 << 20));
        // Nothing left to lift.
        let mut l = fake(8 << 20, 8 << 20, false);
        assert_eq!(raise(&mut l).unwrap(), Raised::Unchanged);
        assert_eq!((l.soft, l.hard), (8 << 20, 8 << 20));
    }

    #[test]
    fn unlimited_is_left_alone() {
        let mut l = fake(UNLIMITED, UNLIMITED, false);
        assert_eq!(raise(&mut l).unwrap(), Raised::Unchanged);
        assert_eq!(l.sets, 0);
    }

    #[test]
    fn the_real_limit_can_be_read_and_kept() {
        let mut sys = SysMemlock;
        let (soft, hard) = sys.get().unwrap();
        assert!(soft <= hard);
        sys.set(soft, hard).unwrap();
        assert_eq!(sys.get().unwrap(), (soft, hard));
    }
}
