//! A CRI-O node: no containerd, a `/etc/crio`. devgate serves it through
//! CRI-O's NRI (`[crio.nri] enable_nri`) or through the hooks.d file, so the
//! containerd checks do not apply; NRI's setting is read from CRI-O's config
//! and its drop-ins (`crio.conf.d`, later files winning, as CRI-O merges
//! them).

use std::path::Path;

use super::host::{read_bounded, Host, Roots};
use super::Check;

const HOOKS_FIX: &str = "or serve it through the hooks.d file: install/bootstrap.sh --hooks-only";

/// Whether this is a CRI-O node: containerd cannot be run and `/etc/crio` is there.
pub fn is_crio(roots: &Roots, host: &dyn Host) -> bool {
    host.containerd_version().is_err() && roots.etc_root.join("crio").is_dir()
}

/// The containerd check on a CRI-O node: said, not failed.
pub fn runtime() -> Check {
    Check::warn(
        "containerd",
        "not installed: a CRI-O node (/etc/crio); the containerd checks are skipped",
        format!("give CRI-O's NRI to the plugin ([crio.nri] enable_nri = true), {HOOKS_FIX}"),
    )
}

/// `[crio.nri] enable_nri` as CRI-O's config and its drop-ins set it.
pub fn nri_enabled(roots: &Roots) -> Check {
    const NAME: &str = "nri enabled";
    let dir = roots.etc_root.join("crio");
    let mut files = vec![dir.join("crio.conf")];
    dropins(&dir.join("crio.conf.d"), &mut files);
    let mut setting = None;
    for file in &files {
        match enable_nri(file) {
            Ok(Some(on)) => setting = Some((on, file.display().to_string())),
            Ok(None) => {}
            Err(e) => return Check::fail(NAME, e, "fix CRI-O's config file"),
        }
    }
    match setting {
        Some((true, file)) => Check::pass(NAME, format!("CRI-O: enable_nri = true in {file}")),
        Some((false, file)) => Check::warn(
            NAME,
            format!("CRI-O: enable_nri = false in {file}: the plugin cannot connect"),
            format!("set [crio.nri] enable_nri = true and restart CRI-O, {HOOKS_FIX}"),
        ),
        None => Check::warn(
            NAME,
            "CRI-O: enable_nri is not set: on by default from CRI-O 1.30, off before",
            format!("set [crio.nri] enable_nri = true, {HOOKS_FIX}"),
        ),
    }
}

/// Most drop-in files read: a node has a handful.
const MAX_DROPINS: usize = 256;

/// The files below `dir`, in the lexical order of their paths, as CRI-O
/// walks its drop-in directory (Go's `filepath.Walk`: any name, not only
/// `*.conf`; subdirectories entered, a link to a file read, a link to a
/// directory not entered); at most [`MAX_DROPINS`].
fn dropins(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        if out.len() > MAX_DROPINS {
            return;
        }
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => dropins(&path, out),
            Ok(_) if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) => out.push(path),
            _ => {}
        }
    }
}

/// `enable_nri` of one file, if it sets it; an unreadable or broken file is
/// an error naming it, a missing one sets nothing.
fn enable_nri(path: &Path) -> Result<Option<bool>, String> {
    let text = match read_bounded(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("read {}: {e}", path.display())),
    };
    let doc: toml::Table = text.parse().map_err(|e| {
        format!(
            "parse {}: {}",
            path.display(),
            crate::config::toml_error(&text, &e)
        )
    })?;
    let value = doc
        .get("crio")
        .and_then(|c| c.get("nri"))
        .and_then(|n| n.get("enable_nri"));
    match value {
        None => Ok(None),
        Some(toml::Value::Boolean(on)) => Ok(Some(*on)),
        Some(other) => Err(format!(
            "{}: [crio.nri] enable_nri is {other}, not true or false",
            path.display()
        )),
    }
}

/// The cgroup check on a CRI-O node: the version; CRI-O's runtime and cgroup
/// manager are its own config's, not read here.
pub fn cgroup(roots: &Roots) -> Check {
    match super::cgroup::cgroup_version(roots) {
        Ok(version) => Check::pass(
            super::cgroup::CGROUP_CHECK,
            format!("cgroup {version}; CRI-O's runtime and cgroup manager are not checked here"),
        ),
        Err(check) => check,
    }
}
