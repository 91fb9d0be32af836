//! From a pod's allocation to what its containers are given: the plan, read
//! against the cached inventory (re-read once for a device it does not know),
//! and everything derived from it before the claim, so that nothing after the
//! claim can fail.

use std::path::Path;

use nri::api::{Container, PodSandbox};

use crate::allocation;
use crate::cdi::Class;
use crate::config::{self, Config};
use crate::hook::Resolved;
use crate::inventory::{Inventory, PciAddr};
use crate::ledger::{DeviceId, NetworkNeed};
use crate::plan::{self, Plan, PlanError};

use super::super::adjust::{to_adjustment, AdjustOptions, HookSpec};
use super::super::last_plan::Prepared;
use super::inventory_cache::Read;
use super::{vf_attachments, DeviceError, Devices, RuntimeFeatures};

impl Devices {
    /// The plan, from `read`; a device it does not know triggers one re-read
    /// before the container is refused.
    pub(super) fn plan(
        &self,
        pod: &allocation::PodDevices,
        ctr: &Container,
        config: &Config,
        network: plan::PodNetwork,
        read: Read,
    ) -> Result<Plan, PlanError> {
        // The container's env: a communication variable it sets itself wins.
        let ctx = plan::ContainerContext {
            env: &ctr.env,
            gids: &self.gids,
            network,
        };
        let build = |inv: &Inventory| plan::build_for(inv, pod, &ctr.name, config, &ctx);
        // A read the kernel's changes overtook each time may pair a VF's
        // netdev with another VF's uverbs: RDMA is refused from it, and
        // kubelet's retry meets a settled host. (Two such reads agreeing
        // would not do: a change after both walked the pod's VF is missed.)
        let from = |read: Read| match read {
            Read::Overtaken(_) if !pod.allocation.rdma.is_empty() => Err(PlanError::HostChanging {
                annotation: allocation::DEVICE_ALLOCATED,
            }),
            Read::Settled(inv) | Read::Overtaken(inv) => build(&inv),
        };
        match from(read) {
            Err(e) if is_unknown_device(&e) => from(self.refresh_settled()),
            other => other,
        }
    }

    /// Whether the pod has a network owner, by a look at the ledger without its lock.
    fn network_owned(&self, sandbox_id: &str) -> Result<bool, DeviceError> {
        let owner = self
            .ledger
            .network_owner(sandbox_id)
            .map_err(|source| DeviceError::Claim {
                entry: String::new(),
                source,
            })?;
        Ok(owner.is_some())
    }

    /// Whether every VF of the plan away from the host is in the pod as its
    /// owner moved it: saved, its attach finished, and no restore begun on
    /// it. One a restore began on may be down with its VLAN gone, one whose
    /// attach was cut not yet configured; a container given it as it is
    /// could bring it up untagged, so the plan is made again and, with the
    /// VF still away, refused.
    fn moved_whole(&self, plan: &Plan) -> bool {
        let saved = crate::netdev::SavedStore::new(&self.state_dir);
        plan.network
            .iter()
            .filter(|a| a.netdev.is_none())
            .all(|a| saved.moved_whole(a.vf_bus_id))
    }

    /// Refuses a plan with a VF still in the pod whose restore began or
    /// whose attach was cut, or beside a VF of the pod's on the host, or
    /// while the pod's network has no owner (`given_up`: the owner's
    /// poststop gave it up and was stopped before its restore began; see
    /// `vf_finish`), having started to restore every VF of the pod's that
    /// the same container moved: that container ended (or its start failed
    /// with the runtime), and each of its VFs goes home, for the next
    /// attempt to move them in together. Only VFs the ledger says the pod
    /// claims.
    fn finish_cut_network(
        &self,
        plan: &Plan,
        sandbox_id: &str,
        given_up: bool,
    ) -> Result<(), DeviceError> {
        let saved = crate::netdev::SavedStore::new(&self.state_dir);
        let away: Vec<(PciAddr, crate::netdev::SavedVf)> = plan
            .network
            .iter()
            .filter(|a| a.netdev.is_none())
            .filter_map(|a| Some((a.vf_bus_id, saved.load(a.vf_bus_id).ok()??)))
            .collect();
        let split = plan.network.iter().any(|a| a.netdev.is_some());
        let cut = away.iter().find(|(_, r)| r.cut());
        let Some((first, left)) = cut.or(away.first().filter(|_| split || given_up)) else {
            return Ok(());
        };
        let container = left.container_id.as_str();
        let vfs: Vec<PciAddr> = plan.network.iter().map(|a| a.vf_bus_id).collect();
        let claimed =
            self.ledger
                .claims_vfs(sandbox_id, &vfs)
                .map_err(|source| DeviceError::Claim {
                    entry: String::new(),
                    source,
                })?;
        if !claimed {
            return Ok(());
        }
        let finish = self
            .finish_restore
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        finish.finish(sandbox_id, container, &vfs);
        Err(DeviceError::RestoreUnfinished {
            entry: plan.entry_of(&DeviceId::Vf(*first)),
            vf: *first,
        })
    }

    /// The plan from a re-read of the host.
    pub(super) fn replan(
        &self,
        pod: &allocation::PodDevices,
        ctr: &Container,
        config: &Config,
        network: plan::PodNetwork,
    ) -> Result<Plan, PlanError> {
        self.plan(pod, ctr, config, network, self.refresh_settled())
    }

    /// The plan and all that can be derived from it before the claim, so that
    /// nothing after the claim can fail.
    pub(super) fn prepare(
        &self,
        devices: &allocation::PodDevices,
        pod: &PodSandbox,
        ctr: &Container,
        config: &Config,
        features: RuntimeFeatures,
        read: Read,
    ) -> Result<Prepared, DeviceError> {
        // As the plan's key has it (`reads::pod_network`).
        let network = super::reads::pod_network(pod);
        let mut plan = self.plan(devices, ctr, config, network, read)?;
        let moved = |p: &Plan| p.network.iter().any(|a| a.netdev.is_none());
        // Whether the pod's network is owned matters only for a VF not on the
        // host: asked after the plan, so the answer is no older than what the
        // plan saw, and not asked at all in the usual case.
        let away = moved(&plan);
        // Some of the pod's VFs home and some away: an owner's restore was cut
        // between them. Given the ones away as they are, the container would
        // start without the others.
        let split = away && plan.network.iter().any(|a| a.netdev.is_some());
        let has_owner = away && !split && self.network_owned(&pod.id)?;
        let owned = has_owner && self.moved_whole(&plan);
        if away && !owned {
            // Read while the VF was still in a pod that has since given it back.
            plan = self.replan(devices, ctr, config, network)?;
            let given_up = !split && !has_owner;
            self.finish_cut_network(&plan, &pod.id, given_up)?;
        }
        // Bound read-write into the container: made, and checked to be
        // root's alone, before any container is given it.
        let lock_dir = &config.hami.host_lock_dir;
        if plan.mounts.iter().any(|m| m.source == *lock_dir) {
            crate::plan::ensure_hami_lock_dir(std::path::Path::new(lock_dir)).map_err(
                |source| DeviceError::HamiLock {
                    entry: first_shared_gpu(&plan),
                    source,
                },
            )?;
        }
        // Before the reply, so before runc registers the container's rules
        // with systemd; a failure only costs the rules' survival of a
        // daemon-reload under the systemd driver, so it is said, not fatal.
        for e in self.dev_char.ensure(&plan.devices) {
            tracing::warn!(error = %e, "a granted device may be lost at systemctl daemon-reload under the systemd cgroup driver");
        }
        let networks = vf_attachments(&plan.network, &pod.uid, owned).map_err(|e| match e {
            DeviceError::NoNetdev { vf, .. } => DeviceError::NoNetdev {
                entry: plan.entry_of(&DeviceId::Vf(vf)),
                vf,
            },
            other => other,
        })?;
        let resolved = if networks.is_empty() {
            None
        } else {
            Some(Resolved::new(networks).to_annotation()?)
        };
        let opts = AdjustOptions {
            explicit_cgroup_rules: features.explicit_cgroup_rules,
            cdi_devices: cdi_names(&plan, config.device_mode, features),
            ..AdjustOptions::default()
        };
        let network = network_need(resolved.is_some(), &plan.network);
        let cdi_nodes = if opts.cdi_devices.is_empty() {
            Vec::new()
        } else {
            plan.devices.iter().map(crate::cdi::node).collect()
        };
        Ok(Prepared {
            network,
            // Without the host netdev, this plan holds only while the pod's
            // network owner does: the next container may have to move the VF.
            keep: !moved(&plan),
            adjust: to_adjustment(&plan, &opts),
            cdi_nodes,
            device_paths: plan.devices.iter().map(|d| d.path.clone()).collect(),
            hook: resolved.as_ref().map(|_| self.hook_spec(config)),
            resolved_sha256: resolved.as_deref().map(crate::ledger::resolved_digest),
            resolved,
            claims: plan.claims,
            claim_entries: plan.claim_entries,
            warnings: plan.warnings,
            notes: plan.notes,
            replies: Default::default(),
        })
    }

    /// Where the adjustment names CDI devices, the runtime takes the nodes
    /// from their spec: checked at each creation to be the plan's, so a spec
    /// gone stale (written before the devices changed) fails the container.
    pub(super) fn check_cdi(
        &self,
        prepared: &Prepared,
        config: &Config,
    ) -> Result<(), DeviceError> {
        let names: Vec<String> = prepared
            .adjust
            .CDI_devices
            .iter()
            .map(|d| d.name.clone())
            .collect();
        if names.is_empty() {
            return Ok(());
        }
        let checked = self
            .cdi_specs
            .check(&config.cdi_spec_dirs, &names, &prepared.cdi_nodes);
        checked.map_err(|source| DeviceError::Cdi {
            // The names follow the claims, one each (`prepare::cdi_names`).
            entry: source
                .device_name()
                .and_then(|n| names.iter().position(|m| m == n))
                .and_then(|i| prepared.claims.get(i))
                .map(|c| prepared.entry_of(&c.device))
                .unwrap_or_default(),
            source,
        })
    }

    /// The hook as runc runs it: on the host, so every path is the host's view;
    /// a config value, where set, wins over what the plugin itself sees.
    fn hook_spec(&self, config: &Config) -> HookSpec {
        let host_view = |configured: &str, own: &Path| {
            if configured.is_empty() {
                own.display().to_string()
            } else {
                configured.to_string()
            }
        };
        HookSpec {
            path: host_view(&config.hook_path, &self.hook_path),
            flags: vec![
                // No --host-root: the hook reads the host only in hooks-only
                // mode, which hooks.d files start, never the plugin.
                "--state-dir".to_string(),
                host_view(&config.hook_state_dir, &self.state_dir),
            ],
            timeout_secs: config.hook_timeout_secs,
        }
    }
}

/// The CDI names of the plan's devices when the config asks for CDI and the
/// runtime injects it; empty otherwise (raw nodes). The spec from
/// `devgate cdi generate` holds the same nodes the plan does, and a name the
/// runtime cannot resolve fails the container: never a silent fallback.
fn cdi_names(plan: &Plan, mode: config::DeviceMode, features: RuntimeFeatures) -> Vec<String> {
    if super::super::features::devices_as(mode, features) != config::DeviceMode::Cdi
        || plan.devices.is_empty()
    {
        return Vec::new();
    }
    plan.claims
        .iter()
        .map(|c| match &c.device {
            DeviceId::Gpu(uuid) => Class::Gpu.qualified(uuid),
            DeviceId::Pf(bus) | DeviceId::Vf(bus) => Class::Rdma.qualified(&bus.to_string()),
        })
        .collect()
}

/// What admitting a container does with the pod's network: move its VFs in
/// (`moves`: the hook's attachments were made), nothing (no VFs), or rely on
/// the VFs its network owner moved into the pod already.
pub(crate) fn network_need(moves: bool, actions: &[plan::NetworkAction]) -> NetworkNeed {
    match (moves, actions.is_empty()) {
        (true, _) => NetworkNeed::Moves,
        (false, true) => NetworkNeed::None,
        (false, false) => NetworkNeed::InPod,
    }
}

fn is_unknown_device(e: &PlanError) -> bool {
    matches!(
        e,
        PlanError::UnknownGpu { .. }
            | PlanError::UnknownRdma { .. }
            | PlanError::UnknownPf { .. }
            | PlanError::UnknownVf { .. }
            | PlanError::NoMajor { .. }
            | PlanError::NoRdmaCm { .. }
            // A VF's RDMA device and netdev come back to the host when its
            // last pod goes, after this inventory was read.
            | PlanError::NoRdmaDevice { .. }
            // A GPU replaced or renumbered (driver reload), or NICs probed in
            // another order, since: the scheduler's ids are checked against
            // a fresh read before the container is refused.
            | PlanError::GpuIdOfOther { .. }
            | PlanError::GpuIdMismatch { .. }
            | PlanError::PfMinorMismatch { .. }
    )
}

/// The entry (`gpu[1]: `) of the plan's first shared GPU, which HAMi-core's
/// lock directory is bound for; empty if none.
fn first_shared_gpu(plan: &Plan) -> String {
    let shared = plan.claims.iter().find(|c| {
        matches!(c.device, DeviceId::Gpu(_)) && c.share != crate::ledger::Share::Exclusive
    });
    shared.map(|c| plan.entry_of(&c.device)).unwrap_or_default()
}
