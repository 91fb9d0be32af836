//! Device-cgroup rules for a container's planned nodes, added by the hook in
//! hooks-only mode (with NRI the runtime adds them from `linux.devices`).
//!
//! runc applies the container's cgroup, device rules included, before it runs
//! prestart and createRuntime hooks ("Setup cgroup before prestart hook, so
//! that the prestart hook could apply cgroup permissions", libcontainer
//! `process_linux.go`), and does not apply them again before the container
//! starts, so rules added here hold for the container's life.
//!
//! - cgroup v1: one `c <major>:<minor> rw` line per node written to the
//!   container's `devices.allow` (Documentation/admin-guide/cgroup-v1/devices.rst;
//!   the kernel takes one rule per write).
//! - cgroup v2: the device controller is a BPF_PROG_TYPE_CGROUP_DEVICE program
//!   that the runtime attached; it is replaced by one holding its rules and
//!   ours ([`super::cgroup_v2`]).
//!
//! Which one governs: a process listed in a v1 `devices` hierarchy in
//! `/proc/<pid>/cgroup` is under the v1 controller (a hybrid host mounts both
//! kinds and runc then uses v1); otherwise its `0::` cgroup v2 entry is used.

use std::fs;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use crate::plan::{DeviceKind, DeviceNode};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Malformed { path: PathBuf, reason: String },
    #[error("cgroup v2")]
    V2(#[from] super::cgroup_v2::CgroupV2Error),
    #[error("open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("device cgroup {path} of the container is not its own: no component names container {container} (a container run without a cgroup of its own, as with podman --cgroups=disabled, shares its caller's, whose device access must not change)")]
    NotOwn { path: String, container: String },
    #[error("allow {rule:?} in {path}: {source}")]
    Allow {
        rule: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Which hierarchy took the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The `devices.allow` file written.
    V1(PathBuf),
    /// The cgroup v2 device programs replaced, one per level that had any.
    V2(Vec<super::cgroup_v2::Replaced>),
    Nothing,
}

/// The v1 rule for a node, as `devices.allow` takes it.
pub fn rule(node: &DeviceNode) -> String {
    let t = match node.kind {
        DeviceKind::Char => 'c',
    };
    format!("{t} {}:{} rw", node.major, node.minor)
}

/// Where the hook finds cgroups: `proc_root` holds `<pid>/cgroup` (normally
/// `/proc`), `v1_root` the v1 hierarchies (normally `/sys/fs/cgroup`), `v2_root`
/// the cgroup2 mount (`/sys/fs/cgroup` on a v2-only host).
#[derive(Debug, Clone)]
pub struct CgroupRoots {
    pub proc_root: PathBuf,
    pub v1_root: PathBuf,
    pub v2_root: PathBuf,
}

/// The hierarchy that decides a process's device access, with its cgroup path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    V1(String),
    V2(String),
}

/// Whether `root` is a cgroup2 filesystem: the unified hierarchy, where
/// runtimes use device programs only (runc and crun decide so by `statfs` of
/// the cgroup root), whatever v1 `devices` mount a tool left beside it.
pub fn is_unified(root: &Path) -> bool {
    nix::sys::statfs::statfs(root)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// Reads `<proc_root>/<pid>/cgroup` and picks the device hierarchy: on a
/// `unified` host the v2 entry, else a v1 `devices` one where there is one.
pub fn hierarchy(proc_root: &Path, pid: u32, unified: bool) -> Result<Hierarchy, CgroupError> {
    let proc_path = proc_root.join(pid.to_string()).join("cgroup");
    let text = read_bounded(&proc_path)?;
    let malformed = |reason: &str| CgroupError::Malformed {
        path: proc_path.clone(),
        reason: reason.to_string(),
    };
    let mut v2 = None;
    let mut v1 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("a line is not <id>:<controllers>:<path>"));
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "devices") {
            v1 = Some(path);
        }
    }
    match (v1, v2) {
        (_, Some(p)) if unified => Ok(Hierarchy::V2(p.to_string())),
        (Some(p), _) => Ok(Hierarchy::V1(p.to_string())),
        (None, Some(p)) => Ok(Hierarchy::V2(p.to_string())),
        (None, None) => Err(malformed("no devices hierarchy and no cgroup v2 entry")),
    }
}

/// Allows `nodes` in the device cgroup of process `pid` of container
/// `container_id`, whose bundle's spec (for the runtime's own rules on cgroup
/// v2) is `spec`. The cgroup must be the container's own: a path component
/// names the container (`libpod-<id>.scope`, `crio-<id>.scope`, `<id>`).
pub fn allow(
    roots: &CgroupRoots,
    pid: u32,
    container_id: &str,
    spec: &super::cgroup_v2::Spec,
    nodes: &[DeviceNode],
    bpf: &mut dyn super::cgroup_v2::BpfSys,
) -> Result<Applied, CgroupError> {
    if nodes.is_empty() {
        return Ok(Applied::Nothing);
    }
    let found = hierarchy(&roots.proc_root, pid, is_unified(&roots.v2_root))?;
    let (Hierarchy::V1(path) | Hierarchy::V2(path)) = &found;
    let Some(own) = super::membership::own_prefix(path, container_id) else {
        return Err(CgroupError::NotOwn {
            path: crate::untrusted::one_line(path, 256),
            container: container_id.to_string(),
        });
    };
    let rel = match found {
        Hierarchy::V1(rel) => rel,
        Hierarchy::V2(rel) => {
            let leaf = super::cgroup_v2::cgroup_dir(&roots.v2_root, &rel)?;
            let own = super::cgroup_v2::cgroup_dir(&roots.v2_root, &own)?;
            return Ok(Applied::V2(super::cgroup_v2::allow_in(
                bpf, &own, &leaf, spec, nodes,
            )?));
        }
    };
    let malformed = |reason: &str| CgroupError::Malformed {
        path: roots.proc_root.join(pid.to_string()).join("cgroup"),
        reason: reason.to_string(),
    };
    let rel = Path::new(&rel);
    let clean = rel.is_absolute()
        && rel
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !clean {
        return Err(malformed("devices cgroup path is not absolute and plain"));
    }
    let file = roots
        .v1_root
        .join("devices")
        .join(rel.strip_prefix("/").unwrap_or(rel))
        .join("devices.allow");
    // One open, one write per rule: the kernel parses a rule per write(2).
    let mut out = fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .map_err(|source| CgroupError::Open {
            path: file.clone(),
            source,
        })?;
    for node in nodes {
        let r = rule(node);
        out.write_all(r.as_bytes())
            .map_err(|source| CgroupError::Allow {
                rule: r.clone(),
                path: file.clone(),
                source,
            })?;
    }
    Ok(Applied::V1(file))
}

pub(super) fn read_bounded(path: &Path) -> Result<String, CgroupError> {
    let err = |source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    };
    crate::fsutil::read_proc_text(path, crate::fsutil::MAX_PROC_CGROUP_BYTES)
        .map_err(|e| err(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(major: u32, minor: u32) -> DeviceNode {
        DeviceNode {
            path: format!("/dev/x{minor}"),
            kind: DeviceKind::Char,
            major,
            minor,
            file_mode: 0o666,
        }
    }

    /// A fake proc, cgroup v1 and v2 root and bundle; `devices.allow` is a
    /// plain file that collects what was written.
    struct Fake {
        _dir: tempfile::TempDir,
        roots: CgroupRoots,
        spec: super::super::cgroup_v2::Spec,
    }

    fn fake(proc_cgroup: &str) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        fs::create_dir_all(proc.join("7")).unwrap();
        fs::write(proc.join("7/cgroup"), proc_cgroup).unwrap();
        let cg = dir.path().join("cgroup");
        fs::create_dir_all(cg.join("devices/libpod_parent/libpod-0123456789abc")).unwrap();
        fs::write(
            cg.join("devices/libpod_parent/libpod-0123456789abc/devices.allow"),
            "",
        )
        .unwrap();
        let v2 = dir.path().join("unified");
        fs::create_dir_all(v2.join("system.slice/libpod-0123456789abc.scope")).unwrap();
        let bundle = dir.path().join("bundle");
        fs::create_dir_all(&bundle).unwrap();
        let spec = r#"{"root":{"path":"rootfs"},"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]}}}"#;
        fs::write(bundle.join("config.json"), spec).unwrap();
        Fake {
            _dir: dir,
            roots: CgroupRoots {
                proc_root: proc,
                v1_root: cg,
                v2_root: v2,
            },
            spec: super::super::bundle::Bundle::read(&bundle).unwrap().spec,
        }
    }

    impl Fake {
        fn allow(
            &self,
            pid: u32,
            nodes: &[DeviceNode],
            bpf: &mut FakeBpf,
        ) -> Result<Applied, CgroupError> {
            allow(&self.roots, pid, "0123456789abc", &self.spec, nodes, bpf)
        }
    }

    const HYBRID: &str = "12:pids:/libpod_parent/libpod-0123456789abc\n\
        5:devices:/libpod_parent/libpod-0123456789abc\n\
        1:name=systemd:/libpod_parent/libpod-0123456789abc\n\
        0::/libpod_parent/libpod-0123456789abc\n";

    use super::super::cgroup_v2::fake::FakeBpf;

    #[test]
    fn v1_rules_go_to_the_containers_devices_allow() {
        let f = fake(HYBRID);
        let mut bpf = FakeBpf::with_attached(&[1]);
        let applied = f
            .allow(7, &[node(195, 3), node(231, 195)], &mut bpf)
            .unwrap();
        let file = f
            .roots
            .v1_root
            .join("devices/libpod_parent/libpod-0123456789abc/devices.allow");
        assert_eq!(applied, Applied::V1(file.clone()));
        assert_eq!(fs::read_to_string(file).unwrap(), "c 195:3 rwc 231:195 rw");
        assert_eq!(f.allow(7, &[], &mut bpf).unwrap(), Applied::Nothing);
        assert!(bpf.calls.is_empty(), "a v1 cgroup touches no bpf program");
    }

    #[test]
    fn v2_only_replaces_the_device_program_of_the_containers_cgroup() {
        let f = fake("0::/system.slice/libpod-0123456789abc.scope\n");
        let mut bpf = FakeBpf::with_attached(&[1]);
        let applied = f.allow(7, &[node(195, 3)], &mut bpf).unwrap();
        let Applied::V2(levels) = applied else {
            panic!("{applied:?}")
        };
        let [r] = levels.as_slice() else {
            panic!("{levels:?}")
        };
        assert_eq!(
            r.cgroup,
            f.roots
                .v2_root
                .join("system.slice/libpod-0123456789abc.scope")
        );
        assert_eq!((r.old, r.in_place), (1, true));
        assert_eq!(bpf.attached, vec![100]);
        assert_eq!(
            hierarchy(&f.roots.proc_root, 7, false).unwrap(),
            Hierarchy::V2("/system.slice/libpod-0123456789abc.scope".into())
        );
        let f = fake(HYBRID);
        assert_eq!(
            hierarchy(&f.roots.proc_root, 7, false).unwrap(),
            Hierarchy::V1("/libpod_parent/libpod-0123456789abc".into())
        );
        // On a unified host a stray v1 devices mount decides nothing.
        assert_eq!(
            hierarchy(&f.roots.proc_root, 7, true).unwrap(),
            Hierarchy::V2("/libpod_parent/libpod-0123456789abc".into())
        );
        assert!(!is_unified(&f.roots.v2_root), "a plain directory");
    }

    #[test]
    fn bad_files_and_paths_are_errors() {
        for bad in [
            "garbage\n",
            "5:devices:/a/../../etc\n",
            "5:devices:relative\n",
            "0::/a/../../etc\n",
            "0::relative\n",
            "",
        ] {
            let f = fake(bad);
            let mut bpf = FakeBpf::default();
            assert!(f.allow(7, &[node(195, 3)], &mut bpf).is_err(), "{bad:?}");
            assert!(bpf.attached.is_empty(), "{bad:?}");
        }
        let f = fake("5:devices:/elsewhere/libpod-0123456789abc\n");
        let mut bpf = FakeBpf::default();
        let e = f.allow(7, &[node(195, 3)], &mut bpf).unwrap_err();
        assert!(matches!(e, CgroupError::Open { .. }), "{e}");
        assert!(f.allow(8, &[node(195, 3)], &mut bpf).is_err());
        let f = fake("0::/not/libpod-0123456789abc\n");
        let e = f.allow(7, &[node(195, 3)], &mut bpf).unwrap_err();
        assert!(e.to_string().contains("cgroup v2"), "{e}");
    }

    /// A container without a cgroup of its own runs in its caller's (a user
    /// session, a service, the root cgroup): that cgroup's device access is
    /// not the container's to change.
    #[test]
    fn a_cgroup_that_does_not_name_the_container_is_left_alone() {
        for shared in [
            "0::/user.slice/user-0.slice/session-3.scope\n",
            "0::/\n",
            "0::/system.slice/libpod-abcd.scope\n",
            "5:devices:/user.slice\n0::/user.slice\n",
        ] {
            let f = fake(shared);
            let mut bpf = FakeBpf::with_attached(&[1]);
            let e = f.allow(7, &[node(195, 3)], &mut bpf).unwrap_err();
            assert!(matches!(e, CgroupError::NotOwn { .. }), "{shared:?}: {e}");
            assert!(bpf.calls.is_empty(), "{shared:?}");
        }
        // An id that names a systemd unit by accident (runc run user) is
        // no proof that the cgroup is the container's.
        let f = fake(
            "0::/user.slice/user-0.slice/session-3.scope
",
        );
        let mut bpf = FakeBpf::with_attached(&[1]);
        let e = allow(&f.roots, 7, "user", &f.spec, &[node(195, 3)], &mut bpf).unwrap_err();
        assert!(matches!(e, CgroupError::NotOwn { .. }), "{e}");
        assert!(bpf.calls.is_empty());
    }
}
