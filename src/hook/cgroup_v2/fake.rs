//! A [`BpfSys`] that keeps the attached programs in memory, for tests.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::errno::Errno;

use super::program::Insn;
use super::sys::{BpfSys, LoadError, SysError};

#[derive(Default)]
pub struct FakeBpf {
    /// Programs loaded, by id (ids start at 100).
    pub programs: BTreeMap<u32, Vec<Insn>>,
    /// Ids attached to the cgroup, in attach order.
    pub attached: Vec<u32>,
    /// The kernel predates BPF_F_REPLACE.
    pub no_replace: bool,
    /// A command that fails with EPERM: "load", "query", "attach", "detach".
    pub fail: Option<&'static str>,
    /// Commands run, in order.
    pub calls: Vec<String>,
    /// Which fake fd stands for which program.
    pub fds: BTreeMap<RawFd, u32>,
}

impl FakeBpf {
    /// A cgroup with programs `ids` attached (their code unknown).
    pub fn with_attached(ids: &[u32]) -> FakeBpf {
        FakeBpf {
            attached: ids.to_vec(),
            ..FakeBpf::default()
        }
    }

    fn fd_for(&mut self, id: u32) -> OwnedFd {
        let fd: OwnedFd = std::fs::File::open("/dev/null")
            .expect("open /dev/null")
            .into();
        self.fds.insert(fd.as_raw_fd(), id);
        fd
    }

    fn id(&self, fd: BorrowedFd<'_>) -> u32 {
        self.fds.get(&fd.as_raw_fd()).copied().unwrap_or(0)
    }

    fn check(&mut self, command: &'static str) -> Result<(), SysError> {
        self.calls.push(command.to_string());
        if self.fail == Some(command) {
            return Err(SysError {
                command,
                errno: Errno::EPERM,
            });
        }
        Ok(())
    }

    /// The code of the only program attached.
    pub fn only_program(&self) -> Option<&Vec<Insn>> {
        match self.attached.as_slice() {
            [id] => self.programs.get(id),
            _ => None,
        }
    }
}

impl BpfSys for FakeBpf {
    fn load(&mut self, insns: &[Insn], _license: &CStr) -> Result<OwnedFd, LoadError> {
        self.calls.push("load".to_string());
        if self.fail == Some("load") {
            return Err(LoadError {
                errno: Errno::EACCES,
                log: "fake verifier".to_string(),
            });
        }
        let id = 100 + self.programs.len() as u32;
        self.programs.insert(id, insns.to_vec());
        let fd = self.fd_for(id);
        Ok(fd)
    }

    fn query(&mut self, _cgroup: BorrowedFd<'_>) -> Result<Vec<u32>, SysError> {
        self.check("query")?;
        Ok(self.attached.clone())
    }

    fn prog_fd(&mut self, id: u32) -> Result<OwnedFd, SysError> {
        self.check("prog_fd")?;
        Ok(self.fd_for(id))
    }

    fn attach(
        &mut self,
        _cgroup: BorrowedFd<'_>,
        prog: BorrowedFd<'_>,
        replace: Option<BorrowedFd<'_>>,
    ) -> Result<(), SysError> {
        let (new, old) = (self.id(prog), replace.map(|r| self.id(r)));
        match old {
            Some(old) => {
                self.check("replace")?;
                if self.no_replace {
                    return Err(SysError {
                        command: "attach with replace",
                        errno: Errno::EINVAL,
                    });
                }
                let at = self.attached.iter().position(|&a| a == old);
                let at = at.ok_or(SysError {
                    command: "attach with replace",
                    errno: Errno::ENOENT,
                })?;
                self.attached[at] = new;
            }
            None => {
                self.check("attach")?;
                self.attached.push(new);
            }
        }
        Ok(())
    }

    fn detach(&mut self, _cgroup: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> Result<(), SysError> {
        self.check("detach")?;
        let id = self.id(prog);
        self.attached.retain(|&a| a != id);
        Ok(())
    }
}
