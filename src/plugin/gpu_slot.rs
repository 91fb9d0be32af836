//! The plugin's GPU side (teardown, NVML, health store), replaceable once: a
//! plugin the runtime starts learns its config, `[gpu]` included, only at
//! Configure, after it was built with the defaults.

use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

use crate::config::GpuConfig;
use crate::gpu::{GpuTeardown, KnownPods};
use crate::inventory::Inventory;
use crate::ledger::{PodRecord, Teardown};

pub struct GpuSlot {
    gpu: RwLock<Arc<GpuTeardown>>,
    /// Outlives a rebuild: the pods are the runtime's, not the config's.
    known_pods: Arc<KnownPods>,
}

impl GpuSlot {
    pub fn new(gpu: GpuTeardown) -> GpuSlot {
        let known_pods = Arc::new(KnownPods::default());
        GpuSlot {
            gpu: RwLock::new(Arc::new(gpu.with_known_pods(Arc::clone(&known_pods)))),
            known_pods,
        }
    }

    pub fn get(&self) -> Arc<GpuTeardown> {
        Arc::clone(&self.gpu.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The node's pods as the runtime names them (`gpu.ignored_pods`).
    #[cfg(test)]
    pub fn known_pods(&self) -> &KnownPods {
        &self.known_pods
    }

    /// Records a daemon pod (`gpu.ignored_pods`), written for `devgate
    /// clear` when new. Teardown asks about no other pod, and a pod whose
    /// sandbox start a later NRI plugin refused gets no removal event: kept,
    /// such pods would fill the map on a node whose connection lasts weeks.
    pub fn note_pod(&self, pod: &nri::api::PodSandbox, state_dir: &Path) {
        if self.is_daemon(pod)
            && self
                .known_pods
                .note(&pod.id, &pod.uid, &pod.namespace, &pod.name)
        {
            self.save_daemons(state_dir);
        }
    }

    /// Forgets a removed sandbox; a daemon's is written for `devgate clear`.
    pub fn forget_pod(&self, pod: &nri::api::PodSandbox, state_dir: &Path) {
        if self.known_pods.forget(&pod.id) && self.is_daemon(pod) {
            self.save_daemons(state_dir);
        }
    }

    /// Exactly the runtime's daemon pods (Synchronize), written for `devgate clear`.
    pub fn sync_pods(&self, pods: &[nri::api::PodSandbox], state_dir: &Path) {
        let ids = pods.iter().map(|p| p.id.as_str()).collect();
        self.known_pods.keep_only(&ids);
        for pod in pods.iter().filter(|p| self.is_daemon(p)) {
            self.known_pods
                .note(&pod.id, &pod.uid, &pod.namespace, &pod.name);
        }
        self.save_daemons(state_dir);
    }

    /// Under the read lock, without a copy: it runs at every creation.
    fn is_daemon(&self, pod: &nri::api::PodSandbox) -> bool {
        let gpu = self.gpu.read().unwrap_or_else(PoisonError::into_inner);
        crate::gpu::is_daemon(&gpu.config().ignored_pods, &pod.namespace, &pod.name)
    }

    fn save_daemons(&self, state_dir: &Path) {
        let gpu = self.get();
        let path = state_dir.join(crate::gpu::DAEMON_PODS_FILE);
        if let Err(e) = self
            .known_pods
            .save_daemons(&gpu.config().ignored_pods, &path)
        {
            tracing::warn!(error = %nri::ErrorChain(&e), "daemon pods not saved: devgate clear counts them as users");
        }
    }

    /// Rebuilds the GPU side with `config` unless it is the one in force;
    /// true if it did. Call it before the first container: what the old one
    /// learnt about pods (their cgroups) is not carried over.
    pub fn reconfigure(
        &self,
        config: &GpuConfig,
        build: impl FnOnce(GpuConfig) -> GpuTeardown,
    ) -> bool {
        let mut slot = self.gpu.write().unwrap_or_else(PoisonError::into_inner);
        if slot.config() == config {
            return false;
        }
        *slot = Arc::new(build(config.clone()).with_known_pods(Arc::clone(&self.known_pods)));
        true
    }

    /// Hands a re-read inventory to teardown, which must know every GPU a pod
    /// was given (one that appeared after start-up, once its driver loaded).
    pub fn follow_inventory(&self, inventory: &Arc<Inventory>) {
        let gpu = self.get();
        if !Arc::ptr_eq(&gpu.inventory(), inventory) {
            gpu.set_inventory(Arc::clone(inventory));
        }
    }
}

/// The sandbox's cgroup paths as NRI gives them: `linux.cgroup_parent` (the
/// pod's cgroup under kubelet) and `linux.cgroups_path`; empty where absent.
fn pod_paths(pod: &nri::api::PodSandbox) -> [&str; 2] {
    let linux = pod.linux.as_ref();
    [
        linux.map(|l| l.cgroup_parent.as_str()).unwrap_or_default(),
        linux.map(|l| l.cgroups_path.as_str()).unwrap_or_default(),
    ]
}

/// The container's `linux.cgroups_path`; empty where absent.
fn container_path(ctr: &nri::api::Container) -> &str {
    ctr.linux
        .as_ref()
        .map(|l| l.cgroups_path.as_str())
        .unwrap_or_default()
}

/// The plugin's GPU teardown. On a node with GPUs, its health document is
/// made now when there is none, so that the check at every container creation
/// keeps a version to look at through its descriptor
/// (`HealthStore::current`) rather than walking the path each time.
pub(super) fn plugin_teardown(
    inventory: Arc<Inventory>,
    config: GpuConfig,
    ledger: crate::ledger::Ledger,
) -> GpuTeardown {
    let has_gpus = !inventory.gpus.is_empty();
    let teardown = GpuTeardown::for_node(inventory, config, ledger);
    if has_gpus {
        if let Err(e) = teardown.health().create_if_absent() {
            tracing::warn!(error = %nri::ErrorChain(&e), "gpu health: cannot write the health document");
        }
    }
    teardown
}

impl Teardown for GpuSlot {
    fn teardown(&self, pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
        self.get().teardown(pod)
    }

    fn kept(&self, pod: &PodRecord) {
        self.get().kept(pod);
    }
}

impl super::DevgatePlugin {
    /// Puts a runtime-sent `[gpu]` config in force: teardown, NVML and the
    /// health store are rebuilt with it (the plugin started with the
    /// defaults), and the health monitor starts.
    pub(super) fn apply_gpu_config(&self, config: &crate::config::GpuConfig) {
        let ledger = self.devices.ledger().clone();
        let inventory = self.devices.inventory();
        if self
            .gpu
            .reconfigure(config, |c| plugin_teardown(inventory, c, ledger))
        {
            tracing::info!(health_dir = %config.health_dir.display(), nvml = config.nvml, "gpu config from the runtime");
            self.devices
                .set_nvml(config.nvml.then(|| config.nvml_library.clone()));
            // NVML's facts are read off the handler: loading and initialising
            // it can take long, and Configure must answer within the
            // runtime's timeout (containerd 1.7 exits when a plugin it
            // started fails it). Until then the inventory has the GPUs
            // without them.
            if config.nvml && !self.devices.inventory().gpus.is_empty() {
                let devices = Arc::clone(&self.devices);
                std::thread::spawn(move || drop(devices.refresh()));
            }
        }
        self.start_gpu_health(config);
    }

    /// What GPU teardown and health need to know of a pod given devices: its
    /// cgroups (teardown ends leftover processes of this pod only), and GPUs
    /// that appeared after start-up (the driver loaded later).
    pub(super) fn note_device_pod(
        &self,
        pod: &nri::api::PodSandbox,
        ctr: &nri::api::Container,
        config: &GpuConfig,
    ) {
        // An absent path (empty) names no cgroup: `PodCgroups::from_paths` drops it.
        let [parent, sandbox] = pod_paths(pod);
        let paths = [parent, sandbox, container_path(ctr)];
        self.gpu.get().set_pod_cgroups(&pod.id, &paths);
        let inventory = self.devices.inventory();
        self.gpu.follow_inventory(&inventory);
        if !inventory.gpus.is_empty() {
            self.start_gpu_health(config);
        }
    }

    /// RemoveContainer: the container's own cgroup is gone with it.
    pub(super) fn forget_container_cgroup(
        &self,
        pod: &nri::api::PodSandbox,
        ctr: &nri::api::Container,
    ) {
        let path = container_path(ctr);
        if !path.is_empty() {
            self.gpu
                .get()
                .forget_container_cgroup(&pod.id, &pod_paths(pod), &ctr.id, path);
        }
    }
}
