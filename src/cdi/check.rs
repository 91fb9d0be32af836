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

use super::{declared_kind, spec_named, CdiError, Class, DeviceNode, Spec, MAX_SPEC_BYTES};

/// Spec files read per directory; more leave the directory unchecked.
const MAX_SPEC_FILES: usize = 1024;
/// Seconds after a change in which a stamp is not trusted: an in-place
/// rewrite of the same size within the clock's tick would keep its mtime.
const RACY_SECS: i64 = 2;

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
    /// When it was read (seconds since the epoch).
    read_at: i64,
    dirs: Vec<(PathBuf, Option<Stamp>)>,
    /// Every file named like a spec, as it was before it was read: one
    /// rewritten in place to declare a kind of devgate's is read again too.
    files: Vec<(PathBuf, Option<Stamp>)>,
    found: Vec<Found>,
    /// Files the runtime may read that this could not (unreadable, too
    /// large, a link it cannot follow, too many in one directory): with one
    /// of them no device is trusted.
    unchecked: Vec<(PathBuf, String)>,
}

impl Loaded {
    fn read(dirs: &[PathBuf]) -> Loaded {
        let mut loaded = Loaded {
            read_at: now_secs(),
            dirs: dirs.iter().map(|d| (d.clone(), Stamp::of(d))).collect(),
            files: Vec::new(),
            found: Vec::new(),
            unchecked: Vec::new(),
        };
        for (priority, dir) in dirs.iter().enumerate() {
            // A directory that is not there holds nothing, for the runtime too.
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|path| spec_named(path))
                .take(MAX_SPEC_FILES + 1)
                .collect();
            if paths.len() > MAX_SPEC_FILES {
                let why = format!("more than {MAX_SPEC_FILES} spec files");
                loaded.unchecked.push((dir.clone(), why));
                continue;
            }
            paths.sort();
            for path in paths {
                loaded.read_file(path, priority);
            }
        }
        loaded
    }

    fn read_file(&mut self, path: PathBuf, priority: usize) {
        let meta = std::fs::metadata(&path);
        self.files
            .push((path.clone(), meta.as_ref().ok().map(Stamp::from)));
        let why = match meta {
            Ok(m) if m.is_file() && m.len() <= MAX_SPEC_BYTES => match read_spec(&path, priority) {
                Ok(Some(found)) => return self.found.push(found),
                Ok(None) => return,
                Err(why) => why,
            },
            Ok(m) if m.is_file() => format!("larger than {MAX_SPEC_BYTES} bytes"),
            Ok(_) => return,
            // A link to where this process cannot see (outside its mounts)
            // may be one the runtime follows.
            Err(e) if std::fs::symlink_metadata(&path).is_ok() => e.to_string(),
            Err(_) => return,
        };
        self.unchecked.push((path, why));
    }

    /// Whether nothing it was read from has changed: each stamp the same,
    /// and none so recent that a change within its tick could hide.
    fn current(&self, dirs: &[PathBuf]) -> bool {
        // A time ahead of the read (a clock stepped back since the write)
        // counts as settled: otherwise nothing would be kept until then.
        let settled =
            |s: &Option<Stamp>| s.is_none_or(|s| (s.mtime.0 - self.read_at).abs() > RACY_SECS);
        self.dirs
            .iter()
            .map(|(_, s)| s)
            .chain(self.files.iter().map(|(_, s)| s))
            .all(settled)
            && self.dirs.len() == dirs.len()
            && self
                .dirs
                .iter()
                .zip(dirs)
                .all(|((d, stamp), want)| d == want && Stamp::of(d) == *stamp)
            && self.files.iter().all(|(f, stamp)| Stamp::of(f) == *stamp)
    }

    /// The spec and device `name` resolves to, as the runtime resolves it.
    fn resolve(&self, name: &str) -> Result<(&Found, &super::Device), CdiError> {
        if let Some((path, reason)) = self.unchecked.first() {
            return Err(CdiError::Unchecked {
                path: path.clone(),
                reason: reason.clone(),
            });
        }
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

/// The spec `path` holds, if it declares one of devgate's kinds; an error
/// when it cannot be read at all.
fn read_spec(path: &Path, priority: usize) -> Result<Option<Found>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    // Neither UTF-8 nor UTF-16: no spec to the runtime's parser either.
    let Some(text) = super::spec_text(bytes) else {
        return Ok(None);
    };
    let Some(kind) = declared_kind(&text) else {
        return Ok(None);
    };
    if !Class::ALL.iter().any(|c| c.kind() == kind) {
        return Ok(None);
    }
    // devgate writes JSON, which is YAML too; a spec converted by hand is
    // read as YAML whatever its file's name, as CDI reads it. One CDI would
    // drop as invalid is not trusted, nor one whose keys only CDI's
    // case-blind decoding reads as a spec's.
    let parsed = match serde_json::from_str::<Spec>(&text) {
        Ok(spec) => Ok(spec),
        Err(_) => serde_yaml_ng::from_str::<Spec>(&text).map_err(|e| e.to_string()),
    };
    let spec = parsed
        .map_err(|e| format!("not a spec as devgate cdi generate writes it: {e}"))
        .and_then(|spec| match super::validate(&spec) {
            Ok(()) => Ok(spec),
            Err(e) => Err(e.to_string()),
        });
    Ok(Some(Found {
        path: path.to_path_buf(),
        priority,
        kind,
        spec,
    }))
}

fn now_secs() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
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
            // Said of a device of the node's kind (RDMA nodes live under
            // /dev/infiniband), whose spec should have given it.
            let class = match missing.path.starts_with("/dev/infiniband/") {
                true => Class::Rdma,
                false => Class::Gpu,
            };
            let prefix = format!("{}=", class.kind());
            let name = names
                .iter()
                .find(|n| n.starts_with(&prefix))
                .or(names.first());
            let name = name.cloned().unwrap_or_default();
            let path = loaded
                .resolve(&name)
                .map(|(f, _)| f.path.clone())
                .unwrap_or_default();
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
