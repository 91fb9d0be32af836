//! Where the plugin finds the hook it names in adjustments.

use std::path::{Path, PathBuf};

/// Where `install/bootstrap.sh` installs the hook.
pub const INSTALLED_HOOK: &str = "/usr/local/bin/devgate-hook";

/// `devgate-hook` beside the running `devgate`, as installed.
pub(super) fn default_hook_path() -> PathBuf {
    match std::env::current_exe() {
        Ok(exe) => hook_beside(&exe, |p| p.is_file()),
        Err(_) => PathBuf::from(INSTALLED_HOOK),
    }
}

/// The hook beside the executable `exe` when `is_file` finds it there, else
/// the installed one: a devgate the runtime starts from its plugin directory
/// (`/opt/nri/plugins/10-devgate`, which `bootstrap.sh --preinstalled` copies)
/// has no hook beside it, and none may be put there, since containerd takes
/// every file in that directory for a plugin.
pub fn hook_beside(exe: &Path, is_file: impl Fn(&Path) -> bool) -> PathBuf {
    exe.parent()
        .map(|dir| dir.join("devgate-hook"))
        .filter(|p| is_file(p))
        .unwrap_or_else(|| PathBuf::from(INSTALLED_HOOK))
}
