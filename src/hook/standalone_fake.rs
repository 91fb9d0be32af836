//! The test side of hooks-only mode: a simulated HGX host root, a procfs
//! where the test's container inits run, and a fake container side that
//! records what reached the container and which GPU teardowns ran.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

use super::super::*;
use crate::fixture::{Fixture, HostRootBuilder};
use crate::netdev::NetnsRoots;

/// One GPU teardown as the fake saw it: the sandbox and the cgroups given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TornDown {
    pub(super) sandbox_id: String,
    pub(super) cgroups: Vec<String>,
}

#[derive(Default)]
pub(super) struct FakeOs {
    pub(super) nodes: Vec<DeviceNode>,
    pub(super) allowed: Vec<DeviceNode>,
    pub(super) attached: Vec<VfAttach>,
    pub(super) detached: RefCell<Vec<String>>,
    pub(super) fail: Option<&'static str>,
    /// Sandbox ids whose GPU teardown ran.
    pub(super) gpu_torn: Rc<RefCell<Vec<String>>>,
    /// The teardowns built, with the cgroups they were given.
    pub(super) teardowns: Rc<RefCell<Vec<TornDown>>>,
    /// Runs inside the GPU teardown: what another hook does meanwhile.
    pub(super) meanwhile: Option<Rc<dyn Fn()>>,
    /// The UUIDs of each quarantine retry asked for.
    pub(super) retried: Vec<Vec<String>>,
    /// What a detach does to the host.
    pub(super) on_detach: Option<Rc<dyn Fn()>>,
    /// Where a detach removes the container's saved VF records, as the
    /// real restore does.
    pub(super) store: Option<crate::netdev::SavedStore>,
    /// The container whose detach fails.
    pub(super) refuse_detach: Option<&'static str>,
    /// Where the container's process is, as the real side would find it.
    pub(super) network: crate::plan::PodNetwork,
}

/// The GPU teardown side of [`FakeOs`]; fails when `fail` is "gpu".
struct FakeGpu {
    torn: Rc<RefCell<Vec<String>>>,
    fail: bool,
    meanwhile: Option<Rc<dyn Fn()>>,
}

impl Teardown for FakeGpu {
    fn teardown(&self, pod: &crate::ledger::PodRecord) -> Result<(), crate::ledger::Unclean> {
        self.torn.borrow_mut().push(pod.pod.sandbox_id.clone());
        if let Some(act) = &self.meanwhile {
            act();
        }
        if self.fail {
            return Err("gpu 0 open outside the released pod".into());
        }
        Ok(())
    }
}

fn fail(step: &'static str) -> HookError {
    HookError::Stage(format!("fake {step} failure"))
}

impl ContainerOs for FakeOs {
    fn network(&self) -> crate::plan::PodNetwork {
        self.network
    }

    fn make_nodes(&mut self, _: &State, _: u32, nodes: &[DeviceNode]) -> Result<usize, HookError> {
        if self.fail == Some("nodes") {
            return Err(fail("nodes"));
        }
        self.nodes.extend_from_slice(nodes);
        Ok(nodes.len())
    }

    fn allow(&mut self, _: &State, _: u32, nodes: &[DeviceNode]) -> Result<(), HookError> {
        if self.fail == Some("allow") {
            return Err(fail("allow"));
        }
        self.allowed.extend_from_slice(nodes);
        Ok(())
    }

    fn attach(
        &mut self,
        _: &str,
        _: u32,
        networks: &[VfAttach],
        _: &dyn Fn(&'static str),
    ) -> Result<(), HookError> {
        if self.fail == Some("attach") {
            return Err(fail("attach"));
        }
        self.attached.extend_from_slice(networks);
        Ok(())
    }

    fn detach(&mut self, id: &str, checkpoint: &dyn Fn(&'static str)) -> Result<usize, HookError> {
        if self.fail == Some("detach") || self.refuse_detach == Some(id) {
            return Err(fail("detach"));
        }
        self.detached.borrow_mut().push(id.to_string());
        if let Some(store) = &self.store {
            for rec in store.for_container(id).unwrap() {
                store.remove(rec.vf()).unwrap();
            }
        }
        if let Some(effect) = &self.on_detach {
            effect();
        }
        checkpoint("fake-detached");
        Ok(std::mem::take(&mut self.attached).len())
    }

    fn gpu_teardown(
        &mut self,
        _: &Config,
        _: &Ledger,
        sandbox_id: &str,
        cgroups: &[String],
    ) -> Box<dyn Teardown> {
        self.teardowns.borrow_mut().push(TornDown {
            sandbox_id: sandbox_id.to_string(),
            cgroups: cgroups.to_vec(),
        });
        Box::new(FakeGpu {
            torn: Rc::clone(&self.gpu_torn),
            fail: self.fail == Some("gpu"),
            meanwhile: self.meanwhile.clone(),
        })
    }

    /// Cleans every GPU asked for, as the real retry does for idle ones, unless
    /// `fail` is "gpu" (one still open elsewhere).
    fn retry_quarantined(
        &mut self,
        _: &Config,
        ledger: &Ledger,
        uuids: &[String],
    ) -> Result<Vec<String>, GpuError> {
        self.retried.push(uuids.to_vec());
        if self.fail == Some("gpu") {
            return Ok(Vec::new());
        }
        for uuid in uuids {
            ledger
                .clear_quarantine(&crate::ledger::DeviceId::Gpu(uuid.clone()))
                .unwrap();
        }
        Ok(uuids.to_vec())
    }
}

pub(super) struct World {
    _dir: tempfile::TempDir,
    pub(super) fixture: Fixture,
    pub(super) env: HookEnv,
    pub(super) config: Config,
    /// [`HooksOnly::reap_until`] of every run: far off unless a test spends it.
    pub(super) reap_until: std::time::Instant,
}

pub(super) fn world() -> World {
    world_on(HostRootBuilder::hgx())
}

/// [`world`] on the host `builder` writes.
pub(super) fn world_on(builder: HostRootBuilder) -> World {
    let dir = tempfile::tempdir().unwrap();
    let fixture = builder.build(&dir.path().join("host")).unwrap();
    // A procfs where the test's container inits 7, 8 and 9 run.
    let proc_root = dir.path().join("proc");
    for pid in [7, 8, 9] {
        set_start(&proc_root, pid, Some(1000 + u64::from(pid)));
    }
    let env = HookEnv {
        host_root: fixture.root().to_path_buf(),
        state_dir: dir.path().join("state"),
        roots: NetnsRoots {
            proc_root,
            ..NetnsRoots::default()
        },
    };
    let mut config = Config::default();
    config.gpu.health_dir = dir.path().join("health");
    World {
        _dir: dir,
        fixture,
        env,
        config,
        reap_until: std::time::Instant::now() + std::time::Duration::from_secs(3600),
    }
}

impl World {
    /// GPU 0 and the second VF of the first NIC.
    pub(super) fn allocation(&self) -> String {
        let inv = self.fixture.expected();
        let (g, pf) = (&inv.gpus[0], &inv.rdma[0]);
        format!(
            r#"{{"gpu":[{{"minor":{},"id":"{}","resources":{{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}}}],"rdma":[{{"minor":0,"id":"{}","resources":{{"koordinator.sh/rdma":"1"}},"extension":{{"vfs":[{{"minor":-1,"busID":"{}"}}]}}}}]}}"#,
            g.minor, g.uuid, pf.bus_id, pf.vfs[1].bus_id
        )
    }

    pub(super) fn run(
        &self,
        stage: Stage,
        state: &State,
        os: &mut FakeOs,
    ) -> Result<Outcome, HookError> {
        self.run_with(stage, state, os, &|_| {})
    }

    /// [`World::run`] with `checkpoint` called at the hook's checkpoints.
    pub(super) fn run_with(
        &self,
        stage: Stage,
        state: &State,
        os: &mut FakeOs,
        checkpoint: &dyn Fn(&'static str),
    ) -> Result<Outcome, HookError> {
        let run = HooksOnly {
            env: &self.env,
            config: &self.config,
            os,
            checkpoint,
            reap_until: self.reap_until,
        };
        run_hooks_only(stage, state, run)
    }

    /// createRuntime of container `id` (init `pid`) carrying the world's allocation.
    pub(super) fn create_runtime(
        &self,
        id: &str,
        pid: u32,
        os: &mut FakeOs,
    ) -> Result<Outcome, HookError> {
        self.run(Stage::CreateRuntime, &self.creating(id, pid, &[]), os)
    }

    /// The state of container `id` (init `pid`) at its creation, carrying
    /// the world's allocation and the runtime's annotations `keys`.
    pub(super) fn creating(&self, id: &str, pid: u32, keys: &[(&str, &str)]) -> State {
        let alloc = self.allocation();
        let mut ann = vec![(crate::allocation::DEVICE_ALLOCATED, alloc.as_str())];
        ann.extend_from_slice(keys);
        state(id, "creating", Some(pid), &ann)
    }

    pub(super) fn ledger(&self) -> crate::ledger::LedgerState {
        Ledger::open(&self.env.state_dir)
            .unwrap()
            .snapshot()
            .unwrap()
    }

    /// Gives `pid` a `/proc/<pid>/cgroup` with `text`.
    pub(super) fn set_cgroup(&self, pid: u32, text: &str) {
        let dir = self.env.roots.proc_root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), text).unwrap();
    }
}

/// Gives `pid` a stat with start time `start` under `proc`, or removes it.
pub(super) fn set_start(proc: &Path, pid: u32, start: Option<u64>) {
    let dir = proc.join(pid.to_string());
    match start {
        Some(t) => {
            std::fs::create_dir_all(&dir).unwrap();
            let stat =
                format!("{pid} (init) S 0 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {t} 0 0\n");
            std::fs::write(dir.join("stat"), stat).unwrap();
        }
        None => {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

pub(super) fn state(
    id: &str,
    status: &str,
    pid: Option<u32>,
    annotations: &[(&str, &str)],
) -> State {
    let mut s = serde_json::json!({"ociVersion": "1.0.2", "id": id, "status": status,
        "bundle": "/nonexistent", "annotations": annotations.iter().cloned().collect::<BTreeMap<_, _>>()});
    if let Some(p) = pid {
        s["pid"] = p.into();
    }
    State::parse(s.to_string().as_bytes()).unwrap()
}

/// Whether a poststop's outcome released the pod.
pub(super) fn released_pod(out: &Outcome) -> bool {
    matches!(
        out,
        Outcome::Released {
            pod_released: true,
            ..
        }
    )
}
