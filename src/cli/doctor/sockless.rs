//! Nodes set up to run without the NRI socket, whose `nri socket` (and, in
//! hooks-only mode, `devgate registered`) failures are what they are built
//! to be: CRI-O with NRI off, serving devgate through its hooks.d file
//! (`bootstrap.sh --hooks-only` removes the plugin), and containerd shutting
//! out external plugins (`disable_connections = true`, where NRI starts no
//! socket listener) while it runs devgate pre-installed. There, a failure of
//! those checks is a warning naming the mode, as the `nri enabled` row warns.

use super::containerd::ContainerdConfig;
use super::running::Running;
use super::{Check, Status};

/// How the node serves devgate without the socket, where it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sockless {
    HooksOnly,
    Preinstalled,
}

impl Sockless {
    pub(super) fn of(
        crio: bool,
        nri: &Check,
        hooks_d: &Check,
        containerd: &ContainerdConfig,
        running: &[Running],
    ) -> Option<Sockless> {
        if crio {
            let hooks_only = nri.status == Status::Warn && hooks_d.status == Status::Pass;
            return hooks_only.then_some(Sockless::HooksOnly);
        }
        let preinstalled = running
            .iter()
            .any(|r| matches!(r, Running::Preinstalled { .. }));
        (preinstalled && containerd.shuts_out_connections()).then_some(Sockless::Preinstalled)
    }

    fn mode(self) -> &'static str {
        match self {
            Sockless::HooksOnly => {
                "hooks-only mode: CRI-O runs devgate-hook from its hooks.d file with NRI off, and no plugin runs"
            }
            Sockless::Preinstalled => {
                "containerd runs devgate pre-installed and shuts out external plugins (disable_connections = true), so it listens on no socket"
            }
        }
    }

    /// `check` as this mode has it: a failure it is built to have warns.
    pub(super) fn soften(mode: Option<Sockless>, check: Check) -> Check {
        let wanted = matches!(
            (mode, check.name),
            (Some(_), "nri socket") | (Some(Sockless::HooksOnly), "devgate registered")
        );
        match (mode, wanted && check.status == Status::Fail) {
            (Some(mode), true) => Check {
                status: Status::Warn,
                detail: format!("{}; {}", check.detail, mode.mode()),
                ..check
            },
            _ => check,
        }
    }
}
