//! `devgate-hook <stage>`: the OCI hook the NRI plugin injects.
//!
//! - `prestart` / `createRuntime` (runtime namespace, `status: creating`, `pid` =
//!   container init as the host sees it): attach the VFs listed in the
//!   [`RESOLVED_ANNOTATION`] to the netns of `/proc/<pid>/ns/net`.
//! - `createContainer`: runs in the container's namespaces, where host VFs are
//!   out of reach; nothing to do.
//! - `poststop` (no pid; runc also runs it after a failed create, so it must
//!   tolerate a container that never started): detach what was saved for the
//!   container id.
//!
//! runc shows a hook's output only inside its error (libcontainer `Command.Run`),
//! so logs go to a file and the binary prints one line, on failure only.

pub mod args;
mod auto_stage;
pub mod bundle;
pub mod cgroup;
pub mod cgroup_v2;
mod cut_network;
pub mod devnodes;
pub mod entry;
mod failed_attach;
mod inroot;
mod kept_network;
pub mod liveness;
mod log;
pub mod membership;
mod pinned;
mod poststop;
mod reap;
mod release;
mod resolved;
mod siblings;
mod standalone;
mod state;

use std::path::PathBuf;

pub use log::{init_log, MAX_LOG_BYTES};
#[cfg(test)]
use poststop::pod_runs_on;
pub use resolved::{Resolved, ResolvedError, MAX_NETWORKS, RESOLVED_ANNOTATION, RESOLVED_VERSION};
pub use standalone::{run_hooks_only, ContainerOs, HooksOnly, HooksOnlyError, SysContainerOs};
pub use state::{State, MAX_STATE_BYTES};

use crate::config::ConfigError;
use crate::netdev::{self, NetnsError, NetnsRoots, SavedStore, SysNetEnv, VfError, VfOps};

/// Default directory of saved VF state and the hook log.
pub const DEFAULT_STATE_DIR: &str = "/run/devgate";
/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "DEVGATE_CONFIG";
/// Fault injection for the crash tests: `abort-after:<checkpoint>` kills the hook
/// with SIGKILL right after that attach checkpoint ("save", "pf", "move",
/// "configure", "rdma"), leaving everything as a `kill -9` would.
pub const FAULT_ENV: &str = "DEVGATE_HOOK_FAULT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Prestart,
    CreateRuntime,
    CreateContainer,
    Poststop,
}

impl std::str::FromStr for Stage {
    type Err = HookError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "prestart" => Ok(Stage::Prestart),
            "createRuntime" => Ok(Stage::CreateRuntime),
            "createContainer" => Ok(Stage::CreateContainer),
            "poststop" => Ok(Stage::Poststop),
            other => Err(HookError::Stage(other.chars().take(64).collect())),
        }
    }
}

impl Stage {
    /// The stage a runtime is in when it passes a state with `status`
    /// (runtime-spec `runtime.md`: `creating` at createRuntime, `stopped` at poststop).
    /// crun passes `created` to its prestart and createRuntime hooks
    /// (libcrun `container.c`); the hooks.d file lists no later creation stage,
    /// so `created` means the same here.
    pub fn from_status(status: &str) -> Result<Stage, HookError> {
        match status {
            "creating" | "created" => Ok(Stage::CreateRuntime),
            "stopped" => Ok(Stage::Poststop),
            other => Err(HookError::AutoStage(other.chars().take(32).collect())),
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Prestart => "prestart",
            Stage::CreateRuntime => "createRuntime",
            Stage::CreateContainer => "createContainer",
            Stage::Poststop => "poststop",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("unknown stage {0:?} (want prestart, createRuntime, createContainer or poststop)")]
    Stage(String),
    #[error("stage auto: container status {0:?} is neither creating, created nor stopped")]
    AutoStage(String),
    #[error(
        "stage auto: container status {status:?} at a stage that runs in the container's \
         namespaces, as createContainer or startContainer hooks do ({why}); list devgate-hook \
         at createRuntime (or prestart) and poststop only"
    )]
    AutoInContainer { status: String, why: &'static str },
    #[error("read the container state from stdin")]
    Stdin(#[source] std::io::Error),
    #[error("the container state on stdin is larger than {MAX_STATE_BYTES} bytes")]
    StateTooLarge,
    #[error("parse the container state: {0}")]
    State(String),
    #[error(transparent)]
    Resolved(#[from] ResolvedError),
    #[error("{stage}: the container state has no pid")]
    NoPid { stage: Stage },
    #[error("{stage}: container status is {status:?}, want creating")]
    Status { stage: Stage, status: String },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("container netns")]
    Netns(#[source] NetnsError),
    #[error(transparent)]
    Vf(#[from] VfError),
    #[error(transparent)]
    HooksOnly(#[from] HooksOnlyError),
    #[error("read the ledger")]
    Ledger(#[source] crate::ledger::LedgerError),
    #[error(
        "container {container}: annotation {RESOLVED_ANNOTATION} is not the one devgate's plugin \
         recorded for it; pods cannot grant themselves devices, refused"
    )]
    Unvouched { container: String },
    #[error(
        "{stage}: hooks-only mode needs devgate beside this statically linked devgate-hook, \
         which cannot load nvml ({reason}); refused"
    )]
    NotHandedOver { stage: Stage, reason: String },
}

/// Where the hook works.
#[derive(Debug, Clone)]
pub struct HookEnv {
    /// Host root for sysfs reads (hooks-only discovery; in NRI mode only a moved
    /// RDMA device's char devices, read again after an exclusive-mode move).
    pub host_root: PathBuf,
    pub state_dir: PathBuf,
    /// `/proc` of the host: where `<pid>/ns/net` is opened and netns are searched.
    pub roots: NetnsRoots,
}

impl HookEnv {
    /// Whether a VF of `pod` that a hook moved is still away from the host
    /// (for [`crate::ledger::Ledger::remove_container`]).
    pub fn vfs_away(&self, pod: &crate::ledger::PodRecord) -> bool {
        crate::netdev::SavedStore::new(&self.state_dir).vfs_away(&self.host_root, pod)
    }

    /// The kernel's network side, reading the host's sysfs below `host_root`:
    /// for an attach and a restore alike.
    fn net(&self) -> Result<SysNetEnv, HookError> {
        Ok(SysNetEnv::new(self.roots.clone())
            .map_err(HookError::Netns)?
            .with_sys_root(self.host_root.join("sys")))
    }
}

/// What a run did, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Attached(usize),
    Detached(usize),
    /// Hooks-only mode: device nodes made and VFs attached.
    Applied {
        nodes: usize,
        networks: usize,
    },
    /// Hooks-only mode: VFs restored, and whether the pod's claims were released.
    Released {
        networks: usize,
        pod_released: bool,
    },
    Nothing,
}

/// Runs one stage for one container state.
pub fn run(
    stage: Stage,
    state: &State,
    env: &HookEnv,
    checkpoint: &dyn Fn(&'static str),
) -> Result<Outcome, HookError> {
    match stage {
        Stage::Prestart | Stage::CreateRuntime => attach(stage, state, env, checkpoint),
        Stage::CreateContainer => Ok(Outcome::Nothing),
        Stage::Poststop => poststop::detach(state, env, checkpoint),
    }
}

fn attach(
    stage: Stage,
    state: &State,
    env: &HookEnv,
    checkpoint: &dyn Fn(&'static str),
) -> Result<Outcome, HookError> {
    let Some(resolved) = Resolved::from_annotations(&state.annotations)? else {
        return Ok(Outcome::Nothing);
    };
    if resolved.networks.is_empty() {
        return Ok(Outcome::Nothing);
    }
    let init = pinned::Pinned::open(&env.roots.proc_root, creating_pid(stage, state)?)
        .map_err(HookError::Netns)?;
    let vouched_now = || match vouched(env, state)? {
        true => Ok(()),
        false => Err(HookError::Unvouched {
            container: state.id.chars().take(64).collect(),
        }),
    };
    // Asked first without the VFs' turns: an annotation the ledger never
    // recorded makes no lock file.
    vouched_now()?;
    let networks = &resolved.networks;
    if let Err(e) = attach_networks(env, &state.id, &init, networks, checkpoint, &vouched_now) {
        // The released pod's record is gone: nothing of it to forget.
        if !matches!(e, HookError::Unvouched { .. }) {
            failed_attach::release(env, &state.id);
        }
        return Err(e);
    }
    Ok(Outcome::Attached(networks.len()))
}

/// Whether the ledger holds, for this container, exactly the resolved annotation
/// its state carries. The plugin records what it gave each container; a pod can
/// write annotations of its own (CRI-O copies pod annotations into the OCI spec,
/// containerd copies those an operator allows), so the hook never moves or
/// configures a VF on the annotation's word alone.
pub(crate) fn vouched(env: &HookEnv, state: &State) -> Result<bool, HookError> {
    let Some(value) = state.annotations.get(RESOLVED_ANNOTATION) else {
        return Ok(false);
    };
    let ledger = crate::ledger::Ledger::read(&env.state_dir).map_err(HookError::Ledger)?;
    Ok(ledger
        .container(&state.id)
        .is_some_and(|c| c.vouches_for(value)))
}

/// The container's init pid at a creation stage: the state must say the
/// container is being created (runc's "creating", or "created" for prestart
/// runtimes, and crun at createRuntime) or say nothing, and its pid is the
/// way into the pod's network namespace.
pub(crate) fn creating_pid(stage: Stage, state: &State) -> Result<u32, HookError> {
    if !matches!(state.status.as_str(), "creating" | "created" | "") {
        return Err(HookError::Status {
            stage,
            status: state.status.chars().take(32).collect(),
        });
    }
    state.pid().ok_or(HookError::NoPid { stage })
}

/// Moves `networks` into the netns of `init` for `container_id`, all or nothing,
/// once `admitted` agrees, asked while the VFs' release turns are held (see
/// [`crate::ledger::Ledger::lock_devices`]). A release of the pod between an
/// earlier look and the move would otherwise find no record to restore,
/// drop the claims, and leave the VF in a dying pod while another claims it.
pub(crate) fn attach_networks(
    env: &HookEnv,
    container_id: &str,
    init: &pinned::Pinned,
    networks: &[netdev::VfAttach],
    checkpoint: &dyn Fn(&'static str),
    admitted: &dyn Fn() -> Result<(), HookError>,
) -> Result<(), HookError> {
    let ledger = crate::ledger::Ledger::open(&env.state_dir).map_err(HookError::Ledger)?;
    let vfs: Vec<_> = networks.iter().map(|n| n.vf_bus_id).collect();
    let _turns = ledger.lock_vfs(&vfs).map_err(HookError::Ledger)?;
    admitted()?;
    let pod = init.netns().map_err(HookError::Netns)?;
    let mut net = env.net()?;
    let store = SavedStore::new(&env.state_dir);
    let mut ops = VfOps {
        env: &mut net,
        store: &store,
        checkpoint,
    };
    netdev::attach_all(&mut ops, container_id, &pod, None, networks)?;
    Ok(())
}

/// Restores every VF saved for `container_id`; how many there were.
pub(crate) fn detach_networks(
    env: &HookEnv,
    container_id: &str,
    checkpoint: &dyn Fn(&'static str),
) -> Result<usize, HookError> {
    // The common case, a container without VFs, reads one directory and stops.
    let vfs = SavedStore::new(&env.state_dir)
        .vfs_of(container_id)
        .map_err(VfError::Records)?;
    restore_listed(env, container_id, &vfs, checkpoint)
}

/// Restores the VFs `vfs`, found in the records of `container_id`, each
/// while its record is still the container's; how many there were.
fn restore_listed(
    env: &HookEnv,
    container_id: &str,
    vfs: &[crate::inventory::PciAddr],
    checkpoint: &dyn Fn(&'static str),
) -> Result<usize, HookError> {
    if vfs.is_empty() {
        return Ok(0);
    }
    let store = SavedStore::new(&env.state_dir);
    let mut net = env.net()?;
    let mut ops = VfOps {
        env: &mut net,
        store: &store,
        checkpoint,
    };
    Ok(netdev::detach_listed(&mut ops, container_id, vfs)?)
}

#[cfg(test)]
mod poststop_tests;
#[cfg(test)]
mod tests;
