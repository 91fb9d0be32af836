//! Hooks-only mode (`devgate-hook --hooks-only`, from a hooks.d file): for
//! runtimes without NRI (podman, CRI-O without NRI), the hook resolves the pod
//! annotation itself through the same code as the plugin and applies what the
//! plugin would have put into the OCI spec.
//!
//! At prestart/createRuntime: parse the allocation, plan against the host
//! root's inventory, claim in the ledger (all or nothing), then make the
//! device nodes in the container's `/dev`, allow them in its device cgroup,
//! and move its VFs into its netns. Any failure after the claim releases it:
//! the container fails and holds nothing. A `kill -9` after the claim leaves it
//! to poststop where the spec carries it (runc runs it when a create fails,
//! libcontainer `destroy`); podman keeps poststop hooks out of the spec and
//! runs them only when it deletes a container the runtime created (libpod
//! `postDeleteHooks`), so there the next createRuntime releases it.
//!
//! At poststop: restore the container's VFs, unless another container of the
//! pod runs in their namespace ([`super::kept_network`]), forget the
//! container, and release the pod's claims after its GPU teardown when it was
//! the pod's last container (its cgroups, recorded at creation, mark its
//! processes); a failed restore or teardown quarantines the devices. Each
//! createRuntime first releases pods whose containers all exited without a
//! poststop ([`super::release`]).
//!
//! A hook cannot change the container's environment: the state it reads is a
//! copy and the process is already configured. `NVIDIA_VISIBLE_DEVICES` and
//! the HAMi-core variables are not set in this mode; users pass them
//! themselves (`podman run -e`) or use CDI.
//!
//! A container that carries [`RESOLVED_ANNOTATION`] and the plugin's ledger
//! record of exactly that value was admitted by the NRI plugin, whose own hook
//! does the work; the same annotation without the record came from the pod and
//! is refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::bundle;
use super::{
    cgroup, devnodes, liveness, membership, reap, release, HookEnv, HookError, Outcome, Stage,
    State, RESOLVED_ANNOTATION,
};
use crate::allocation::{self, AllocationError};
use crate::config::Config;
use crate::gpu::{self, GpuError, HealthStore};
use crate::ledger::{ContainerRecord, Ledger, LedgerError, Teardown};
use crate::netdev::VfAttach;
use crate::plan::{self, DeviceNode, PlanError};
use crate::plugin::devices::{network_need, vf_attachments, DeviceError};

#[path = "standalone_sys.rs"]
mod sys;
pub use sys::SysContainerOs;

#[path = "standalone_identity.rs"]
mod identity;
use identity::{identity, MAX_IDENTITY};

#[derive(Debug, thiserror::Error)]
pub enum HooksOnlyError {
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Health(#[from] GpuError),
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    #[error("annotation {key}: not a usable identity (at most {MAX_IDENTITY} printable bytes)")]
    Identity { key: &'static str },
    #[error(transparent)]
    Namespace(#[from] crate::config::NamespaceRefused),
    #[error("the plan mounts {count} host paths, which a hook cannot add (use NRI or CDI)")]
    Mounts { count: usize },
    #[error(transparent)]
    Bundle(bundle::BundleError),
    #[error("device nodes")]
    Nodes(#[source] devnodes::NodeError),
    #[error("device cgroup")]
    Cgroup(#[source] cgroup::CgroupError),
    #[error("{failed}; releasing the claims failed too: {release}")]
    Release {
        failed: Box<HookError>,
        release: Box<HooksOnlyError>,
    },
    #[error("pod {pod}: teardown failed, its devices are quarantined: {reason}")]
    Teardown { pod: String, reason: String },
    #[error(
        "container {container}: its pod was released, or its network taken over by another \
         container, before its vfs moved; refused"
    )]
    Released { container: String },
}

/// The container side of hooks-only mode, where it touches the OS.
pub trait ContainerOs {
    /// Makes `nodes` in the container's `/dev`; how many were new.
    fn make_nodes(
        &mut self,
        state: &State,
        pid: u32,
        nodes: &[DeviceNode],
    ) -> Result<usize, HookError>;
    /// Allows `nodes` in the device cgroup of `pid`.
    fn allow(&mut self, state: &State, pid: u32, nodes: &[DeviceNode]) -> Result<(), HookError>;
    /// Whether the pinned process (see [`ContainerOs::pin`]) is in a network
    /// namespace of its own, or in the host's.
    fn network(&self) -> plan::PodNetwork;
    /// Holds the process `pid` from now on: the attach moves VFs into its
    /// network namespace only while it is that process.
    fn pin(&mut self, _pid: u32) -> Result<(), HookError> {
        Ok(())
    }
    /// Moves `networks` into the netns of `pid`, all or nothing.
    fn attach(
        &mut self,
        container_id: &str,
        pid: u32,
        networks: &[VfAttach],
        checkpoint: &dyn Fn(&'static str),
    ) -> Result<(), HookError>;
    /// Restores the VFs saved for `container_id`; how many.
    fn detach(
        &mut self,
        container_id: &str,
        checkpoint: &dyn Fn(&'static str),
    ) -> Result<usize, HookError>;
    /// The GPU cleanup that runs before a pod's claims go; processes in
    /// `cgroups` (the containers' own, as recorded) count as the pod's.
    fn gpu_teardown(
        &mut self,
        config: &Config,
        ledger: &Ledger,
        sandbox_id: &str,
        cgroups: &[String],
    ) -> Box<dyn Teardown>;
    /// Cleans the quarantined GPUs among `uuids` that no pod holds, as the
    /// plugin's periodic retry does ([`gpu::GpuTeardown::retry_quarantined`]);
    /// those found idle and reset leave quarantine. Returns their UUIDs.
    fn retry_quarantined(
        &mut self,
        config: &Config,
        ledger: &Ledger,
        uuids: &[String],
    ) -> Result<Vec<String>, GpuError>;
}

/// What a hooks-only stage works with: the hook's paths, the node config,
/// the host, and the checkpoint crash tests stop at.
pub struct HooksOnly<'a> {
    pub env: &'a HookEnv,
    pub config: &'a Config,
    pub os: &'a mut dyn ContainerOs,
    pub checkpoint: &'a dyn Fn(&'static str),
    /// After this, a createRuntime starts no release of another exited pod
    /// ([`reap_deadline`]).
    pub reap_until: Instant,
}

/// How long a createRuntime spends releasing pods other than its own whose
/// containers all exited without a poststop, out of the 10 s the shipped
/// hooks.d file gives the hook: each may take a GPU teardown, and a node
/// that lost many pods at once (a runtime crash) would otherwise fail the
/// next container on the timeout. What is left waits for the next hook.
const REAP_BUDGET: Duration = Duration::from_secs(3);

/// The [`HooksOnly::reap_until`] of a hook that started at `start`.
pub fn reap_deadline(start: Instant) -> Instant {
    start + REAP_BUDGET
}

/// Runs one stage in hooks-only mode.
pub fn run_hooks_only(
    stage: Stage,
    state: &State,
    mut run: HooksOnly<'_>,
) -> Result<Outcome, HookError> {
    // A container the NRI plugin admitted carries its annotation, recorded in
    // the ledger: the hook the plugin injected does the work, this one nothing.
    // The same annotation without that record came from the pod: refused.
    if state.annotations.contains_key(RESOLVED_ANNOTATION) {
        let vouched = super::vouched(run.env, state);
        // poststop restores VFs even when the ledger cannot say who admitted
        // the container (`release::stop` reads it again, and restores first).
        if stage == Stage::Poststop && vouched.is_err() {
            return release::stop(&mut run, state);
        }
        return match stage {
            _ if vouched? => Ok(Outcome::Nothing),
            Stage::Prestart | Stage::CreateRuntime => Err(HookError::Unvouched {
                container: state.id.chars().take(64).collect(),
            }),
            Stage::CreateContainer => Ok(Outcome::Nothing),
            Stage::Poststop => release::stop(&mut run, state),
        };
    }
    match stage {
        Stage::Prestart | Stage::CreateRuntime => create(&mut run, stage, state),
        Stage::CreateContainer => Ok(Outcome::Nothing),
        Stage::Poststop => release::stop(&mut run, state),
    }
}

/// The container's cgroups for its GPU teardown. Unreadable ones are left
/// out: its leftover processes then count as outside users, which
/// quarantines the GPU rather than hands it on in use.
fn own_cgroups(env: &HookEnv, pid: u32, container_id: &str) -> Vec<String> {
    match membership::own_cgroups(&env.roots.proc_root, pid, container_id) {
        Ok(paths) => paths,
        Err(e) => {
            tracing::warn!(container = %container_id, error = %nri::ErrorChain(&e), "container cgroups not recorded");
            Vec::new()
        }
    }
}

fn create(run: &mut HooksOnly<'_>, stage: Stage, state: &State) -> Result<Outcome, HookError> {
    let (env, config) = (run.env, run.config);
    if admitted_by_plugin(env, &state.id)? {
        // CRI-O with NRI and this hooks.d file: the plugin applied the allocation.
        return Ok(Outcome::Nothing);
    }
    let no_labels = BTreeMap::new();
    let devices =
        allocation::parse_pod(&state.annotations, &no_labels).map_err(HooksOnlyError::from)?;
    if devices.allocation.is_empty() {
        return Ok(Outcome::Nothing);
    }
    let pid = super::creating_pid(stage, state)?;
    run.os.pin(pid)?;
    let who = identity(state)?;
    config
        .check_namespace(&who.pod.namespace, &who.pod.name)
        .map_err(HooksOnlyError::from)?;
    let ledger = Ledger::open(&env.state_dir).map_err(HooksOnlyError::from)?;
    // First, so that the host is read and the pod's network owner looked up
    // after the release of exited pods, this one's included: its VFs are then
    // back on the host for this container to move in, not left to a pod
    // released underneath it.
    reap::reap_stale(run, &ledger, &who.pod.sandbox_id)?;
    super::cut_network::restore_cut_network(run, &ledger, &who.pod.sandbox_id)?;
    let inventory = gpu::discover_node(&env.host_root, &config.gpu);
    let ctx = plan::ContainerContext {
        network: run.os.network(),
        ..plan::ContainerContext::NONE
    };
    let plan = plan::build_for(&inventory, &devices, &who.container, config, &ctx)
        .map_err(HooksOnlyError::from)?;
    // No process here retries quarantined GPUs on a timer: the next container
    // to want one does, before the ledger would refuse it.
    release::retry_quarantined(run, &ledger, &plan.claims);
    if !plan.mounts.is_empty() {
        return Err(HooksOnlyError::Mounts {
            count: plan.mounts.len(),
        }
        .into());
    }
    if !plan.env.is_empty() {
        tracing::warn!(
            container = %state.id,
            keys = ?plan.env.keys().collect::<Vec<_>>(),
            "a hook cannot set environment variables: pass them to the container or use CDI"
        );
    }
    // A further container of the pod finds its VFs moved in by the first.
    let owned = ledger
        .network_owner(&who.pod.sandbox_id)
        .map_err(HooksOnlyError::from)?
        .is_some();
    let networks =
        vf_attachments(&plan.network, &who.pod.uid, owned).map_err(HooksOnlyError::from)?;
    gpu::check_claims(&HealthStore::new(&config.gpu.health_dir), &plan.claims)
        .map_err(HooksOnlyError::from)?;
    let record = ContainerRecord {
        name: who.container.clone(),
        devices: plan.devices.iter().map(|d| d.path.clone()).collect(),
        applied_unix: crate::ledger::now_unix(),
        init: liveness::identify(&env.roots.proc_root, pid),
        cgroups: own_cgroups(env, pid, &state.id),
        resolved: None,
        resolved_sha256: None,
        hooks_only: true,
    };
    // An owner that moved nothing, or whose VFs are back on the host (its
    // poststop restored them and died before forgetting it), has no saved
    // record of any VF: this container takes the pod's network over.
    let saved = crate::netdev::SavedStore::new(&env.state_dir);
    let owner_idle = |rec: &crate::ledger::PodRecord| saved.none_moved(rec);
    let admission = ledger
        .admit_or_take_over(
            &who.pod,
            &plan.claims,
            &state.id,
            record,
            network_need(!networks.is_empty(), &plan.network),
            &owner_idle,
        )
        .map_err(HooksOnlyError::from)?;
    (run.checkpoint)("admit");
    let mut attaching = false;
    let applied = (|| -> Result<Outcome, HookError> {
        let nodes = run.os.make_nodes(state, pid, &plan.devices)?;
        run.os.allow(state, pid, &plan.devices)?;
        let mut moved = 0;
        if admission.network_owner && !networks.is_empty() {
            attaching = true;
            run.os.attach(&state.id, pid, &networks, run.checkpoint)?;
            moved = networks.len();
        }
        Ok(Outcome::Applied {
            nodes,
            networks: moved,
        })
    })();
    match applied {
        Ok(outcome) => {
            tracing::info!(pod = %who.pod, container = %state.id, ?outcome, "hooks-only plan applied");
            Ok(outcome)
        }
        // Its rollback left a VF saved (or a record unreadable): the VF may
        // sit configured in the pod. The claims stay, its VFs quarantined,
        // until a poststop or the reap of exited pods restores it.
        Err(failed) if attaching && release::vfs_still_saved(env, &state.id) => {
            release::quarantine_pod_vfs(
                &ledger,
                &who.pod.sandbox_id,
                &nri::ErrorChain(&failed).to_string(),
            );
            Err(failed)
        }
        Err(failed) => {
            super::kept_network::restore_left_at_failure(
                run,
                &ledger,
                &who.pod.sandbox_id,
                &state.id,
            );
            match release::forget(run, &ledger, &who.pod.sandbox_id, &state.id) {
                Ok(_) => Err(failed),
                Err(release) => Err(HooksOnlyError::Release {
                    failed: Box::new(failed),
                    release: Box::new(release),
                }
                .into()),
            }
        }
    }
}

#[cfg(test)]
#[path = "standalone_tests.rs"]
mod tests;

/// Whether the NRI plugin has a record of this container: the runtime runs
/// both the plugin and the hooks.d file, and the plugin got there first.
fn admitted_by_plugin(env: &HookEnv, container_id: &str) -> Result<bool, HookError> {
    let ledger = Ledger::read(&env.state_dir).map_err(HooksOnlyError::from)?;
    Ok(ledger
        .container(container_id)
        .is_some_and(ContainerRecord::by_plugin))
}
