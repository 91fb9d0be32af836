//! `devgate-hook <stage>`: the OCI hook (see `devgate::hook`).
//!
//! Exit 0 on success; on failure one line on stderr and exit 1 (2 for a command
//! line it cannot parse). runc puts that
//! line into its "error running hook" message, so it must say what failed.
use std::ffi::OsString;
use std::process::ExitCode;

use devgate::hook::entry;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    // Returns only when the hooks-only run stays here (see `entry`).
    let not_delegated = entry::delegate_hooks_only(&argv);
    entry::main_with(argv, not_delegated)
}
