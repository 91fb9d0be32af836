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
//!   that the runtime attached; every attached program must allow an access
//!   (BPF_PROG_RUN_ARRAY_CG), so extra devices need the runtime's program
//!   replaced by one holding its rules and ours. Not done yet: the hook refuses
//!   (fail closed) rather than start a container without its devices.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use crate::plan::{DeviceKind, DeviceNode};

/// `/proc/<pid>/cgroup` has one line per hierarchy; a few hundred bytes.
const MAX_PROC_CGROUP_BYTES: u64 = 64 * 1024;

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
    #[error(
        "container cgroup {path} is on cgroup v2, where adding device rules is not supported yet"
    )]
    V2Unsupported { path: String },
    #[error("open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
    Nothing,
}

/// The v1 rule for a node, as `devices.allow` takes it.
pub fn rule(node: &DeviceNode) -> String {
    let t = match node.kind {
        DeviceKind::Char => 'c',
    };
    format!("{t} {}:{} rw", node.major, node.minor)
}

/// Allows `nodes` in the device cgroup of process `pid`. `proc_root` is where
/// `<pid>/cgroup` is read (normally `/proc`), `cgroup_root` where the v1
/// hierarchies are mounted (normally `/sys/fs/cgroup`).
pub fn allow(
    proc_root: &Path,
    cgroup_root: &Path,
    pid: u32,
    nodes: &[DeviceNode],
) -> Result<Applied, CgroupError> {
    if nodes.is_empty() {
        return Ok(Applied::Nothing);
    }
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
    let Some(rel) = v1 else {
        return Err(match v2 {
            Some(path) => CgroupError::V2Unsupported {
                path: path.chars().take(256).collect(),
            },
            None => malformed("no devices hierarchy and no cgroup v2 entry"),
        });
    };
    let rel = Path::new(rel);
    let clean = rel.is_absolute()
        && rel
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !clean {
        return Err(malformed("devices cgroup path is not absolute and plain"));
    }
    let file = cgroup_root
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

fn read_bounded(path: &Path) -> Result<String, CgroupError> {
    let err = |source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut text = String::new();
    File::open(path)
        .map_err(err)?
        .take(MAX_PROC_CGROUP_BYTES)
        .read_to_string(&mut text)
        .map_err(err)?;
    Ok(text)
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

    /// A fake proc and cgroup root; `devices.allow` is a plain file that
    /// collects what was written.
    fn roots(proc_cgroup: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        fs::create_dir_all(proc.join("7")).unwrap();
        fs::write(proc.join("7/cgroup"), proc_cgroup).unwrap();
        let cg = dir.path().join("cgroup");
        fs::create_dir_all(cg.join("devices/libpod_parent/libpod-abc")).unwrap();
        fs::write(
            cg.join("devices/libpod_parent/libpod-abc/devices.allow"),
            "",
        )
        .unwrap();
        (dir, proc, cg)
    }

    const HYBRID: &str = "12:pids:/libpod_parent/libpod-abc\n\
        5:devices:/libpod_parent/libpod-abc\n\
        1:name=systemd:/libpod_parent/libpod-abc\n\
        0::/libpod_parent/libpod-abc\n";

    #[test]
    fn v1_rules_go_to_the_containers_devices_allow() {
        let (_d, proc, cg) = roots(HYBRID);
        let applied = allow(&proc, &cg, 7, &[node(195, 3), node(231, 195)]).unwrap();
        let file = cg.join("devices/libpod_parent/libpod-abc/devices.allow");
        assert_eq!(applied, Applied::V1(file.clone()));
        assert_eq!(fs::read_to_string(file).unwrap(), "c 195:3 rwc 231:195 rw");
        assert_eq!(allow(&proc, &cg, 7, &[]).unwrap(), Applied::Nothing);
    }

    #[test]
    fn v2_only_is_refused_and_bad_files_are_errors() {
        let (_d, proc, cg) = roots("0::/system.slice/x.scope\n");
        let e = allow(&proc, &cg, 7, &[node(195, 3)]).unwrap_err();
        assert!(matches!(e, CgroupError::V2Unsupported { .. }), "{e}");
        for bad in [
            "garbage\n",
            "5:devices:/a/../../etc\n",
            "5:devices:relative\n",
            "",
        ] {
            let (_d, proc, cg) = roots(bad);
            assert!(allow(&proc, &cg, 7, &[node(195, 3)]).is_err(), "{bad:?}");
        }
        let (_d, proc, cg) = roots("5:devices:/elsewhere\n");
        let e = allow(&proc, &cg, 7, &[node(195, 3)]).unwrap_err();
        assert!(matches!(e, CgroupError::Open { .. }), "{e}");
        assert!(allow(&proc, &cg, 8, &[node(195, 3)]).is_err());
    }
}
