//! The hook `devgate nri` names in the adjustments of containers with VFs. runc
//! runs it on the host (runtime-spec config.md, "POSIX-platform Hooks": the path
//! is absolute and resolved in the runtime namespace), so its path and the state
//! directory it is given are the host's, which differ from the plugin's own view
//! when the plugin runs in a container.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::host::{is_executable_file, Roots};
use super::running::{same_socket, Running};
use super::Check;
use crate::config::Config;

const NAME: &str = "nri hook";
const HOOK_FIX: &str = "install/bootstrap.sh installs devgate-hook next to devgate; the DaemonSet's init container copies it to /opt/devgate/bin (the ConfigMap's hook_path)";

/// Where the plugin's hook is on the host: `hook_path` (absolute: the config
/// refuses others), or the `devgate-hook` next to the running plugin's
/// executable (`<proc>/<pid>/exe`, an absolute link), else the installed one,
/// as the plugin chooses it (`plugin::hook_beside`).
fn hook_path(roots: &Roots, config: &Config, running: &[Running]) -> Result<PathBuf, String> {
    if !config.hook_path.is_empty() {
        return Ok(PathBuf::from(&config.hook_path));
    }
    // The plugin on the socket checked, else any running one: which socket it
    // dials is the registration check's business.
    let pid = running
        .iter()
        .min_by_key(|r| match r {
            Running::Socket { socket, .. } if same_socket(socket, &roots.nri_socket) => 0,
            Running::Socket { .. } => 1,
            Running::Preinstalled { .. } => 2,
        })
        .map(|r| match r {
            Running::Socket { pid, .. } | Running::Preinstalled { pid } => *pid,
        })
        .ok_or_else(|| {
            "hook_path is unset and no devgate nri runs to find it next to".to_string()
        })?;
    let exe = roots.proc_dir.join(pid.to_string()).join("exe");
    let target = std::fs::read_link(&exe).map_err(|e| format!("{}: {e}", exe.display()))?;
    // The plugin's choice, made in its own view of the files (a container's,
    // for the DaemonSet): its root is `<proc>/<pid>/root`, where an absolute
    // link is taken from that root, not doctor's.
    let plugin_root = roots.process_root(pid);
    Ok(crate::plugin::hook_beside(&target, |p| {
        crate::fsutil::resolve_below_root(&plugin_root, p).is_file()
    }))
}

/// Whether `a` and `b` are one directory (the same inode, whichever mount).
fn same_dir(a: &Path, b: &Path) -> std::io::Result<bool> {
    let (a, b) = (std::fs::metadata(a)?, std::fs::metadata(b)?);
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

pub fn nri_hook(roots: &Roots, config: &Config, running: &[Running]) -> Check {
    let hook = match hook_path(roots, config, running) {
        Ok(p) => p,
        Err(why) => {
            return Check::warn(
                NAME,
                why,
                "start devgate nri, or set hook_path to the hook's path on the host",
            )
        }
    };
    let on_host = roots.host_path(&hook);
    if !is_executable_file(&on_host) {
        return Check::fail(
            NAME,
            format!(
                "{} is not an executable file on the host ({}): containers with VFs would fail to start",
                hook.display(),
                on_host.display()
            ),
            HOOK_FIX,
        );
    }
    if config.hook_state_dir.is_empty() {
        return Check::pass(
            NAME,
            format!("{}, given the plugin's --state-dir", hook.display()),
        );
    }
    let hook_state = roots.host_path(Path::new(&config.hook_state_dir));
    match same_dir(&hook_state, &roots.state_dir) {
        Ok(true) => Check::pass(
            NAME,
            format!("{}, state dir {}", hook.display(), config.hook_state_dir),
        ),
        Ok(false) => Check::fail(
            NAME,
            format!(
                "hook_state_dir {} ({}) is not the plugin's state dir {}: the hook would refuse every VF as not recorded",
                config.hook_state_dir,
                hook_state.display(),
                roots.state_dir.display()
            ),
            "set hook_state_dir to where the host sees the plugin's --state-dir",
        ),
        Err(e) => Check::warn(
            NAME,
            format!(
                "cannot compare hook_state_dir {} ({}) with the state dir {}: {e}",
                config.hook_state_dir,
                hook_state.display(),
                roots.state_dir.display()
            ),
            "run devgate doctor on the node, with the plugin's --state-dir, where both are visible",
        ),
    }
}
