//! The container's own cgroups, recorded at creation in hooks-only mode so
//! that the GPU teardown counts its leftover processes as the pod's.
//!
//! Kubernetes runtimes put the pod UID in every container's cgroup path, and
//! the teardown matches that (`crate::gpu::PodCgroups::from_uid`); podman does
//! not: its containers live in `libpod-<id>` (cgroupfs driver, under
//! `libpod_parent`, v1 and v2) or `libpod-<id>.scope` (systemd driver, with
//! the payload in a `container` child on cgroup v2). The paths come from
//! `/proc/<init>/cgroup` (cgroups(7): `hierarchy-id:controllers:path`, read
//! from the runtime's cgroup namespace, the same one the teardown reads).
//!
//! Only a path component that names the container is taken, cut after that
//! component: a container run without a cgroup of its own (`--cgroups=disabled`)
//! shares its parent's, and claiming that would let the teardown end processes
//! that are not the container's.

use std::path::Path;

use super::cgroup::{read_bounded, CgroupError};

/// More than any host mounts (one line per hierarchy).
const MAX_LINES: usize = 64;
/// Distinct paths kept: the v1 hierarchies of one container share a path.
const MAX_PATHS: usize = 8;
/// Longest path kept (PATH_MAX).
const MAX_PATH_BYTES: usize = 4096;
/// Shorter ids could name unrelated cgroups by accident; runtimes use 64 hex.
const MIN_ID_BYTES: usize = 12;

/// The cgroup paths of `pid` that belong to container `container_id`, from
/// `<proc_root>/<pid>/cgroup`; empty when none names the container.
pub fn own_cgroups(
    proc_root: &Path,
    pid: u32,
    container_id: &str,
) -> Result<Vec<String>, CgroupError> {
    let path = proc_root.join(pid.to_string()).join("cgroup");
    let text = read_bounded(&path)?;
    let mut out: Vec<String> = Vec::new();
    for line in text.lines().take(MAX_LINES) {
        let Some(cgroup) = line.splitn(3, ':').nth(2) else {
            return Err(CgroupError::Malformed {
                path,
                reason: "a line is not <id>:<controllers>:<path>".to_string(),
            });
        };
        if let Some(own) = own_prefix(cgroup, container_id) {
            if !out.contains(&own) && out.len() < MAX_PATHS {
                out.push(own);
            }
        }
    }
    Ok(out)
}

/// `cgroup` up to and including its first component that names the container;
/// never for an id that could name something else (`user` names
/// `user.slice`), so a container in its caller's cgroup has none.
pub(super) fn own_prefix(cgroup: &str, container_id: &str) -> Option<String> {
    if !usable_id(container_id) || !cgroup.starts_with('/') || cgroup.len() > MAX_PATH_BYTES {
        return None;
    }
    let mut kept = String::new();
    for component in cgroup.split('/').filter(|c| !c.is_empty()) {
        if component == "." || component == ".." {
            return None;
        }
        kept.push('/');
        kept.push_str(component);
        if names(component, container_id) {
            return Some(kept);
        }
    }
    None
}

fn usable_id(container_id: &str) -> bool {
    container_id.len() >= MIN_ID_BYTES
        && container_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The id bounded by separators: `<id>`, `libpod-<id>`, `crio-<id>.scope`.
fn names(component: &str, id: &str) -> bool {
    component.match_indices(id).any(|(at, _)| {
        let before = component[..at].bytes().last();
        let after = component[at + id.len()..].bytes().next();
        let edge = |b: Option<u8>| b.is_none_or(|b| matches!(b, b'-' | b'.' | b'_' | b':'));
        edge(before) && edge(after)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c0e6a9b2d4e8f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f";

    fn proc_with(text: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("7")).unwrap();
        std::fs::write(dir.path().join("7/cgroup"), text).unwrap();
        dir
    }

    fn own(text: &str, id: &str) -> Vec<String> {
        let proc = proc_with(text);
        own_cgroups(proc.path(), 7, id).unwrap()
    }

    #[test]
    fn podman_cgroups_are_found_in_both_drivers_and_versions() {
        let cgroupfs_hybrid = format!(
            "12:pids:/libpod_parent/libpod-{ID}\n5:devices:/libpod_parent/libpod-{ID}\n\
             1:name=systemd:/libpod_parent/libpod-{ID}\n0::/libpod_parent/libpod-{ID}\n"
        );
        assert_eq!(
            own(&cgroupfs_hybrid, ID),
            [format!("/libpod_parent/libpod-{ID}")]
        );
        let systemd_v2 = format!("0::/machine.slice/libpod-{ID}.scope/container\n");
        assert_eq!(
            own(&systemd_v2, ID),
            [format!("/machine.slice/libpod-{ID}.scope")]
        );
        let crio = format!("0::/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope\n");
        assert_eq!(
            own(&crio, ID),
            [format!(
                "/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope"
            )]
        );
    }

    #[test]
    fn cgroups_that_do_not_name_the_container_are_not_taken() {
        // --cgroups=disabled: the container shares its parent's cgroup.
        assert!(own("0::/user.slice/session-3.scope\n", ID).is_empty());
        // Another container whose id merely contains ours.
        let longer = format!("0::/libpod_parent/libpod-{ID}ff\n");
        assert!(own(&longer, ID).is_empty());
        let escape = format!("0::/../libpod-{ID}\n");
        assert!(own(&escape, ID).is_empty());
        assert!(own(&format!("0::relative/libpod-{ID}\n"), ID).is_empty());
        // Ids too short to be unambiguous, or with path syntax, take nothing.
        assert!(own("0::/libpod_parent/libpod-c1\n", "c1").is_empty());
        let slash = format!("{ID}/x");
        assert!(own(&format!("0::/a/{slash}\n"), &slash).is_empty());
        let huge = format!("0::/{}/libpod-{ID}\n", "a".repeat(MAX_PATH_BYTES));
        assert!(own(&huge, ID).is_empty());
    }

    #[test]
    fn malformed_or_missing_files_are_errors() {
        let proc = proc_with("garbage\n");
        assert!(matches!(
            own_cgroups(proc.path(), 7, ID),
            Err(CgroupError::Malformed { .. })
        ));
        assert!(matches!(
            own_cgroups(proc.path(), 8, ID),
            Err(CgroupError::Read { .. })
        ));
    }
}
