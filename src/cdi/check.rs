//! Whether the runtime's CDI specs give a container exactly the nodes its
//! plan does, for `device_mode = "cdi"`. The runtime takes a spec's numbers
//! as they are (CDI `container-edits_unix.go` fills only missing ones), so a
//! spec written before the devices changed (VFs created again, a driver
//! reloaded, a GPU replaced) would hand the container another device's node.
//! Checked at each creation against the plan, read from sysfs: a spec that
//! differs fails the container, as a plan that cannot be applied does.
//!
//! Resolution follows CDI's registry (`pkg/cdi/cache.go`): the directories
//! are listed lowest priority first, a device in a later one wins, and one
//! named by two specs of the same directory resolves to neither. The specs
//! are read again only when a directory or a devgate spec file changes
//! (its inode, size or mtime).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{declared_kind, CdiError, Class, DeviceNode, Spec};

/// Spec files larger than this are not read: devgate's are a few KiB per device.
const MAX_SPEC_BYTES: u64 = 4 << 20;
/// Directory entries looked at per directory.
const MAX_ENTRIES: usize = 1024;

/// The runtime's specs of devgate's kinds, cached until a file changes.
#[derive(Debug, Default)]
pub struct SpecDirs {
    cached: Mutex<Option<Arc<Loaded>>>,
}

/// What identifies a version of a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        std::fs::metadata(path).ok().map(|m| Stamp::from(&m))
    }
}

impl From<&std::fs::Metadata> for Stamp {
    fn from(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
        }
    }
}

/// A file declaring one of devgate's kinds.
#[derive(Debug)]
struct Found {
    path: PathBuf,
    /// Its directory's place in the list: higher wins.
    priority: usize,
    kind: String,
    spec: Result<Spec, String>,
}

#[derive(Debug)]
struct Loaded {
    dirs: Vec<(PathBuf, Option<Stamp>)>,
    /// Every file named like a spec, as it was before it was read: one
    /// rewritten in place to declare a kind of devgate's is read again too.
    files: Vec<(PathBuf, Option<Stamp>)>,
    found: Vec<Found>,
}

impl Loaded {
    fn read(dirs: &[PathBuf]) -> Loaded {
        let mut loaded = Loaded {
            dirs: dirs.iter().map(|d| (d.clone(), Stamp::of(d))).collect(),
            files: Vec::new(),
            found: Vec::new(),
        };
        for (priority, dir) in dirs.iter().enumerate() {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries
                .flatten()
                .take(MAX_ENTRIES)
                .map(|e| e.path())
                .collect();
            paths.sort();
            for path in paths {
                let yaml = match path.extension().and_then(|e| e.to_str()) {
                    Some("json") => false,
                    Some("yaml") => true,
                    _ => continue,
                };
                let meta = std::fs::metadata(&path).ok();
                loaded
                    .files
                    .push((path.clone(), meta.as_ref().map(Stamp::from)));
                let readable = meta.is_some_and(|m| m.is_file() && m.len() <= MAX_SPEC_BYTES);
                if let Some(found) = readable.then(|| read_spec(&path, yaml, priority)).flatten() {
                    loaded.found.push(found);
                }
            }
        }
        loaded
    }

    /// Whether nothing it was read from has changed.
    fn current(&self, dirs: &[PathBuf]) -> bool {
        self.dirs.len() == dirs.len()
            && self
                .dirs
                .iter()
                .zip(dirs)
                .all(|((d, stamp), want)| d == want && Stamp::of(d) == *stamp)
            && self.files.iter().all(|(f, stamp)| Stamp::of(f) == *stamp)
    }

    /// The spec and device `name` resolves to, as the runtime resolves it.
    fn resolve(&self, name: &str) -> Result<(&Found, &super::Device), CdiError> {
        let (kind, device) = name.split_once('=').unwrap_or((name, ""));
        let mut best: Option<(&Found, &super::Device)> = None;
        for found in self.found.iter().filter(|f| f.kind == kind) {
            let spec = found.spec.as_ref().map_err(|reason| CdiError::Unchecked {
                path: found.path.clone(),
                reason: reason.clone(),
            })?;
            let Some(dev) = spec.devices.iter().find(|d| d.name == device) else {
                continue;
            };
            match best {
                Some((b, _)) if b.priority == found.priority => {
                    return Err(CdiError::Conflict {
                        name: name.to_string(),
                        first: b.path.clone(),
                        second: found.path.clone(),
                    })
                }
                // Listed in order: a later directory's wins.
                _ => best = Some((found, dev)),
            }
        }
        best.ok_or_else(|| CdiError::Unresolved {
            name: name.to_string(),
            dirs: self.dirs.iter().map(|(d, _)| d.clone()).collect(),
        })
    }
}

/// The spec `path` holds, if it declares one of devgate's kinds.
fn read_spec(path: &Path, yaml: bool, priority: usize) -> Option<Found> {
    let text = std::fs::read_to_string(path).ok()?;
    let kind = declared_kind(&text, yaml)?;
    if !Class::ALL.iter().any(|c| c.kind() == kind) {
        return None;
    }
    // devgate writes JSON, which is YAML too; a spec converted to other
    // YAML is not read here, and so not trusted.
    let spec = serde_json::from_str::<Spec>(&text)
        .map_err(|e| format!("not a spec as devgate cdi generate writes it: {e}"));
    Some(Found {
        path: path.to_path_buf(),
        priority,
        kind,
        spec,
    })
}

/// The fields of a node that reach the container (`hostPath` is only where
/// the runtime would read numbers it is not given: devgate gives them).
fn same_node(a: &DeviceNode, b: &DeviceNode) -> bool {
    (
        &a.path,
        &a.kind,
        a.major,
        a.minor,
        a.file_mode,
        &a.permissions,
    ) == (
        &b.path,
        &b.kind,
        b.major,
        b.minor,
        b.file_mode,
        &b.permissions,
    )
}

fn show(n: &DeviceNode) -> String {
    format!(
        "{} {}:{} mode {:o} {}",
        n.kind, n.major, n.minor, n.file_mode, n.permissions
    )
}

impl SpecDirs {
    /// Checks that the devices `names` resolve to in `dirs` give exactly
    /// the nodes `want` (the plan's), spec-wide nodes of their specs included.
    pub fn check(
        &self,
        dirs: &[PathBuf],
        names: &[String],
        want: &[DeviceNode],
    ) -> Result<(), CdiError> {
        let loaded = self.loaded(dirs);
        // Each node given, with the name and spec it came from.
        let mut given: Vec<(&DeviceNode, &str, &Path)> = Vec::new();
        let mut specs_seen: Vec<&Path> = Vec::new();
        for name in names {
            let (found, dev) = loaded.resolve(name)?;
            let nodes = dev.container_edits.device_nodes.iter();
            given.extend(nodes.map(|n| (n, name.as_str(), found.path.as_path())));
            if !specs_seen.contains(&found.path.as_path()) {
                specs_seen.push(&found.path);
                if let Ok(spec) = &found.spec {
                    let wide = spec.container_edits.device_nodes.iter();
                    given.extend(wide.map(|n| (n, name.as_str(), found.path.as_path())));
                }
            }
        }
        let by_path: HashMap<&str, &DeviceNode> =
            want.iter().map(|n| (n.path.as_str(), n)).collect();
        for (node, name, path) in &given {
            let reason = match by_path.get(node.path.as_str()) {
                Some(w) if same_node(node, w) => continue,
                Some(w) => format!(
                    "it gives {} as {}, the plan {}",
                    node.path,
                    show(node),
                    show(w)
                ),
                None => format!("it gives {}, which the plan does not", node.path),
            };
            return Err(CdiError::Stale {
                name: name.to_string(),
                path: path.to_path_buf(),
                reason,
            });
        }
        if let Some(missing) = want
            .iter()
            .find(|w| !given.iter().any(|(n, _, _)| same_node(n, w)))
        {
            let (name, path) = given
                .first()
                .map(|(_, n, p)| (n.to_string(), p.to_path_buf()))
                .unwrap_or_else(|| (names.first().cloned().unwrap_or_default(), PathBuf::new()));
            return Err(CdiError::Stale {
                name,
                path,
                reason: format!(
                    "the plan gives {}, which no device named gives",
                    missing.path
                ),
            });
        }
        Ok(())
    }

    fn loaded(&self, dirs: &[PathBuf]) -> Arc<Loaded> {
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        match cached.as_ref() {
            Some(l) if l.current(dirs) => Arc::clone(l),
            _ => {
                let fresh = Arc::new(Loaded::read(dirs));
                *cached = Some(Arc::clone(&fresh));
                fresh
            }
        }
    }
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
