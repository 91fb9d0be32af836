//! devgate's NRI plugin: what happens to a container at CreateContainer.
//!
//! What a container is given is decided in one place, `admit.rs`; each source
//! of changes (the device plan from `crate::plan`, and the `devgate.io/probe`
//! diagnostic) contributes there. A container given its pod's prepared
//! adjustment as it is gets the reply encoded once with the plan.
//! Pod removal and Synchronize release claims through [`lifecycle`].
//! Errors leave the plugin as ttrpc statuses through [`nri::RpcError`],
//! implemented once for [`PluginError`].

pub mod adjust;
mod admit;
mod ahead_inits;
pub mod budget;
mod configure;
pub mod devices;
mod errors;
mod exit;
pub mod features;
mod gpu_slot;
mod hook_path;
mod in_flight;
mod last_plan;
mod lifecycle;
mod live_pods;
pub mod probe;
pub mod reads;
mod resync;
mod round_wake;
mod stopped_pods;
mod unapplied;
pub mod unapplied_record;
mod vf_finish;
mod vf_teardown;
mod workers;

use std::{
    path::PathBuf,
    sync::{Arc, PoisonError, RwLock},
};

use nri::{
    api::{Container, ContainerUpdate, CreateContainerResponse, Event, PodSandbox},
    stub::CreateReply,
    EventMask, RuntimeInfo,
};

use crate::config::{Config, ConfigError};
use crate::gpu::GpuTeardown;
use crate::ledger::{LedgerError, Teardown, Teardowns};
use devices::RuntimeFeatures;
pub use devices::POLL_PERIOD;
pub use errors::PluginError;
use gpu_slot::GpuSlot;
use hook_path::default_hook_path;
pub use hook_path::{hook_beside, INSTALLED_HOOK};

/// The events devgate subscribes to: a sandbox's start claims its pod's
/// devices, creation applies a plan; container and pod removal release what
/// they applied.
pub const EVENTS: EventMask = EventMask::of(Event::RUN_POD_SANDBOX)
    .with(Event::CREATE_CONTAINER)
    .with(Event::STOP_POD_SANDBOX)
    .with(Event::REMOVE_POD_SANDBOX)
    .with(Event::REMOVE_CONTAINER);

/// Node paths and mode the plugin runs with.
#[derive(Debug, Clone)]
pub struct PluginOptions {
    /// Root holding the host's `sys/` and `proc/`.
    pub host_root: PathBuf,
    /// Directory of claims and saved device state.
    pub state_dir: PathBuf,
    /// Take the config from `ConfigureRequest.config` (runtime-launched
    /// plugins have no command line and get their drop-in file that way).
    pub config_from_runtime: bool,
}

/// The config in force, or why the runtime's config was refused.
type ConfigState = Result<Arc<Config>, Arc<ConfigError>>;

pub struct DevgatePlugin {
    /// Shared with the releases, which wait while it is invalid
    /// (`lifecycle::Releaser`).
    config: Arc<RwLock<ConfigState>>,
    options: PluginOptions,
    devices: Arc<devices::Devices>,
    features: RwLock<RuntimeFeatures>,
    gpu: Arc<GpuSlot>,
    /// Run before a pod's claims are dropped: GPU cleanup, VF restore.
    teardown: Arc<dyn Teardown + Send + Sync>,
    /// The VF restore a pod's stop runs before its reply.
    stop_vfs: vf_teardown::VfTeardown,
    /// Releases running in the background.
    releases: Arc<in_flight::InFlight>,
    /// The threads they run on.
    release_workers: workers::Workers,
    /// Pods whose teardown failed, retried in the background.
    unreleased: Arc<lifecycle::Unreleased>,
    /// Starts the retry thread's next round early.
    round_wake: round_wake::RoundWake,
    /// A Synchronize whose gone pods are still to be looked for.
    resync: resync::PendingSync,
    /// Containers running without their allocation, for `devgate status`.
    unapplied: unapplied_record::UnappliedRecord,
    /// The GPU health monitor runs (it starts once).
    health_started: std::sync::atomic::AtomicBool,
    /// The runtime reports a stopped sandbox with pid 0 (containerd).
    stopped_pid_zero: std::sync::atomic::AtomicBool,
    /// Sandboxes claimed at their start that no container joined yet.
    ahead_inits: ahead_inits::AheadInits,
    /// Files mapped before the plugin loaded anything on demand.
    startup_files: crate::residency::StartupFiles,
    /// The runtime's request timeout, which bounds the waits of a request.
    budget: budget::Budget,
}

impl DevgatePlugin {
    /// Reads the inventory and opens the ledger under `options.state_dir`.
    pub fn new(config: Config, options: PluginOptions) -> Result<DevgatePlugin, LedgerError> {
        // Before anything below can load a library (NVML).
        let startup_files = crate::residency::StartupFiles::capture(std::path::Path::new("/proc"));
        // A runtime-started plugin loads no NVML until Configure says whether
        // to (`gpu.nvml`).
        let gpu_config = crate::config::GpuConfig {
            nvml: config.gpu.nvml && !options.config_from_runtime,
            ..config.gpu.clone()
        };
        let devices = devices::Devices::open(
            &options.host_root,
            &options.state_dir,
            default_hook_path(),
            gpu_config.nvml.then(|| gpu_config.nvml_library.clone()),
        )?;
        // A runtime-started plugin's `[gpu]` section, its health directory
        // included, comes with Configure.
        let build = if options.config_from_runtime {
            GpuTeardown::for_node
        } else {
            gpu_slot::plugin_teardown
        };
        let gpu = Arc::new(GpuSlot::new(build(
            devices.inventory(),
            gpu_config,
            devices.ledger().clone(),
        )));
        let teardown: Arc<dyn Teardown + Send + Sync> = Arc::new(Teardowns(vec![
            // VFs first: a VF's RDMA device and netdev go back before the
            // GPU cleanup ends any leftover process of the pod.
            Box::new(vf_teardown::VfTeardown::new(
                options.state_dir.clone(),
                &options.host_root,
            )),
            Box::new(Arc::clone(&gpu)),
        ]));
        let unapplied = unapplied_record::UnappliedRecord::new(&options.state_dir);
        let stop_vfs = vf_teardown::VfTeardown::new(options.state_dir.clone(), &options.host_root);
        Ok(DevgatePlugin {
            config: Arc::new(RwLock::new(Ok(Arc::new(config)))),
            options,
            devices: Arc::new(devices),
            features: RwLock::new(RuntimeFeatures::default()),
            gpu,
            teardown,
            stop_vfs,
            releases: Arc::default(),
            release_workers: workers::Workers::default(),
            unreleased: Arc::default(),
            round_wake: Default::default(),
            resync: Default::default(),
            unapplied,
            health_started: Default::default(),
            stopped_pid_zero: Default::default(),
            ahead_inits: ahead_inits::AheadInits::new("/proc".into()),
            startup_files,
            budget: budget::Budget::default(),
        })
    }

    /// Reads the host again whenever the kernel reports a device change
    /// (see [`crate::inventory::uevents`]).
    pub fn watch_host_changes(
        &self,
        sock: crate::inventory::uevents::UeventSocket,
    ) -> std::io::Result<()> {
        self.devices.watch_host(sock)
    }

    /// Reads the host again every `period`, where its uevents cannot be read.
    pub fn poll_host_changes(&self, period: std::time::Duration) -> std::io::Result<()> {
        self.devices.poll_host(period)
    }

    /// Starts the grant check (`crate::grant`, with its pod watch when the config
    /// asks for one). The first call wins: the watch outlives reconnections.
    pub fn enable_grant_check(&self, config: &Config) {
        if self.devices.grant_checker().is_none() {
            let checker = crate::grant::GrantChecker::start(config, &self.options.state_dir);
            self.devices.set_grant_checker(Arc::new(checker));
        }
    }

    /// Before the process exits: writes the grant decision counters, and
    /// folds the ledger's journal into its document, which then reads whole
    /// on its own (to people, and to a release from before the journal).
    pub fn flush_at_exit(&self) {
        if let Some(grant) = self.devices.grant_checker() {
            grant.flush_audit();
        }
        if let Err(e) = self.devices.ledger().fold_journal() {
            tracing::warn!(error = %nri::ErrorChain(&e), "ledger journal not folded at exit");
        }
    }

    /// GPU cleanup and health of this node.
    pub fn gpu(&self) -> Arc<GpuTeardown> {
        self.gpu.get()
    }

    pub fn devices(&self) -> &devices::Devices {
        &self.devices
    }

    pub fn options(&self) -> &PluginOptions {
        &self.options
    }

    /// The config in force; an error if the runtime sent an invalid one.
    pub fn config(&self) -> ConfigState {
        self.config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What every creation notes before it can claim: its pod exists, so a
    /// Synchronize retry owed (`resync`) counts it live, as it does a pod
    /// run since; the GPU bookkeeping of its pod.
    fn note_creation(&self, pod: &PodSandbox) {
        self.fit_waits();
        self.resync.note_run(&pod.id);
        self.gpu.note_pod(pod, &self.options.state_dir);
    }
}

impl nri::Plugin for DevgatePlugin {
    type Error = PluginError;

    fn events(&self) -> EventMask {
        EVENTS
    }

    /// devgate reads the pod's identity, cgroup paths and the labels and
    /// annotations [`reads::LEAN`] names, and the container's
    /// identity, env and cgroup path: nothing else of a request needs
    /// building on the container-start path.
    fn decode(&self) -> nri::Decode {
        nri::Decode::Lean(reads::LEAN)
    }

    /// Never fails: containerd 1.7 exits when a plugin it launched fails
    /// Configure ("failed to start NRI interface", fatal for CRI), so a bad
    /// drop-in file is reported here and on each container it affects.
    fn configure(&self, runtime: &RuntimeInfo) -> Result<(), PluginError> {
        self.take_runtime(runtime);
        Ok(())
    }

    /// The runtime's record says so until a runtime configures the plugin
    /// again, so that a readiness probe does not count a plugin no runtime
    /// holds.
    fn on_close(&self) {
        match features::RuntimeRecord::note_disconnected(&self.options.state_dir) {
            Ok(true) => {
                tracing::info!("runtime connection closed; recorded until the next configure")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %nri::ErrorChain(&e), "runtime record not marked disconnected")
            }
        }
    }

    fn create_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<CreateContainerResponse, PluginError> {
        self.note_creation(pod);
        let adjustment = self.adjustment(pod, ctr)?;
        self.unapplied.forget_replaced(&pod.id, &ctr.name);
        Ok(adjust::create_response(adjustment))
    }

    /// A container given its pod's prepared adjustment as it is gets the
    /// reply encoded with it.
    fn create_container_reply(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<CreateReply, PluginError> {
        self.note_creation(pod);
        let (admitted, probe) = self.admitted(pod, ctr)?;
        self.unapplied.forget_replaced(&pod.id, &ctr.name);
        tracing::debug!(
            namespace = %pod.namespace, pod = %pod.name, container = %ctr.name,
            "adjusted container"
        );
        if let (Some(reply), None) = (admitted.encoded(), &probe) {
            return Ok(CreateReply::Encoded(reply.clone()));
        }
        Ok(CreateReply::Message(adjust::create_response(
            admit::combined(admitted, probe),
        )))
    }

    fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        // The pods to release are chosen now, before the reply: a pod admitted
        // once the runtime is synchronized must never be taken for a gone one.
        let stopped_pid_zero = self
            .stopped_pid_zero
            .load(std::sync::atomic::Ordering::Relaxed);
        self.gpu.sync_pods(&pods, &self.options.state_dir);
        self.devices
            .pods_listed(&pods.iter().map(|p| p.id.as_str()).collect());
        let live = live_pods::live_pods(&pods, &containers, stopped_pid_zero);
        // One read of the ledger for both: the pods gone, and the containers
        // it records (the others run without their allocation). The report
        // parses annotations and logs: outside the read, which holds the
        // ledger's cache.
        let read = self.devices.ledger().stale_pods_and(&live, |ledger| {
            containers
                .iter()
                .filter(|c| {
                    // A container the hook set up (hooks.d beside NRI while
                    // the plugin was down) has its nodes made by the hook,
                    // never in the spec; `by_plugin` also knows such records
                    // from before `hooks_only` existed.
                    ledger
                        .container(&c.id)
                        .is_some_and(|rec| !rec.by_plugin() || unapplied::carries(c, &rec.devices))
                })
                .map(|c| c.id.clone())
                .collect::<std::collections::HashSet<String>>()
        });
        match read {
            Ok((stale, recorded)) => {
                let found = unapplied::report(&pods, &containers, |id| recorded.contains(id));
                self.unapplied.set(found);
                self.resync.clear();
                self.release_stale(stale);
            }
            Err(e) => {
                tracing::error!(error = %nri::ErrorChain(&e), "synchronize: ledger unreadable; gone pods are looked for again at each retry round");
                self.resync.keep(live);
            }
        }
        // Start-up is over: keep only the code the plugin still runs resident.
        match crate::residency::shed_file_pages(std::path::Path::new("/proc"), &self.startup_files)
        {
            Ok(bytes) => tracing::debug!(bytes, "dropped start-up pages"),
            Err(e) => tracing::debug!(error = %nri::ErrorChain(&e), "start-up pages kept"),
        }
        Ok(Vec::new())
    }

    /// Never fails: a refusal is the first container's (see `devices::ahead`).
    fn run_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), PluginError> {
        self.fit_waits();
        self.resync.note_run(&pod.id);
        self.gpu.note_pod(pod, &self.options.state_dir);
        self.release_superseded(pod);
        self.claim_ahead(pod);
        Ok(())
    }

    fn stop_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), PluginError> {
        self.ahead_inits.forget(&pod.id);
        self.devices.pod_stopped(&pod.id);
        self.stop_vfs.restore_before_stop(
            self.devices.ledger(),
            &pod.id,
            &self.releases,
            self.budget.waits().stop_restore,
        );
        self.release_pod(&pod.id);
        Ok(())
    }

    fn remove_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), PluginError> {
        self.ahead_inits.forget(&pod.id);
        self.devices.pod_removed(&pod.id);
        self.gpu.forget_pod(pod, &self.options.state_dir);
        self.unapplied.forget(&pod.id, None);
        self.release_pod(&pod.id);
        Ok(())
    }

    fn remove_container(&self, pod: &PodSandbox, ctr: &Container) -> Result<(), PluginError> {
        lifecycle::forget_container(&self.devices, &pod.id, &ctr.id);
        self.forget_container_cgroup(pod, ctr);
        self.unapplied.forget(&pod.id, Some(&ctr.id));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
