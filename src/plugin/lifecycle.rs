//! Releasing claims: at pod stop/removal and, at Synchronize, for pods the runtime
//! no longer has. Teardown (process cleanup, VF restore) may take seconds, longer
//! than the runtime's 2 s request timeout, so it runs on a blocking thread and the
//! event is answered at once; the ledger keeps the claims until it is done.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::gpu::{HealthMonitor, HealthPolicy};

use crate::ledger::{Failed, Gone, GuardedRelease, Ledger, Released, Teardown};

use super::DevgatePlugin;

/// Which pods to release.
#[derive(Debug, Clone)]
pub enum Release {
    Pod(String),
    /// Pods taken for gone: by a Synchronize, or whose release failed (see
    /// [`Unreleased`]); each released only while no container joined it.
    Pods(Gone),
}

impl Release {
    /// The sandbox ids it names, each with the containers admitted into it
    /// when it was taken for gone (`None` where unknown, and for a stop).
    pub fn pods(&self) -> impl Iterator<Item = (&String, Option<u32>)> {
        let (one, many) = match self {
            Release::Pod(id) => (Some((id, None)), None),
            Release::Pods(pods) => (None, Some(pods)),
        };
        let many = many.into_iter().flatten().map(|(id, n)| (id, *n));
        one.into_iter().chain(many)
    }

    /// The sandbox ids it names.
    pub fn ids(&self) -> impl Iterator<Item = &String> {
        self.pods().map(|(id, _)| id)
    }
}

#[path = "lifecycle_unreleased.rs"]
mod unreleased;
pub use unreleased::Unreleased;

/// Runs one release and logs its outcome; returns it for tests.
pub fn release(ledger: &Ledger, teardown: &dyn Teardown, which: &Release) -> Option<Released> {
    let result = match which {
        Release::Pod(id) => ledger.release_pod(id, teardown),
        Release::Pods(pods) => ledger.release_pods(pods, teardown),
    };
    match result {
        Ok(released) => {
            for pod in &released.pods {
                tracing::info!(pod = %pod, sandbox = %pod.sandbox_id, "released devices");
            }
            for Failed {
                pod, reason, kept, ..
            } in &released.failed
            {
                let kept: Vec<String> = kept.iter().map(ToString::to_string).collect();
                tracing::error!(pod = %pod, sandbox = %pod.sandbox_id, reason = %reason, kept = ?kept, "teardown failed: the devices kept stay the pod's, quarantined, and are retried; any others of the pod are released");
            }
            Some(released)
        }
        Err(e) => {
            tracing::error!(error = %nri::ErrorChain(&e), "release failed; retried in the background");
            None
        }
    }
}

/// What a release needs, for the thread that runs it.
struct Releaser {
    devices: Arc<super::devices::Devices>,
    teardown: Arc<dyn Teardown + Send + Sync>,
    unreleased: Arc<Unreleased>,
    gpu: Arc<super::gpu_slot::GpuSlot>,
    config: Arc<std::sync::RwLock<super::ConfigState>>,
}

impl Releaser {
    /// Whether `job` waits for a start with a valid config: while the config
    /// in force is invalid, no release that tears down runs, since a
    /// teardown follows `[gpu]`, which is unknown then, and the defaults in
    /// its place would tear GPUs down as the operator did not ask (MIG
    /// instances destroyed, clocks and compute mode reset, the operator's
    /// ignored daemons taken for leftovers, another NVML library). Its pods
    /// keep their claims, unquarantined, as the pods that end while no
    /// plugin runs do, and that start releases them (the runtime no longer
    /// lists them, or containerd lists them stopped).
    fn left_for_a_valid_config(&self, job: &Release) -> bool {
        if self
            .config
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_ok()
        {
            return false;
        }
        let pods: Vec<&str> = job.ids().map(String::as_str).collect();
        tracing::warn!(?pods, "invalid config: nothing torn down or released; a start with a valid config releases these pods");
        true
    }

    /// Runs one release and records its outcome for the retry round.
    fn run(&self, job: &Release) {
        if self.left_for_a_valid_config(job) {
            return;
        }
        let released = release(self.devices.ledger(), self.teardown.as_ref(), job);
        self.unreleased.update(job, released.as_ref());
        // A pod the plugin did not tear down (its claims went another way,
        // or it had none) leaves its cgroup paths behind otherwise, in a
        // release naming many pods (a retry, a Synchronize) as in one naming
        // one; GPU teardown forgets those of the pods it ran for. A pod the
        // release left (a retry's pod that admitted a container since) is
        // live: the ledger still holds it.
        if let Some(r) = &released {
            let gpu = self.gpu.get();
            let ledger = self.devices.ledger();
            let kept = |id: &str| {
                r.failed.iter().any(|f| f.pod.sandbox_id == id)
                    || r.joined.iter().any(|p| p.pod.sandbox_id == id)
                    || (!r.pods.iter().any(|p| p.sandbox_id == id)
                        && ledger.holds(id).unwrap_or(true))
            };
            job.ids()
                .filter(|id| !kept(id))
                .for_each(|id| gpu.forget_pod(id));
        }
    }

    /// Releases sandbox `id` now, unless a container of it is recorded by
    /// then. One that fails is retried by the retry round, whose release
    /// checks no container set, only where `ended`: no container can join a
    /// sandbox that ended (containerd admits none into a stopped one). A live
    /// sandbox's failure keeps its claims, the devices quarantined, for its
    /// stop's release or its next refused container.
    ///
    /// A live sandbox's claims go back without a teardown: none of its
    /// containers was ever given the devices (no VF moved, no GPU opened
    /// through devgate), and a teardown, which ends the pod's processes
    /// holding a GPU and resets it, runs before the guard's look: the pod's
    /// next container, admitted meanwhile, would start under it.
    fn run_unjoined(&self, id: &str, ended: bool) {
        if ended && self.left_for_a_valid_config(&Release::Pod(id.to_string())) {
            return;
        }
        let ledger = self.devices.ledger();
        let teardown: &dyn Teardown = match ended {
            true => self.teardown.as_ref(),
            false => &crate::ledger::NoTeardown,
        };
        self.unjoined_done(id, ended, ledger.release_pod_unjoined(id, 0, teardown));
    }

    /// [`Self::run_unjoined`] for a live sandbox on the stub's own thread
    /// (no worker could start): only if no other release holds a turn of
    /// its devices, which another pod's teardown may keep past the
    /// runtime's deadline; else its claim stays for its stop's release or
    /// its next container.
    fn run_unjoined_now(&self, id: &str) {
        let released = self.devices.ledger().release_pod_unjoined_now(id, 0);
        self.unjoined_done(id, false, released);
    }

    fn unjoined_done(
        &self,
        id: &str,
        ended: bool,
        released: Result<GuardedRelease, crate::ledger::LedgerError>,
    ) {
        let retry = |admitted: Option<u32>| {
            if !ended {
                return;
            }
            match admitted {
                Some(n) => self.unreleased.failed(id, n),
                None => self.unreleased.update(&Release::Pod(id.to_string()), None),
            }
        };
        match released {
            Ok(GuardedRelease::Released(pod)) => {
                tracing::info!(pod = %pod.pod, sandbox = %id, "released devices");
                // A live sandbox's cgroups stay: a container admitted once the
                // release's locks dropped may have noted them already.
                if ended {
                    self.gpu.get().forget_pod(id);
                }
            }
            Ok(GuardedRelease::Changed) => {
                tracing::info!(sandbox = %id, "a container joined the sandbox: its claims stay");
            }
            Ok(GuardedRelease::Absent) => {}
            Ok(GuardedRelease::Busy) => {
                tracing::warn!(sandbox = %id, "another release holds a device of the sandbox: its claim stays until its stop or its next container");
            }
            Ok(GuardedRelease::Failed { pod, reason }) => {
                tracing::error!(pod = %pod.pod, sandbox = %id, reason = %reason, retried = ended, "teardown failed: the devices kept stay the pod's, quarantined");
                retry(Some(pod.admitted()));
            }
            Err(e) => {
                tracing::error!(sandbox = %id, error = %nri::ErrorChain(&e), retried = ended, "release failed");
                retry(None);
            }
        }
    }
}

pub fn forget_container(devices: &super::devices::Devices, sandbox_id: &str, container_id: &str) {
    let away = |pod: &crate::ledger::PodRecord| devices.vfs_away(pod);
    if let Err(e) = devices
        .ledger()
        .remove_container(sandbox_id, container_id, &away)
    {
        tracing::error!(error = %nri::ErrorChain(&e), sandbox = %sandbox_id, container = %container_id, "forget container");
    }
}

impl DevgatePlugin {
    /// Starts the GPU health monitor (NVML events, ECC, retired pages) on a thread
    /// of its own, since it blocks waiting for events. A node without GPUs, or with
    /// NVML turned off, gets none: nothing to watch, and no library to load.
    pub fn start_gpu_health(&self, config: &crate::config::GpuConfig) {
        // Once: called at start, at a runtime-started plugin's Configure, and
        // for each container given GPUs, in case they appeared since.
        if self.health_started.load(Ordering::Relaxed) || !config.nvml {
            return;
        }
        let inventory = self.devices.inventory();
        if inventory.gpus.is_empty() || self.health_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let gpu = self.gpu.get();
        let devices = Arc::clone(&self.devices);
        let monitor = HealthMonitor::new(
            gpu.nvml(),
            gpu.health().clone(),
            &inventory,
            HealthPolicy::from_config(config),
        )
        .following(move || {
            let inventory = devices.inventory();
            inventory.gpus.iter().map(|g| g.uuid.clone()).collect()
        });
        std::thread::spawn(move || monitor.run(&AtomicBool::new(false)));
    }

    /// Retries, every `gpu.health_interval_secs`, for ever: first the pods whose teardown
    /// failed (their claims go once it succeeds), then quarantined GPUs no pod
    /// holds. One quarantined for a leftover process returns to service once
    /// that process is gone. Runs on a thread of its own; with nothing
    /// quarantined a round is one ledger read.
    pub fn retry_quarantined_every(&self) {
        loop {
            let secs = self.gpu.get().config().health_interval_secs;
            self.round_wake.wait(Duration::from_secs(secs.max(1)));
            self.retry_round();
        }
    }

    /// One round of [`Self::retry_quarantined_every`].
    pub fn retry_round(&self) {
        if let Some(stale) = self.resync.stale(self.devices.ledger()) {
            self.release_stale(stale);
        }
        if let Some(which) = self.unreleased.retry() {
            let _running = self.releases.enter(&which);
            self.releaser().run(&which);
        }
        // After the retries: one whose release fails now waits for the next
        // round, as a failure in the background does.
        self.release_ended_sandboxes();
        // Its cleanup follows `[gpu]`, unknown under an invalid config.
        if self.config().is_err() {
            return;
        }
        match self.gpu.get().retry_quarantined(self.devices.ledger()) {
            Ok(cleared) => cleared
                .iter()
                .for_each(|uuid| tracing::info!(gpu = %uuid, "gpu back in service")),
            Err(e) => tracing::warn!(error = %nri::ErrorChain(&e), "gpu quarantine retry"),
        }
    }

    fn releaser(&self) -> Releaser {
        Releaser {
            devices: Arc::clone(&self.devices),
            teardown: Arc::clone(&self.teardown),
            unreleased: Arc::clone(&self.unreleased),
            gpu: Arc::clone(&self.gpu),
            config: Arc::clone(&self.config),
        }
    }

    /// Releases a stopped or removed pod on a worker; one the ledger holds
    /// nothing of (its stop released it, or it claimed nothing) needs no
    /// release, only its GPU cgroup paths forgotten, as a release would.
    /// Nothing can claim for it any more: its sandbox is going.
    pub(super) fn release_pod(&self, sandbox_id: &str) {
        match self.devices.ledger().holds(sandbox_id) {
            Ok(false) => self.gpu.get().forget_pod(sandbox_id),
            _ => self.release_in_background(Release::Pod(sandbox_id.to_string())),
        }
    }

    /// Releases what a failed start of `pod`'s sandbox left claimed (see
    /// [`crate::ledger::Ledger::superseded`]), on a worker: were it kept, the
    /// pod's devices would stay held by itself until the next Synchronize.
    /// The claim at this start may come before the release ends; the first
    /// container then makes it (kubelet retries a refused one).
    pub(super) fn release_superseded(&self, pod: &nri::api::PodSandbox) {
        let superseded = match self.devices.ledger().superseded(&pod.uid, &pod.id) {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %nri::ErrorChain(&e), "ledger unreadable: superseded sandboxes not looked for");
                return;
            }
        };
        for id in superseded {
            tracing::warn!(namespace = %pod.namespace, pod = %pod.name, sandbox = %id, "releasing a sandbox of the pod whose start failed after its claim");
            self.release_in_background(Release::Pod(id));
        }
    }

    /// Releases the claims of sandboxes that ended with no container after
    /// their start claimed (see `ahead_inits`): the runtime reports nothing
    /// more for one whose start another NRI plugin refused. On the retry
    /// round's thread, each only while still no container is recorded:
    /// containerd admits none into a stopped sandbox, but the look and the
    /// release are apart.
    fn release_ended_sandboxes(&self) {
        if self.ahead_inits.is_empty() {
            return;
        }
        let ledger = self.devices.ledger();
        let mark = self.ahead_inits.mark();
        let ended = match ledger.snapshot() {
            Ok(state) => self.ahead_inits.ended(&state, mark),
            Err(e) => {
                tracing::warn!(error = %nri::ErrorChain(&e), "ledger unreadable: ended sandboxes not looked for");
                return;
            }
        };
        let releaser = self.releaser();
        for id in ended {
            tracing::warn!(sandbox = %id, "releasing a sandbox that ended with no container after its start claimed (its start failed after devgate's part)");
            let _running = self.releases.enter(&Release::Pod(id.clone()));
            releaser.run_unjoined(&id, true);
        }
    }

    /// Releases the claim of the pod whose container was just refused, where
    /// no container of the pod was ever recorded: a claim made at the
    /// sandbox's start, ahead of a container refused for what only the
    /// container shows (its own variables, a GPU turned unhealthy since). A
    /// refusal claims nothing; kubelet's retry claims again. A live pod whose
    /// earlier containers were removed keeps its devices: they are its own
    /// until its sandbox stops. Guarded under the ledger's lock, so that a
    /// pod a container joined meanwhile keeps its claims.
    pub(super) fn release_refused(&self, sandbox_id: &str) {
        let unjoined = |state: &crate::ledger::LedgerState| {
            state.pods.get(sandbox_id).is_some_and(|p| p.unjoined(0))
        };
        match self.devices.ledger().snapshot() {
            Ok(state) if unjoined(&state) => {
                tracing::info!(sandbox = %sandbox_id, "releasing the claim made ahead of a refused container");
                // On a worker, as every teardown: the stub's thread answers on.
                let releaser = self.releaser();
                let id = sandbox_id.to_string();
                let running = self.releases.enter(&Release::Pod(id.clone()));
                let job = Box::new(move || {
                    let _running = running;
                    releaser.run_unjoined(&id, false);
                });
                if let Err(job) = self.release_workers.submit(job) {
                    // It tears nothing down (the pod is live), but another
                    // release may hold its devices' turns for seconds.
                    tracing::warn!("no thread to release on: releasing now unless another release holds the devices");
                    self.releaser().run_unjoined_now(sandbox_id);
                    // Its count of the release running ends only now.
                    drop(job);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(sandbox = %sandbox_id, error = %nri::ErrorChain(&e), "ledger unreadable: a refused container's claim kept until its pod's release");
            }
        }
    }

    /// Releases the claims of pods the runtime no longer has.
    pub(super) fn release_stale(&self, stale: Gone) {
        if !stale.is_empty() {
            tracing::info!(
                pods = stale.len(),
                "releasing pods the runtime no longer has"
            );
            self.release_in_background(Release::Pods(stale));
        }
    }

    pub(super) fn release_in_background(&self, which: Release) {
        let releaser = self.releaser();
        let running = self.releases.enter(&which);
        // On a worker: the stub's thread must keep answering the runtime
        // while teardown waits on processes.
        let pods = which.clone();
        let job = Box::new(move || {
            let _running = running;
            releaser.run(&which);
        });
        // Never on the caller's thread: the stub's must answer within the
        // runtime's deadline, and a teardown may wait seconds on processes.
        // The retry round (its own thread) tries every pod of it instead.
        if self.release_workers.submit(job).is_err() {
            self.unreleased.update(&pods, None);
            // Now, not an interval later: until it runs, a creation wanting
            // these devices is refused rather than waiting for them.
            self.round_wake.wake();
            tracing::warn!(
                pods = pods.ids().count(),
                "no thread to release on: left to the retry round, started now"
            );
        }
    }

    /// Waits up to `limit` for releases still running (before an exit); true if
    /// none is left.
    pub fn wait_for_releases(&self, limit: Duration) -> bool {
        self.releases.wait_idle(limit)
    }
}
