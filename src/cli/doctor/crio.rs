//! A CRI-O node: no containerd, a `/etc/crio`. devgate serves it through
//! CRI-O's NRI (`[crio.nri] enable_nri`) or through the hooks.d file, so the
//! containerd checks do not apply; NRI's setting is read from CRI-O's config
//! and its drop-ins (`crio.conf.d`, later files winning, as CRI-O merges
//! them).

use std::path::{Path, PathBuf};

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

/// CRI-O's config and its drop-ins, in the order CRI-O merges them.
fn config_files(roots: &Roots) -> Vec<PathBuf> {
    let dir = roots.etc_root.join("crio");
    let mut files = vec![dir.join("crio.conf")];
    dropins(&dir.join("crio.conf.d"), &mut files);
    files
}

/// The value at `key` (a table path) in the last of CRI-O's config files
/// that sets it, with that file; a file that cannot be read or parsed is an
/// error naming it.
fn last_setting(roots: &Roots, key: &[&str]) -> Result<Option<(toml::Value, PathBuf)>, String> {
    last_setting_in(config_files(roots), key)
}

/// [`last_setting`] over `files`, in the order given.
fn last_setting_in(
    files: Vec<PathBuf>,
    key: &[&str],
) -> Result<Option<(toml::Value, PathBuf)>, String> {
    let mut setting = None;
    for file in files {
        if let Some(value) = setting_in(&file, key)? {
            setting = Some((value, file));
        }
    }
    Ok(setting)
}

/// `[crio.nri] enable_nri` as CRI-O's config and its drop-ins set it.
pub fn nri_enabled(roots: &Roots) -> Check {
    const NAME: &str = "nri enabled";
    let setting = match last_setting(roots, &["crio", "nri", "enable_nri"]) {
        Ok(setting) => setting,
        Err(e) => return Check::fail(NAME, e, "fix CRI-O's config file"),
    };
    match setting {
        Some((toml::Value::Boolean(true), file)) => Check::pass(
            NAME,
            format!("CRI-O: enable_nri = true in {}", file.display()),
        ),
        Some((toml::Value::Boolean(false), file)) => Check::warn(
            NAME,
            format!(
                "CRI-O: enable_nri = false in {}: the plugin cannot connect",
                file.display()
            ),
            format!("set [crio.nri] enable_nri = true and restart CRI-O, {HOOKS_FIX}"),
        ),
        Some((other, file)) => Check::fail(
            NAME,
            format!(
                "{}: [crio.nri] enable_nri is {other}, not true or false",
                file.display()
            ),
            "fix CRI-O's config file",
        ),
        None => Check::warn(
            NAME,
            "CRI-O: enable_nri is not set: on by default from CRI-O 1.30, off before",
            format!("set [crio.nri] enable_nri = true, {HOOKS_FIX}"),
        ),
    }
}

/// Where CRI-O and podman read hooks.d files from when their config names none.
const DEFAULT_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";

/// The directories CRI-O reads hooks.d files from (host paths): `[crio.runtime]
/// hooks_dir` of the last of its config files that sets it, else CRI-O's
/// default. Only these: a file in another hooks.d directory, which podman
/// reads, CRI-O never runs.
pub fn hooks_dirs(roots: &Roots) -> Result<Vec<PathBuf>, String> {
    dirs_or_default(
        last_setting(roots, &["crio", "runtime", "hooks_dir"])?,
        "[crio.runtime]",
    )
}

/// The directories podman reads hooks.d files from (host paths): `[engine]
/// hooks_dir` of the last of its containers.conf files that sets it
/// (/usr/share's, /etc's, then /etc's `containers.conf.d/*.conf` by name),
/// else the default containers/common sets, /usr/share's directory alone:
/// podman 4 reads /etc/containers/oci/hooks.d only where it is listed.
pub fn podman_hooks_dirs(roots: &Roots) -> Result<Vec<PathBuf>, String> {
    let mut files = vec![
        roots.host_path(Path::new("/usr/share/containers/containers.conf")),
        roots.host_path(Path::new("/etc/containers/containers.conf")),
    ];
    let dropins = roots.host_path(Path::new("/etc/containers/containers.conf.d"));
    if let Ok(entries) = std::fs::read_dir(&dropins) {
        let mut confs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "conf"))
            .collect();
        confs.sort();
        confs.truncate(MAX_DROPINS);
        files.extend(confs);
    }
    dirs_or_default(
        last_setting_in(files, &["engine", "hooks_dir"])?,
        "[engine]",
    )
}

/// A `hooks_dir` setting's paths, or the default directory where none is set
/// (or the list is empty, as bootstrap takes it). podman 5's `{append = true}`
/// element adds the list to the ones before it, taken here as the default.
fn dirs_or_default(
    setting: Option<(toml::Value, PathBuf)>,
    table: &str,
) -> Result<Vec<PathBuf>, String> {
    let default = || vec![PathBuf::from(DEFAULT_HOOKS_DIR)];
    let Some((value, file)) = setting else {
        return Ok(default());
    };
    let bad = || {
        format!(
            "{}: {table} hooks_dir is {value}, not a list of paths",
            file.display()
        )
    };
    let mut dirs = Vec::new();
    for element in value.as_array().ok_or_else(bad)? {
        match element {
            toml::Value::String(dir) => dirs.push(PathBuf::from(dir)),
            toml::Value::Table(t) if t.get("append") == Some(&toml::Value::Boolean(true)) => {
                dirs.extend(default())
            }
            toml::Value::Table(_) => {}
            _ => return Err(bad()),
        }
    }
    if dirs.is_empty() {
        dirs = default();
    }
    dirs.dedup();
    Ok(dirs)
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

/// The value at `key` in one file, if it sets it; an unreadable or broken
/// file is an error naming it, a missing one sets nothing.
fn setting_in(path: &Path, key: &[&str]) -> Result<Option<toml::Value>, String> {
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
    let Some((last, tables)) = key.split_last() else {
        return Ok(None);
    };
    let table = tables
        .iter()
        .try_fold(&doc, |t, name| t.get(*name).and_then(toml::Value::as_table));
    Ok(table.and_then(|t| t.get(*last)).cloned())
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
