//! Device access on cgroup v2: the device controller there is a
//! BPF_PROG_TYPE_CGROUP_DEVICE program the runtime attached to the container's
//! cgroup with `BPF_F_ALLOW_MULTI`. Every attached program must allow an access
//! (kernel/bpf/cgroup.c `__cgroup_bpf_check_dev_permission` runs the effective
//! array with `bpf_prog_run_array_cg`, which ANDs the verdicts), so a second
//! program can only narrow access. The hook therefore rebuilds the runtime's
//! program from the rules it was made of (the bundle's `config.json`
//! `linux.resources.devices` and runc's defaults, [`rules`]), adds the planned
//! nodes, and swaps the new program in for the old one.
//!
//! The swap is one `BPF_PROG_ATTACH` with `BPF_F_REPLACE` when exactly one
//! program is attached (Linux 5.6). Otherwise, or when the kernel rejects
//! `BPF_F_REPLACE` with EINVAL, the new program is attached next to the old
//! ones and then they are detached: while both are attached the intersection
//! applies, so access never widens past the new rules at any moment.

pub mod memlock;
pub mod program;
pub mod rules;
pub mod sys;

#[cfg(test)]
pub(crate) mod fake;

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use crate::plan::{DeviceKind, DeviceNode};

pub use program::{generate, Insn, ProgramError};
pub use rules::{Access, DevType, Rule, Ruleset, Spec};
pub use sys::{BpfSys, LoadError, SysBpf, SysError};

/// The license the program is loaded under (the kernel records it; device
/// programs call no GPL-only helpers).
pub const LICENSE: &std::ffi::CStr = c"Apache-2.0";

#[derive(Debug, thiserror::Error)]
pub enum CgroupV2Error {
    #[error("linux.resources.devices[{index}]: {reason}")]
    SpecRule { index: usize, reason: String },
    #[error(
        "{count} device rules or devices in the spec (at most {})",
        rules::MAX_SPEC_RULES
    )]
    TooManyRules { count: usize },
    #[error(
        "rule {rule} would punch a hole into a wildcard rule, which the device controller refuses"
    )]
    Hole { rule: String },
    #[error(
        "rule {rule} is of type a with a major or minor: all devices to runc, only those numbers to crun; refused rather than guessed"
    )]
    AllWithNumbers { rule: String },
    #[error(
        "rule {rule} is of type a without full rwm access: all access to runc, only that access to crun; refused rather than guessed"
    )]
    AllPartial { rule: String },
    #[error(
        "rule {rule} allows a device another rule allows with an access neither holds: one access to runc, each alone to crun; refused rather than guessed"
    )]
    SplitAccess { rule: String },
    #[error(transparent)]
    Program(#[from] ProgramError),
    #[error("cgroup path {path:?} is not absolute and plain")]
    Path { path: String },
    #[error("open cgroup {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("device program for {path}")]
    Load {
        path: PathBuf,
        #[source]
        source: LoadError,
    },
    #[error("device programs of {path}")]
    Sys {
        path: PathBuf,
        #[source]
        source: SysError,
    },
}

/// What [`allow`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replaced {
    pub cgroup: PathBuf,
    /// Programs that were attached before, now detached or replaced.
    pub old: usize,
    /// Whether `BPF_F_REPLACE` did it in one step.
    pub in_place: bool,
}

/// The rule for a planned node: read and write, as with cgroup v1 (the hook
/// makes the node itself, from outside the container).
pub fn node_rule(node: &DeviceNode) -> Rule {
    let kind = match node.kind {
        DeviceKind::Char => DevType::Char,
    };
    Rule {
        allow: true,
        kind,
        major: Some(node.major),
        minor: Some(node.minor),
        access: Access(Access::READ | Access::WRITE),
    }
}

/// The rule set the container's new program enforces: the runtime's, then
/// the planned nodes.
pub fn ruleset(spec: &Spec, nodes: &[DeviceNode]) -> Result<Ruleset, CgroupV2Error> {
    let mut set = Ruleset::from_rules(&spec.runtime_rules()?)?;
    for node in nodes {
        set.apply(&node_rule(node))?;
    }
    Ok(set)
}

/// The directory of cgroup `rel` (the `0::` path of `/proc/<pid>/cgroup`)
/// under the cgroup2 mount `v2_root`.
pub fn cgroup_dir(v2_root: &Path, rel: &str) -> Result<PathBuf, CgroupV2Error> {
    let p = Path::new(rel);
    let plain = p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !plain {
        return Err(CgroupV2Error::Path {
            path: rel.chars().take(256).collect(),
        });
    }
    Ok(v2_root.join(p.strip_prefix("/").unwrap_or(p)))
}

/// Gives the container's cgroups from `own` (its own cgroup, the first path
/// component naming it) down to `leaf` (where its init is) the device program
/// for the bundle's rules (`spec`) plus `nodes`, in place of the programs
/// attached at each of those levels: the kernel runs every program attached
/// on the way to the leaf, and all must allow. crun with the systemd driver
/// puts the program on the scope and the init in `<scope>/container`; runc
/// puts it on the leaf. Where no level has one, the leaf gets it.
pub fn allow_in(
    sys: &mut dyn BpfSys,
    own: &Path,
    leaf: &Path,
    spec: &Spec,
    nodes: &[DeviceNode],
) -> Result<Vec<Replaced>, CgroupV2Error> {
    let below = leaf.strip_prefix(own).map_err(|_| CgroupV2Error::Path {
        path: leaf.display().to_string().chars().take(256).collect(),
    })?;
    let mut levels = vec![own.to_path_buf()];
    for c in below.components() {
        let next = levels[levels.len() - 1].join(c);
        levels.push(next);
    }
    let mut with_programs = Vec::new();
    for dir in &levels {
        let cgroup = File::open(dir).map_err(|source| CgroupV2Error::Open {
            path: dir.clone(),
            source,
        })?;
        let ids = sys
            .query(cgroup.as_fd())
            .map_err(|source| CgroupV2Error::Sys {
                path: dir.clone(),
                source,
            })?;
        if !ids.is_empty() {
            with_programs.push(dir.clone());
        }
    }
    if with_programs.is_empty() {
        with_programs.push(leaf.to_path_buf());
    }
    with_programs
        .iter()
        .map(|dir| allow(sys, dir, spec, nodes))
        .collect()
}

/// Gives the cgroup at `dir` a device program for the bundle's rules
/// (`spec`) plus `nodes`, in place of what is attached there.
pub fn allow(
    sys: &mut dyn BpfSys,
    dir: &Path,
    spec: &Spec,
    nodes: &[DeviceNode],
) -> Result<Replaced, CgroupV2Error> {
    let insns = generate(&ruleset(spec, nodes)?)?;
    let cgroup = File::open(dir).map_err(|source| CgroupV2Error::Open {
        path: dir.to_path_buf(),
        source,
    })?;
    let replaced = install(sys, cgroup.as_fd(), &insns).map_err(|e| e.at(dir))?;
    let out = Replaced {
        cgroup: dir.to_path_buf(),
        old: replaced.0,
        in_place: replaced.1,
    };
    tracing::info!(cgroup = %dir.display(), old = out.old, in_place = out.in_place,
        insns = insns.len(), nodes = nodes.len(), "device program replaced");
    Ok(out)
}

/// An [`install`] failure before its path is known.
#[derive(Debug)]
pub enum InstallError {
    Load(LoadError),
    Sys(SysError),
}

impl InstallError {
    fn at(self, path: &Path) -> CgroupV2Error {
        let path = path.to_path_buf();
        match self {
            InstallError::Load(source) => CgroupV2Error::Load { path, source },
            InstallError::Sys(source) => CgroupV2Error::Sys { path, source },
        }
    }
}

/// Loads `insns` and puts them in place of the device programs attached to
/// `cgroup`: how many there were, and whether one replace did it.
pub fn install(
    sys: &mut dyn BpfSys,
    cgroup: std::os::fd::BorrowedFd<'_>,
    insns: &[Insn],
) -> Result<(usize, bool), InstallError> {
    let new = sys.load(insns, LICENSE).map_err(InstallError::Load)?;
    let ids = sys.query(cgroup).map_err(InstallError::Sys)?;
    let old: Vec<OwnedFd> = ids
        .iter()
        .map(|&id| sys.prog_fd(id))
        .collect::<Result<_, _>>()
        .map_err(InstallError::Sys)?;
    if let [only] = old.as_slice() {
        match sys.attach(cgroup, new.as_fd(), Some(only.as_fd())) {
            Ok(()) => return Ok((1, true)),
            // EINVAL: no BPF_F_REPLACE before Linux 5.6 (runc probes the same way).
            Err(e) if e.errno == nix::errno::Errno::EINVAL => {
                tracing::debug!("bpf_f_replace unsupported, attaching then detaching");
            }
            Err(e) => return Err(InstallError::Sys(e)),
        }
    }
    sys.attach(cgroup, new.as_fd(), None)
        .map_err(InstallError::Sys)?;
    for fd in &old {
        if let Err(e) = sys.detach(cgroup, fd.as_fd()) {
            // The new program stays: with the old one still attached the
            // container gets at most the old access, never more.
            return Err(InstallError::Sys(e));
        }
    }
    Ok((old.len(), false))
}

#[cfg(test)]
mod tests;
