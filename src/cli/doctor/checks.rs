//! Checks of devgate's own setup: its config, the runtime connection, hooks.d,
//! state directories.
use std::path::{Path, PathBuf};

use super::host::{is_executable_file, read_bounded, Host, Roots};
use super::registration::Registration;
use super::running::{same_socket, Running};
use super::Check;
use crate::config::Config;
use crate::plugin::features::RuntimeRecord;

/// At most this many hooks.d files are read per directory.
const MAX_HOOK_FILES: usize = 256;

/// The config the running plugin reads, seen through its root
/// (`<proc>/<pid>/root`): for the DaemonSet's plugin, the ConfigMap mounted
/// in its container, not the host's file. Its `--config`, or the default.
fn plugin_config(roots: &Roots, running: &[Running]) -> Option<(u32, PathBuf)> {
    running
        .iter()
        .find_map(|r| match r {
            Running::Socket {
                pid,
                socket,
                config,
            } if same_socket(socket, &roots.nri_socket) => Some((*pid, config.clone())),
            _ => None,
        })
        .and_then(|(pid, config)| {
            let config = config.unwrap_or_else(|| crate::config::DEFAULT_CONFIG_PATH.into());
            let root = roots.process_root(pid);
            // Its links followed in its root, as the plugin follows them: the
            // kernel would take an absolute one from doctor's root.
            let path = crate::fsutil::resolve_below_root(&root, &config);
            // A root that cannot be read (a fake process tree) says nothing.
            root.is_dir().then_some((pid, path))
        })
}

/// devgate's config: the one given (`--config`), else the running plugin's,
/// else the default path.
pub fn config(roots: &Roots, running: &[Running]) -> (Check, Config) {
    const NAME: &str = "config";
    let (file, whose) = match (&roots.config, plugin_config(roots, running)) {
        (Some(given), _) => (given.clone(), String::new()),
        (None, Some((pid, path))) => (path, format!(" (devgate nri, pid {pid}, reads it)")),
        (None, None) => (crate::config::DEFAULT_CONFIG_PATH.into(), String::new()),
    };
    let path = file.display();
    match Config::load(&file) {
        Ok(c) if file.exists() => (Check::pass(NAME, format!("{path}{whose}")), c),
        Ok(c) => (Check::pass(NAME, format!("no {path}{whose}: defaults")), c),
        Err(e) => (
            Check::fail(
                NAME,
                nri::ErrorChain(&e).to_string(),
                format!("fix {path}; the README lists every key"),
            ),
            Config::default(),
        ),
    }
}

pub fn nri_socket(roots: &Roots, host: &dyn Host) -> Check {
    const NAME: &str = "nri socket";
    let socket = roots.nri_socket.display();
    match host.connect(&roots.nri_socket) {
        Ok(()) => Check::pass(NAME, format!("{socket} accepts connections")),
        Err(e) => Check::fail(
            NAME,
            format!("connect {socket}: {e}"),
            "start containerd with NRI enabled; its [plugins.\"io.containerd.nri.v1.nri\"] socket_path must be this socket",
        ),
    }
}

pub fn registered(roots: &Roots, host: &dyn Host, running: &[Running]) -> Check {
    const NAME: &str = "devgate registered";
    let want = &roots.nri_socket;
    for r in running {
        match r {
            Running::Socket { pid, socket, .. } if same_socket(socket, want) => {
                let what = format!("devgate nri (pid {pid}) on {}", want.display());
                return accepted(roots, host, *pid, what);
            }
            Running::Preinstalled { pid } => {
                let what = format!("pre-installed plugin (pid {pid}), started by the runtime");
                return accepted(roots, host, *pid, what);
            }
            Running::Socket { .. } => {}
        }
    }
    let others: Vec<String> = running
        .iter()
        .filter_map(|r| match r {
            Running::Socket { pid, socket, .. } => {
                Some(format!("pid {pid} on {}", socket.display()))
            }
            Running::Preinstalled { .. } => None,
        })
        .collect();
    let detail = if others.is_empty() {
        format!("no devgate nri process in {}", roots.proc_dir.display())
    } else {
        format!("devgate nri runs on another socket: {}", others.join(", "))
    };
    Check::fail(
        NAME,
        detail,
        "systemctl enable --now devgate (install/bootstrap.sh installs the unit); journalctl -u devgate shows why it stopped",
    )
}

/// The plugin process runs: whether a runtime configured it since it started.
fn accepted(roots: &Roots, host: &dyn Host, pid: u32, what: String) -> Check {
    const NAME: &str = "devgate registered";
    const NOT_ACCEPTED: &str = "the runtime has not accepted the plugin: see the nri checks above and journalctl -u devgate (<state-dir>/nri.log for a plugin the runtime launches); containerd logs 'plugin \"external:10-devgate[<pid>]\" registered as \"10-devgate\"' when it accepts it. A running plugin is registered only once the runtime configured it (recorded in <state-dir>/runtime.json); if containerd restarted since, wait for the plugin to reconnect";
    let state = roots.state_dir.display();
    match super::registration::registration(roots, host, pid) {
        Ok(Registration::Configured(RuntimeRecord {
            disconnected_unix: Some(since),
            runtime,
            ..
        })) => Check::fail(
            NAME,
            format!("{what}; {runtime} closed its connection at unix time {since} and has not configured it again"),
            NOT_ACCEPTED,
        ),
        Ok(Registration::Configured(r)) => Check::pass(
            NAME,
            format!(
                "{what}; configured by {} {} at unix time {}",
                r.runtime, r.version, r.configured_unix
            ),
        ),
        Ok(Registration::NotSinceStart { started_unix, last }) => {
            let last = match last {
                Some(RuntimeRecord { plugin: Some(p), configured_unix, .. }) => format!(
                    "the last configure in {state}, at unix time {configured_unix}, was of another process (pid {}, started at tick {})",
                    p.pid, p.start_ticks
                ),
                Some(r) => format!("the last configure in {state} was at unix time {}", r.configured_unix),
                None => format!("no configure recorded in {state}"),
            };
            Check::fail(
                NAME,
                format!("{what} since unix time {started_unix}, but no runtime configured it since: {last}"),
                NOT_ACCEPTED,
            )
        }
        Err(e) => Check::warn(
            NAME,
            format!("{what}; whether a runtime accepted it is unknown: {}", nri::ErrorChain(&e)),
            format!("run devgate doctor as root with the plugin's --state-dir ({state} here), where devgate nri records each configure"),
        ),
    }
}

/// A hooks.d file of devgate: its name, and the hook's path when it has one.
fn devgate_hook_files(dir: &Path) -> Vec<(PathBuf, Result<String, String>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .take(MAX_HOOK_FILES)
        .collect();
    names.sort();
    let mut out = Vec::new();
    for file in names {
        let ours_by_name = file
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains("devgate"));
        let parsed = read_bounded(&file)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()));
        let path = parsed.and_then(|v| {
            v.pointer("/hook/path")
                .and_then(|p| p.as_str())
                .map(String::from)
                .ok_or_else(|| "no hook.path".to_string())
        });
        let ours = ours_by_name || path.as_ref().is_ok_and(|p| p.ends_with("/devgate-hook"));
        if ours {
            out.push((file, path));
        }
    }
    out
}

/// What keeps the hooks.d file's hook from running: not an executable file,
/// or a statically linked hook (install/build.sh) without the `devgate` it
/// hands hooks-only runs to (src/hook/entry.rs).
fn hook_file_problem(roots: &Roots, hook: &str) -> Option<String> {
    let on_host = roots.host_path(Path::new(hook));
    if !Path::new(hook).is_absolute() || !is_executable_file(&on_host) {
        return Some("is not an executable file".into());
    }
    let is_static = matches!(
        crate::elf::linking(&on_host),
        Ok(crate::elf::Linking::Static { .. })
    );
    let devgate = Path::new(hook).with_file_name("devgate");
    (is_static && !is_executable_file(&roots.host_path(&devgate))).then(|| {
        format!(
            "is statically linked and hands hooks-only runs to {}, which is not an executable file",
            devgate.display()
        )
    })
}

/// The hooks.d file: on a CRI-O node, in a directory CRI-O's `hooks_dir`
/// names (it reads no other); elsewhere, in the usual directories, and
/// warned about unless in one podman's `hooks_dir` names.
pub fn hooks_d(roots: &Roots, crio: bool) -> Check {
    const NAME: &str = "hooks.d";
    let (dirs, podman) = match crio {
        true => match super::crio::hooks_dirs(roots) {
            Ok(dirs) => (dirs, None),
            Err(e) => return Check::fail(NAME, e, "fix CRI-O's config file"),
        },
        false => {
            let mut dirs = vec![
                PathBuf::from("/etc/containers/oci/hooks.d"),
                PathBuf::from("/usr/share/containers/oci/hooks.d"),
            ];
            // Asked only where podman is installed: on a containerd node
            // hooks.d serves nothing, and podman's config is not its own.
            let podman =
                match podman_installed(roots).then(|| super::crio::podman_hooks_dirs(roots)) {
                    None => None,
                    Some(Ok(podman)) => Some(podman),
                    Some(Err(e)) => return Check::warn(NAME, e, "fix podman's containers.conf"),
                };
            for dir in podman.iter().flatten() {
                if !dirs.contains(dir) {
                    dirs.push(dir.clone());
                }
            }
            (dirs, podman)
        }
    };
    let files: Vec<_> = dirs
        .iter()
        .flat_map(|d| devgate_hook_files(&roots.host_path(d)))
        .collect();
    if files.is_empty() {
        let listed: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        let (detail, fix) = match crio {
            true => (
                format!("no devgate file in CRI-O's hooks_dir ({}), the only directories CRI-O reads", listed.join(", ")),
                "install hooks/*.json there (install/bootstrap.sh puts it in the hooks_dir that crio.conf and its drop-ins set), unless CRI-O's NRI serves devgate",
            ),
            false => (
                format!("no devgate file in {}", listed.join(" or ")),
                "only CRI-O and podman need it (containerd gets the hooks through NRI): install hooks/*.json there (install/bootstrap.sh does)",
            ),
        };
        return Check::warn(NAME, detail, fix);
    }
    let read_by_podman = podman.as_ref().is_some_and(|dirs| {
        files.iter().any(|(file, _)| {
            dirs.iter()
                .any(|d| file.parent() == Some(roots.host_path(d).as_path()))
        })
    });
    let mut good = Vec::new();
    for (file, hook) in files {
        let problem = match &hook {
            Err(e) => Some(format!("{}: {e}", file.display())),
            Ok(hook) => hook_file_problem(roots, hook)
                .map(|problem| format!("{}: hook {hook} {problem}", file.display())),
        };
        match problem {
            Some(p) => return Check::fail(
                NAME,
                p,
                "install devgate-hook where the file points (install/bootstrap.sh installs both)",
            ),
            None => good.push(format!(
                "{} -> {}",
                file.display(),
                hook.unwrap_or_default()
            )),
        }
    }
    match podman {
        Some(dirs) if !read_by_podman => {
            let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            Check::warn(
                NAME,
                format!(
                    "{}, but podman reads hooks.d files only from {}",
                    good.join(", "),
                    dirs.join(", ")
                ),
                "for podman, list the file's directory in [engine] hooks_dir of /etc/containers/containers.conf.d/*.conf, keeping the ones listed (containerd gets the hooks through NRI: nothing to do for it)",
            )
        }
        _ => Check::pass(NAME, good.join(", ")),
    }
}

/// Whether the host has podman where its packages put it.
fn podman_installed(roots: &Roots) -> bool {
    ["/usr/bin/podman", "/usr/local/bin/podman", "/bin/podman"]
        .iter()
        .any(|p| roots.host_path(Path::new(p)).exists())
}

fn probe_writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".devgate-doctor-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

pub fn state_dirs(roots: &Roots, config: &Config) -> Check {
    const NAME: &str = "state dirs";
    let dirs = [
        roots.state_dir.clone(),
        roots.host_path(&config.gpu.health_dir),
    ];
    let mut missing = Vec::new();
    for dir in &dirs {
        if !dir.exists() {
            missing.push(dir.display().to_string());
            continue;
        }
        if !dir.is_dir() {
            return Check::fail(
                NAME,
                format!("{} is not a directory", dir.display()),
                "remove it; devgate creates the directory at start",
            );
        }
        if let Err(e) = probe_writable(dir) {
            return Check::fail(
                NAME,
                format!("{} is not writable: {e}", dir.display()),
                "devgate keeps claims and GPU health there: mount it read-write for root",
            );
        }
    }
    if !missing.is_empty() {
        return Check::warn(
            NAME,
            format!("missing: {}", missing.join(", ")),
            "devgate creates them at start; the systemd unit's RuntimeDirectory= and StateDirectory= do too",
        );
    }
    let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Check::pass(NAME, format!("{} writable", shown.join(", ")))
}
