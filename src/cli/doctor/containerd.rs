//! containerd checks: its version, NRI on, and what its config says about cgroups.
use std::path::{Path, PathBuf};

use super::host::{read_bounded, Host, Roots};
use super::Check;

const NRI_PLUGIN: &str = "io.containerd.nri.v1.nri";
/// At most this many imported config files are read; a config importing
/// more fails its check (install/bootstrap.sh refuses it alike).
const MAX_IMPORTS: usize = 64;
const NRI_FIX: &str = "set [plugins.\"io.containerd.nri.v1.nri\"] disable = false (install/bootstrap.sh does it and keeps a backup), then restart containerd";

/// What the checks need from containerd's config, imports merged in.
#[derive(Debug, Default)]
pub struct Effective {
    /// The NRI plugin's table, imports merged in as the running containerd
    /// merges them ([`Merge`]).
    pub nri: Option<toml::Table>,
    pub disabled_plugins: Vec<String>,
    /// The CRI plugin's table (`io.containerd.grpc.v1.cri` in version 2 configs,
    /// `io.containerd.cri.v1.runtime` in version 3).
    pub cri: Option<toml::Table>,
}

pub struct ContainerdConfig {
    pub path: PathBuf,
    /// `Ok(None)`: there is no config file (containerd's defaults apply).
    pub loaded: Result<Option<Effective>, String>,
}

/// How an imported file's plugin tables combine with those before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Merge {
    /// containerd 1.x: an imported plugin table replaces the whole table
    /// (services/server/config/config.go `mergeConfig`).
    Replace,
    /// containerd 2.x: tables merge key by key, the later value winning
    /// (containerd PR #9982, "Allow sections of Plugins to be merged").
    Deep,
}

impl ContainerdConfig {
    pub fn load(roots: &Roots, host: &dyn Host) -> ContainerdConfig {
        let how = if is_2x(host) {
            Merge::Deep
        } else {
            Merge::Replace
        };
        let path = roots.containerd_config.clone();
        let loaded = match read_bounded(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("read {}: {e}", path.display())),
            Ok(text) => load_text(roots, &path, &text, how).map(Some),
        };
        ContainerdConfig { path, loaded }
    }

    /// Whether NRI's `disable_connections = true` keeps every plugin but the
    /// pre-installed ones out (NRI then starts no socket listener).
    pub fn shuts_out_connections(&self) -> bool {
        let nri = match &self.loaded {
            Ok(Some(eff)) => eff.nri.as_ref(),
            _ => None,
        };
        nri.and_then(|t| t.get("disable_connections"))
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    }
}

/// Whether the running containerd is 2.x or later (its version read from
/// `containerd --version`): NRI is on by default, and imports merge deep.
fn is_2x(host: &dyn Host) -> bool {
    host.containerd_version()
        .ok()
        .and_then(|l| parse_version(&l))
        .is_some_and(|(major, _)| major >= 2)
}

fn parse(path: &Path, text: &str) -> Result<toml::Table, String> {
    text.parse::<toml::Table>().map_err(|e| {
        format!(
            "parse {}: {}",
            path.display(),
            crate::config::toml_error(text, &e)
        )
    })
}

/// The config with its imports merged in the order containerd loads them
/// (`LoadConfig`, services/server/config/config.go): breadth first, the
/// imports of an imported file too, each file once (the main config among
/// them, which a glob in its own directory matches).
fn load_text(roots: &Roots, path: &Path, text: &str, how: Merge) -> Result<Effective, String> {
    let main = parse(path, text)?;
    let mut eff = Effective::default();
    merge(&mut eff, &main, how);
    let mut loaded = vec![clean(path)];
    let mut pending: std::collections::VecDeque<PathBuf> = imports_of(roots, path, &main).into();
    while let Some(import) = pending.pop_front() {
        if loaded.contains(&import) {
            continue;
        }
        if loaded.len() > MAX_IMPORTS {
            return Err(format!(
                "{} imports more than {MAX_IMPORTS} files, with its imports' own imports: only so many are read",
                path.display()
            ));
        }
        let text = read_bounded(&import).map_err(|e| format!("read {}: {e}", import.display()))?;
        let file = parse(&import, &text)?;
        merge(&mut eff, &file, how);
        pending.extend(imports_of(roots, &import, &file));
        loaded.push(import);
    }
    Ok(eff)
}

/// The files `file` (at `path`) imports.
fn imports_of(roots: &Roots, path: &Path, file: &toml::Table) -> Vec<PathBuf> {
    let imports: Vec<&str> = file
        .get("imports")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    expand_imports(roots, path.parent().unwrap_or(Path::new("/")), &imports)
}

/// containerd resolves a relative import against the importing file's
/// directory and expands globs (containerd 1.7 services/server/config/config.go
/// `resolveImports`). Only a `*` in the file name is expanded here, which is
/// how drop-in directories are named.
fn expand_imports(roots: &Roots, config_dir: &Path, imports: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for import in imports {
        let path = if Path::new(import).is_absolute() {
            roots.host_path(Path::new(import))
        } else {
            config_dir.join(import)
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        match (name.split_once('*'), path.parent()) {
            (Some((prefix, suffix)), Some(parent)) => {
                let mut matched: Vec<PathBuf> = std::fs::read_dir(parent)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.starts_with(prefix) && n.ends_with(suffix))
                    .map(|n| parent.join(n))
                    .collect();
                matched.sort();
                out.extend(matched);
            }
            _ => out.push(path),
        }
    }
    out.iter().map(|p| clean(p)).collect()
}

/// `path` with `.` and `..` taken lexically, as Go's `filepath.Clean`, which
/// containerd applies before it tells a file it loaded already: links are
/// not followed.
fn clean(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            // Above the root is the root.
            Component::ParentDir => {
                if !out.pop() && !out.has_root() {
                    out.push(part);
                }
            }
            other => out.push(other),
        }
    }
    out
}

fn merge(eff: &mut Effective, file: &toml::Table, how: Merge) {
    if let Some(list) = file.get("disabled_plugins").and_then(|v| v.as_array()) {
        let names = list.iter().filter_map(|v| v.as_str()).map(String::from);
        eff.disabled_plugins.extend(names);
    }
    let Some(plugins) = file.get("plugins").and_then(|v| v.as_table()) else {
        return;
    };
    if let Some(t) = plugins.get(NRI_PLUGIN).and_then(|v| v.as_table()) {
        merge_table(&mut eff.nri, t, how);
    }
    for cri in ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"] {
        if let Some(t) = plugins.get(cri).and_then(|v| v.as_table()) {
            merge_table(&mut eff.cri, t, how);
        }
    }
}

fn merge_table(into: &mut Option<toml::Table>, from: &toml::Table, how: Merge) {
    match (into, how) {
        (Some(into), Merge::Deep) => merge_deep(into, from),
        (into, _) => *into = Some(from.clone()),
    }
}

fn merge_deep(into: &mut toml::Table, from: &toml::Table) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(more)) => merge_deep(inner, more),
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// The version in a `containerd --version` line ("containerd <module> v1.7.24 <commit>").
pub fn version_word(line: &str) -> Option<&str> {
    line.split_whitespace().nth(2)
}

/// `(major, minor)` from `containerd --version`.
pub fn parse_version(line: &str) -> Option<(u32, u32)> {
    let version = version_word(line)?;
    let mut parts = version.trim_start_matches('v').split(['.', '~', '-', '+']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

pub fn version(host: &dyn Host) -> Check {
    const NAME: &str = "containerd";
    const FIX: &str = "install containerd 1.7 or later (Debian bookworm's 1.6 has no NRI)";
    let line = match host.containerd_version() {
        Ok(line) => line,
        Err(e) => return Check::fail(NAME, e, FIX),
    };
    match parse_version(&line) {
        Some((major, minor)) if (major, minor) >= (1, 7) => Check::pass(NAME, line),
        Some(_) => Check::fail(NAME, format!("{line}: no NRI before 1.7"), FIX),
        None => Check::fail(NAME, format!("cannot read a version from {line:?}"), FIX),
    }
}

pub fn nri_enabled(host: &dyn Host, config: &ContainerdConfig, socket: &Path) -> Check {
    const NAME: &str = "nri enabled";
    let path = config.path.display();
    // 2.x turns NRI on by default, 1.7 off (containerd docs/NRI.md).
    let on_by_default = is_2x(host);
    let eff = match &config.loaded {
        Err(e) => return Check::fail(NAME, e.clone(), "fix containerd's config file"),
        Ok(None) if on_by_default => {
            return Check::pass(NAME, format!("no {path}: containerd 2.x has NRI on"))
        }
        Ok(None) => return Check::fail(NAME, format!("no {path}: NRI is off"), NRI_FIX),
        Ok(Some(eff)) => eff,
    };
    if eff.disabled_plugins.iter().any(|p| p == NRI_PLUGIN) {
        return Check::fail(
            NAME,
            format!("{path} lists {NRI_PLUGIN} in disabled_plugins"),
            format!("remove it from disabled_plugins; {NRI_FIX}"),
        );
    }
    let disable = eff
        .nri
        .as_ref()
        .and_then(|t| t.get("disable"))
        .and_then(|v| v.as_bool());
    let on = disable.map(|d| !d).unwrap_or(on_by_default);
    if !on {
        let why = match disable {
            Some(_) => "disable = true",
            None => "no disable = false (1.7 defaults to off)",
        };
        return Check::fail(
            NAME,
            format!("{path}: [plugins.\"{NRI_PLUGIN}\"] {why}"),
            NRI_FIX,
        );
    }
    let configured = eff
        .nri
        .as_ref()
        .and_then(|t| t.get("socket_path"))
        .and_then(|v| v.as_str());
    let mut found = Vec::new();
    let mut fixes = Vec::new();
    if config.shuts_out_connections() {
        found.push(format!("{path} sets disable_connections = true: only pre-installed plugins run, and devgate nri on the socket never connects"));
        fixes.push("set disable_connections = false, unless devgate is pre-installed (bootstrap.sh --preinstalled)".to_string());
    }
    if let Some(s) = configured.filter(|s| !super::running::same_socket(Path::new(s), socket)) {
        found.push(format!("its socket_path is {s}, not {}", socket.display()));
        fixes.push(format!("run devgate nri (and doctor) with --socket {s}"));
    }
    if found.is_empty() {
        return Check::pass(NAME, format!("on ({path})"));
    }
    Check::warn(
        NAME,
        format!("on, but {}", found.join("; ")),
        fixes.join("; "),
    )
}

/// The CRI runtime devgate's containers run with: its name and whether runc
/// uses the systemd cgroup driver.
pub fn cri_runtime(config: &ContainerdConfig) -> (String, bool) {
    let cri = match &config.loaded {
        Ok(Some(eff)) => eff.cri.as_ref(),
        _ => None,
    };
    let ctrd = cri
        .and_then(|t| t.get("containerd"))
        .and_then(|v| v.as_table());
    let name = ctrd
        .and_then(|t| t.get("default_runtime_name"))
        .and_then(|v| v.as_str())
        .unwrap_or("runc")
        .to_string();
    let systemd = ctrd
        .and_then(|t| t.get("runtimes"))
        .and_then(|v| v.get(&name))
        .and_then(|v| v.get("options"))
        .and_then(|v| v.get("SystemdCgroup"))
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    (name, systemd)
}

#[cfg(test)]
mod merge_tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn an_import_replaces_a_plugin_table_on_1x_and_merges_into_it_on_2x() {
        let main = table("disable = false\n[a]\nx = 1\ny = 2\n");
        let import = table("socket_path = \"/s\"\n[a]\ny = 3\n");
        let mut replaced = Some(main.clone());
        merge_table(&mut replaced, &import, Merge::Replace);
        assert_eq!(replaced, Some(import.clone()));
        let mut merged = Some(main);
        merge_table(&mut merged, &import, Merge::Deep);
        let want = table("disable = false\nsocket_path = \"/s\"\n[a]\nx = 1\ny = 3\n");
        assert_eq!(merged, Some(want));
        // The first table found is taken whole either way.
        let mut first = None;
        merge_table(&mut first, &import, Merge::Deep);
        assert_eq!(first, Some(import));
    }

    #[test]
    fn import_paths_are_cleaned_as_go_cleans_them() {
        for (path, want) in [
            (
                "/etc/containerd/conf.d/../nested/a.toml",
                "/etc/containerd/nested/a.toml",
            ),
            (
                "/etc/./containerd//config.toml",
                "/etc/containerd/config.toml",
            ),
            ("/../etc/a.toml", "/etc/a.toml"),
            ("a/../../b.toml", "../b.toml"),
        ] {
            assert_eq!(clean(Path::new(path)), Path::new(want), "{path}");
        }
    }
}
