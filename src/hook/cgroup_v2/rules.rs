//! Device-cgroup rules as the runtime applies them, reduced to one allow list
//! or deny list with the cgroup v1 semantics runc emulates for cgroup v2
//! (Documentation/admin-guide/cgroup-v1/devices.rst; runc's devices emulator):
//! a wildcard `a` rule resets the default verdict and forgets every
//! exception; other rules add or remove exceptions to it; a rule that would
//! punch a hole into a wildcard exception is refused, as cgroup v1 refuses it.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::CgroupV2Error;

/// Most rules taken from a spec: runtimes write a few dozen.
pub const MAX_SPEC_RULES: usize = 4096;

/// Device type of a rule; `All` is the OCI `a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DevType {
    All,
    Block,
    Char,
}

/// Access bits, as `struct bpf_cgroup_dev_ctx` carries them
/// (include/uapi/linux/bpf.h `BPF_DEVCG_ACC_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Access(pub u8);

impl Access {
    pub const MKNOD: u8 = 1;
    pub const READ: u8 = 2;
    pub const WRITE: u8 = 4;
    pub const ALL: Access = Access(Self::MKNOD | Self::READ | Self::WRITE);

    /// Parses OCI `access` (`rwm` letters, at least one).
    pub fn parse(s: &str) -> Option<Access> {
        let mut bits = 0;
        for c in s.chars() {
            bits |= match c {
                'r' => Self::READ,
                'w' => Self::WRITE,
                'm' => Self::MKNOD,
                _ => return None,
            };
        }
        (bits != 0).then_some(Access(bits))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// One rule; `None` major or minor is the wildcard `*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub allow: bool,
    pub kind: DevType,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub access: Access,
}

impl Rule {
    pub const fn new(allow: bool, kind: DevType, major: i64, minor: i64, access: u8) -> Rule {
        Rule {
            allow,
            kind,
            major: if major < 0 { None } else { Some(major as u32) },
            minor: if minor < 0 { None } else { Some(minor as u32) },
            access: Access(access),
        }
    }
}

const RWM: u8 = Access::READ | Access::WRITE | Access::MKNOD;

/// runc's default device rules (libcontainer/specconv `AllowedDevices`), which
/// it appends to the spec's rules when it builds the cgroup (`CreateCgroupConfig`):
/// mknod of anything, then `/dev/{null,random,full,tty,zero,urandom}`,
/// `/dev/pts/*`, `/dev/ptmx` and `/dev/net/tun`. A default whose path is also a
/// `linux.devices` entry of the spec is left out (runc's `createDevices`).
pub const RUNC_DEFAULTS: [(Option<&str>, Rule); 11] = [
    (None, Rule::new(true, DevType::Char, -1, -1, Access::MKNOD)),
    (None, Rule::new(true, DevType::Block, -1, -1, Access::MKNOD)),
    (Some("/dev/null"), Rule::new(true, DevType::Char, 1, 3, RWM)),
    (
        Some("/dev/random"),
        Rule::new(true, DevType::Char, 1, 8, RWM),
    ),
    (Some("/dev/full"), Rule::new(true, DevType::Char, 1, 7, RWM)),
    (Some("/dev/tty"), Rule::new(true, DevType::Char, 5, 0, RWM)),
    (Some("/dev/zero"), Rule::new(true, DevType::Char, 1, 5, RWM)),
    (
        Some("/dev/urandom"),
        Rule::new(true, DevType::Char, 1, 9, RWM),
    ),
    (None, Rule::new(true, DevType::Char, 136, -1, RWM)),
    (None, Rule::new(true, DevType::Char, 5, 2, RWM)),
    (None, Rule::new(true, DevType::Char, 10, 200, RWM)),
];

/// The parts of an OCI `config.json` that decide device access, and the
/// root the device nodes go into.
#[derive(Debug, Default, Deserialize)]
pub struct Spec {
    #[serde(default)]
    root: Option<Root>,
    #[serde(default)]
    linux: Option<Linux>,
}

#[derive(Debug, Default, Deserialize)]
struct Root {
    #[serde(default)]
    path: std::path::PathBuf,
}

#[derive(Debug, Default, Deserialize)]
struct Linux {
    #[serde(default)]
    devices: Option<Vec<SpecDevice>>,
    #[serde(default)]
    resources: Option<Resources>,
}

#[derive(Debug, Default, Deserialize)]
struct SpecDevice {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Default, Deserialize)]
struct Resources {
    #[serde(default)]
    devices: Option<Vec<SpecRule>>,
}

/// runtime-spec config-linux.md "Allowed Device list".
#[derive(Debug, Deserialize)]
struct SpecRule {
    allow: bool,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    major: Option<i64>,
    #[serde(default)]
    minor: Option<i64>,
    #[serde(default)]
    access: Option<String>,
}

fn number(v: Option<i64>, index: usize) -> Result<Option<u32>, CgroupV2Error> {
    match v {
        None | Some(-1) => Ok(None),
        // Linux device numbers are 12 + 20 bits; anything past i32 cannot be
        // compared by a 64-bit BPF jump against a sign-extended immediate.
        Some(n) if (0..=i64::from(i32::MAX)).contains(&n) => Ok(Some(n as u32)),
        Some(n) => Err(CgroupV2Error::SpecRule {
            index,
            reason: format!("device number {n} out of range"),
        }),
    }
}

impl Spec {
    /// `root.path` as written (runtime-spec config.md: absolute, or relative
    /// to the bundle).
    pub fn root_path(&self) -> Option<&std::path::Path> {
        self.root.as_ref().map(|r| r.path.as_path())
    }

    /// The rules runc puts into the container's device program: the spec's
    /// `linux.resources.devices`, then its defaults.
    pub fn runtime_rules(&self) -> Result<Vec<Rule>, CgroupV2Error> {
        let linux = self.linux.as_ref();
        let spec_rules = linux
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.devices.as_deref())
            .unwrap_or_default();
        let spec_paths: Vec<&str> = linux
            .and_then(|l| l.devices.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|d| d.path.as_str())
            .collect();
        if spec_rules.len() > MAX_SPEC_RULES || spec_paths.len() > MAX_SPEC_RULES {
            return Err(CgroupV2Error::TooManyRules {
                count: spec_rules.len().max(spec_paths.len()),
            });
        }
        let mut out = Vec::with_capacity(spec_rules.len() + RUNC_DEFAULTS.len());
        for (index, r) in spec_rules.iter().enumerate() {
            let bad = |reason: &str| CgroupV2Error::SpecRule {
                index,
                reason: reason.to_string(),
            };
            let kind = match r.kind.as_deref().unwrap_or("a") {
                "a" => DevType::All,
                "b" => DevType::Block,
                "c" => DevType::Char,
                _ => return Err(bad("type is not a, b or c")),
            };
            // runc refuses an empty access too.
            let access = r
                .access
                .as_deref()
                .and_then(Access::parse)
                .ok_or_else(|| bad("access is not a non-empty mix of r, w and m"))?;
            out.push(Rule {
                allow: r.allow,
                kind,
                major: number(r.major, index)?,
                minor: number(r.minor, index)?,
                access,
            });
        }
        for (path, rule) in RUNC_DEFAULTS {
            if path.is_some_and(|p| spec_paths.contains(&p)) {
                continue;
            }
            out.push(rule);
        }
        Ok(out)
    }
}

type Key = (u32, u32, DevType);

/// The reduced rule set: a default verdict and its exceptions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    /// The verdict when no exception matches.
    pub default_allow: bool,
    /// (major, minor, type) → access; `u32::MAX` stands for a wildcard
    /// number. Every exception has the same verdict, so their order in the
    /// program does not change what it decides.
    exceptions: BTreeMap<Key, Access>,
}

const WILD: u32 = u32::MAX;

fn key(r: &Rule) -> Key {
    (r.major.unwrap_or(WILD), r.minor.unwrap_or(WILD), r.kind)
}

impl Ruleset {
    /// Applies `rules` in order to a deny-all start, as a new v1 cgroup
    /// would see them.
    pub fn from_rules(rules: &[Rule]) -> Result<Ruleset, CgroupV2Error> {
        let mut set = Ruleset::default();
        for r in rules {
            set.refuse_split(r)?;
            set.apply(r)?;
        }
        Ok(set)
    }

    /// Two allow rules of one device whose accesses neither holds the other
    /// (`c 195:0 r`, then `c 195:0 w`): runc merges them, and a program
    /// rebuilt so allows `rw`; crun's (libcrun ebpf.c) checks each rule
    /// alone, so `rw` matches neither and is denied. Refused rather than
    /// widen crun's containers. Deny exceptions merged are stricter than
    /// crun's, never wider.
    fn refuse_split(&self, r: &Rule) -> Result<(), CgroupV2Error> {
        if r.kind == DevType::All || !r.allow || self.default_allow {
            return Ok(());
        }
        let Some(old) = self.exceptions.get(&key(r)) else {
            return Ok(());
        };
        let both = old.0 & r.access.0;
        if both != old.0 && both != r.access.0 {
            return Err(CgroupV2Error::SplitAccess {
                rule: format!("{r:?}"),
            });
        }
        Ok(())
    }

    pub fn apply(&mut self, r: &Rule) -> Result<(), CgroupV2Error> {
        if r.kind == DevType::All && (r.major.is_some() || r.minor.is_some()) {
            // runc (as cgroup v1) resets the whole list whatever the numbers;
            // crun matches char and block devices of those numbers only.
            return Err(CgroupV2Error::AllWithNumbers {
                rule: format!("{r:?}"),
            });
        }
        if r.kind == DevType::All && r.access != Access::ALL {
            // runc resets to allow-all (or deny-all) whatever the access;
            // crun's program (libcrun ebpf.c) checks the access of an `a`
            // rule like any other, so `a r` lets a container read every
            // device but write none. Rebuilt as runc reads it, the program
            // would give crun's containers write access it never had.
            return Err(CgroupV2Error::AllPartial {
                rule: format!("{r:?}"),
            });
        }
        if r.kind == DevType::All {
            // `a` is a reset of the whole list.
            self.default_allow = r.allow;
            self.exceptions.clear();
            return Ok(());
        }
        if r.access.is_empty() {
            return Ok(());
        }
        if r.allow != self.default_allow {
            let e = self.exceptions.entry(key(r)).or_default();
            e.0 |= r.access.0;
            return Ok(());
        }
        // Removing (part of) an exception: only an exact one can shrink;
        // a wider wildcard exception covering it would need a hole.
        let k = key(r);
        for wider in [(WILD, k.1, k.2), (k.0, WILD, k.2), (WILD, WILD, k.2)] {
            if wider == k {
                continue;
            }
            if let Some(a) = self.exceptions.get(&wider) {
                if a.0 & r.access.0 != 0 {
                    return Err(CgroupV2Error::Hole {
                        rule: format!("{r:?}"),
                    });
                }
            }
        }
        if let Some(a) = self.exceptions.get_mut(&k) {
            a.0 &= !r.access.0;
            if a.is_empty() {
                self.exceptions.remove(&k);
            }
        }
        Ok(())
    }

    /// The exceptions in a stable order: by major, minor, type.
    pub fn exceptions(&self) -> impl Iterator<Item = Rule> + '_ {
        self.exceptions
            .iter()
            .map(|(&(major, minor, kind), &access)| Rule {
                allow: !self.default_allow,
                kind,
                major: (major != WILD).then_some(major),
                minor: (minor != WILD).then_some(minor),
                access,
            })
    }
}
