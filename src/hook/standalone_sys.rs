//! The real container side of hooks-only mode: device nodes made in the
//! container's rootfs, its device cgroup opened to them, VF netdevs moved into
//! its network namespace, and the GPU teardown when its pod goes.

use std::path::PathBuf;

use super::super::bundle::Bundle;
use super::super::{cgroup, devnodes, HookEnv, HookError, State};
use super::{ContainerOs, HooksOnlyError};
use crate::config::Config;
use crate::gpu;
use crate::ledger::{DeviceId, Ledger, PodRecord, Teardown, Unclean};
use crate::netdev::VfAttach;
use crate::plan::DeviceNode;

/// The real container side: `/proc` and sockets from `env`, cgroup v1
/// hierarchies under `cgroup_root`, the cgroup2 mount at `cgroup2_root`.
pub struct SysContainerOs {
    env: HookEnv,
    cgroup_root: PathBuf,
    cgroup2_root: PathBuf,
    /// The container's `config.json`, read at first need: the nodes and the
    /// device program both come from it, and a hook run serves one container.
    bundle: Option<Bundle>,
    /// The container's init, held since the hook began.
    init: Option<super::super::pinned::Pinned>,
}

impl SysContainerOs {
    pub fn new(env: HookEnv, cgroup_root: PathBuf, cgroup2_root: PathBuf) -> SysContainerOs {
        SysContainerOs {
            env,
            cgroup_root,
            cgroup2_root,
            bundle: None,
            init: None,
        }
    }

    fn bundle(&mut self, state: &State) -> Result<&Bundle, HookError> {
        let bundle = match self.bundle.take() {
            Some(bundle) => bundle,
            None => Bundle::read(std::path::Path::new(&state.bundle))
                .map_err(|e| HookError::HooksOnly(HooksOnlyError::Bundle(e)))?,
        };
        Ok(self.bundle.insert(bundle))
    }
}

impl ContainerOs for SysContainerOs {
    /// The pinned process's network namespace against the host's: the
    /// hook's own, as `SysNetEnv` takes it (the runtime runs createRuntime
    /// and prestart hooks in its namespaces, runtime-spec config.md). Not
    /// the spec's: a `network` entry with a path may join the host's
    /// (podman's pod of `--network host`, whose containers join its infra
    /// container's namespace by path). Unknown, with a warning, where either
    /// cannot be read.
    fn network(&self) -> crate::plan::PodNetwork {
        use crate::plan::PodNetwork;
        let Some(init) = &self.init else {
            return PodNetwork::Unknown;
        };
        match (init.netns(), crate::netdev::Netns::current()) {
            (Ok(own), Ok(host)) if own.id() == host.id() => PodNetwork::Host,
            (Ok(_), Ok(_)) => PodNetwork::Own,
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(pid = init.pid(), error = %e, "network namespace not compared with the hook's");
                PodNetwork::Unknown
            }
        }
    }

    fn pin(&mut self, pid: u32) -> Result<(), HookError> {
        let init = super::super::pinned::Pinned::open(&self.env.roots.proc_root, pid)
            .map_err(HookError::Netns)?;
        self.init = Some(init);
        Ok(())
    }

    fn make_nodes(
        &mut self,
        state: &State,
        pid: u32,
        nodes: &[DeviceNode],
    ) -> Result<usize, HookError> {
        if nodes.is_empty() {
            return Ok(0);
        }
        let nodes_err = |e| HookError::HooksOnly(HooksOnlyError::Nodes(e));
        let proc_root = self.env.roots.proc_root.clone();
        devnodes::check_user_ns(&proc_root, pid).map_err(nodes_err)?;
        let rootfs = &self.bundle(state)?.rootfs;
        let fd = devnodes::open_rootfs(&proc_root, pid, rootfs).map_err(nodes_err)?;
        devnodes::make_nodes(std::os::fd::AsFd::as_fd(&fd), nodes).map_err(nodes_err)
    }

    fn allow(&mut self, state: &State, pid: u32, nodes: &[DeviceNode]) -> Result<(), HookError> {
        // Nothing to allow needs no bundle either.
        if nodes.is_empty() {
            return Ok(());
        }
        let roots = cgroup::CgroupRoots {
            proc_root: self.env.roots.proc_root.clone(),
            v1_root: self.cgroup_root.clone(),
            v2_root: self.cgroup2_root.clone(),
        };
        let spec = &self.bundle(state)?.spec;
        cgroup::allow(
            &roots,
            pid,
            &state.id,
            spec,
            nodes,
            &mut super::super::cgroup_v2::SysBpf,
        )
        .map(|_| ())
        .map_err(|e| HookError::HooksOnly(HooksOnlyError::Cgroup(e)))
    }

    fn attach(
        &mut self,
        container_id: &str,
        pid: u32,
        networks: &[VfAttach],
        checkpoint: &dyn Fn(&'static str),
    ) -> Result<(), HookError> {
        // This hook admitted the container as its pod's network owner; a
        // release of its pod since (the reap of exited pods, another
        // container's poststop) took the record, or a container created
        // meanwhile took the network over.
        let state_dir = &self.env.state_dir;
        let admitted = || match Ledger::read(state_dir)?.pod_of(container_id) {
            Some(p) if p.network_owner.as_deref() == Some(container_id) => Ok(()),
            _ => Err(HooksOnlyError::Released {
                container: container_id.chars().take(64).collect(),
            }),
        };
        let admitted = || admitted().map_err(HookError::HooksOnly);
        let init = match self.init.take() {
            Some(init) if init.pid() == pid => init,
            _ => super::super::pinned::Pinned::open(&self.env.roots.proc_root, pid)
                .map_err(HookError::Netns)?,
        };
        let env = &self.env;
        let moved = super::super::attach_networks(
            env,
            container_id,
            &init,
            networks,
            checkpoint,
            &admitted,
        );
        self.init = Some(init);
        moved
    }

    fn detach(
        &mut self,
        container_id: &str,
        checkpoint: &dyn Fn(&'static str),
    ) -> Result<usize, HookError> {
        super::super::detach_networks(&self.env, container_id, checkpoint)
    }

    fn gpu_teardown(
        &mut self,
        config: &Config,
        ledger: &Ledger,
        sandbox_id: &str,
        cgroups: &[String],
    ) -> Box<dyn Teardown> {
        if super::super::entry::STATIC && config.gpu.nvml {
            return Box::new(StaticHookTeardown);
        }
        // Built only when a pod goes: discovery and NVML cost milliseconds.
        let inventory = gpu::discover_node(&self.env.host_root, &config.gpu);
        let teardown = gpu::GpuTeardown::for_node(inventory, config.gpu.clone(), ledger.clone());
        teardown.set_pod_cgroups(sandbox_id, cgroups);
        Box::new(teardown)
    }

    fn retry_quarantined(
        &mut self,
        config: &Config,
        ledger: &Ledger,
        uuids: &[String],
    ) -> Result<Vec<String>, gpu::GpuError> {
        if super::super::entry::STATIC && config.gpu.nvml {
            tracing::warn!(gpus = ?uuids, "a statically linked devgate-hook cannot reset gpus without nvml: they stay quarantined");
            return Ok(Vec::new());
        }
        let inventory = gpu::discover_node(&self.env.host_root, &config.gpu);
        let teardown = gpu::GpuTeardown::for_node(inventory, config.gpu.clone(), ledger.clone());
        teardown.retry_quarantined_of(ledger, |uuid| uuids.iter().any(|u| u == uuid))
    }
}

/// The GPU teardown of a statically linked hook that could not hand its run
/// to `devgate` (src/hook/entry.rs): without NVML it could not reset clocks,
/// compute mode or MIG, nor see NVML-only users, so a pod holding GPUs is not
/// released; its GPUs stay quarantined until a hook with NVML releases it.
struct StaticHookTeardown;

impl Teardown for StaticHookTeardown {
    fn teardown(&self, pod: &PodRecord) -> Result<(), Unclean> {
        let gpus: Vec<DeviceId> = pod
            .claims
            .iter()
            .filter(|c| matches!(c.device, DeviceId::Gpu(_)))
            .map(|c| c.device.clone())
            .collect();
        if gpus.is_empty() {
            return Ok(());
        }
        // Its NICs need no NVML: only the GPUs are kept.
        Err(Unclean::of(
            gpus,
            "a statically linked devgate-hook cannot reset gpus without nvml: \
             install devgate beside it",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Claim, PodRef, Share};

    fn pod(device: DeviceId) -> PodRecord {
        PodRecord {
            pod: PodRef {
                sandbox_id: "sb".into(),
                namespace: "ns".into(),
                name: "p".into(),
                uid: "u".into(),
            },
            claims: vec![Claim {
                device,
                share: Share::Exclusive,
                pf: None,
            }],
            claimed_unix: 0,
            containers: Default::default(),
            network_owner: None,
            admitted: 0,
        }
    }

    #[test]
    fn a_static_hook_keeps_gpu_pods_and_releases_the_others() {
        let gpu = pod(DeviceId::Gpu("GPU-1".into()));
        let err = StaticHookTeardown.teardown(&gpu).unwrap_err();
        assert!(
            err.reason.contains("cannot reset gpus without nvml"),
            "{err:?}"
        );
        let vf = pod(DeviceId::Vf("0000:19:00.1".parse().unwrap()));
        assert_eq!(StaticHookTeardown.teardown(&vf), Ok(()));
        // A pod of both keeps its GPU only: the VF needs no NVML.
        let mut both = gpu.clone();
        both.claims.extend(vf.claims);
        let err = StaticHookTeardown.teardown(&both).unwrap_err();
        let kept: Vec<DeviceId> = err.devices.into_iter().flatten().collect();
        assert_eq!(kept, [DeviceId::Gpu("GPU-1".into())]);
    }

    /// A container this hook admitted whose pod a release took meanwhile,
    /// or whose network another container took over: its VFs are not
    /// moved, asked under their release turns. The owner gets past that
    /// look (here to the refusal of the host's own netns, this test's).
    #[test]
    fn only_a_container_still_owning_its_pods_network_moves_vfs() {
        let dir = tempfile::tempdir().unwrap();
        let env = HookEnv {
            host_root: PathBuf::from("/"),
            state_dir: dir.path().to_path_buf(),
            roots: crate::netdev::NetnsRoots::default(),
        };
        let vf: VfAttach = serde_json::from_str(
            r#"{"vf_index":0,"vf_bus_id":"0000:00:10.1","host_netdev":"veth0","container_ifname":"net1"}"#,
        )
        .unwrap();
        let held = pod(DeviceId::Vf(vf.vf_bus_id));
        let ledger = Ledger::open(dir.path()).unwrap();
        for id in ["c1", "c2"] {
            let record = crate::ledger::ContainerRecord {
                hooks_only: true,
                ..crate::ledger::tests::record(id)
            };
            ledger
                .admit(&held.pod, &held.claims, id, record, true)
                .unwrap();
        }
        let mut os = SysContainerOs::new(env, PathBuf::from("/x"), PathBuf::from("/x"));
        let mut attach = |id: &str| {
            os.attach(id, std::process::id(), std::slice::from_ref(&vf), &|_| {})
                .unwrap_err()
        };
        for id in ["c2", "gone"] {
            let e = attach(id);
            assert!(
                matches!(e, HookError::HooksOnly(HooksOnlyError::Released { .. })),
                "{id}: {e}"
            );
        }
        let e = attach("c1");
        assert!(matches!(e, HookError::Vf(_)), "{e}");
    }

    /// The pinned process is compared with the hook's own namespace: here
    /// through a fake proc root whose pids are this thread and a thread in a
    /// network namespace of its own.
    #[test]
    fn the_network_is_the_hosts_where_the_process_shares_the_hooks() {
        use crate::plan::PodNetwork;
        assert!(
            nix::unistd::geteuid().is_root(),
            "a network namespace of its own needs root (CI runs as root)"
        );
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        std::fs::create_dir(&proc_root).unwrap();
        let task = |tid: i32| format!("/proc/self/task/{tid}");
        let link = |pid: u32, target: String| {
            std::os::unix::fs::symlink(target, proc_root.join(pid.to_string())).unwrap()
        };
        link(7, task(nix::unistd::gettid().as_raw()));
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let apart = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare netns");
            tid_tx.send(nix::unistd::gettid().as_raw()).unwrap();
            let _ = done_rx.recv();
        });
        link(8, task(tid_rx.recv().unwrap()));
        let env = HookEnv {
            host_root: PathBuf::from("/"),
            state_dir: dir.path().to_path_buf(),
            roots: crate::netdev::NetnsRoots {
                proc_root,
                ..crate::netdev::NetnsRoots::default()
            },
        };
        let mut os = SysContainerOs::new(env, PathBuf::from("/x"), PathBuf::from("/x"));
        assert_eq!(os.network(), PodNetwork::Unknown, "nothing pinned");
        os.pin(7).unwrap();
        assert_eq!(os.network(), PodNetwork::Host);
        os.pin(8).unwrap();
        assert_eq!(os.network(), PodNetwork::Own);
        done_tx.send(()).unwrap();
        apart.join().unwrap();
        // The process gone: not told.
        assert_eq!(os.network(), PodNetwork::Unknown);
    }
}
