//! What Configure sets from the runtime: the config it carries (when the
//! plugin takes its config from there), the runtime's features, and the
//! record `devgate status` shows.

use std::sync::{Arc, PoisonError};

use nri::RuntimeInfo;

use super::{features, DevgatePlugin};
use crate::config::Config;

impl DevgatePlugin {
    /// Puts an invalid config file in force: every container that asks
    /// devgate for devices is refused with its error, and the runtime
    /// record names it (`devgate ready` fails, `devgate status` shows it).
    /// Releases wait for a start with a valid config (see
    /// `lifecycle::Releaser`).
    pub fn refuse_for_config(&self, error: crate::config::ConfigError) {
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = Err(Arc::new(error));
    }

    /// Configure's work. Never fails: a bad config is reported here and on
    /// each container it affects.
    pub(super) fn take_runtime(&self, runtime: &RuntimeInfo) {
        if self.options.config_from_runtime {
            let state = Config::parse(&runtime.config, "from the runtime")
                .map(Arc::new)
                .map_err(Arc::new);
            match &state {
                // The log began in the default format; the runtime's config
                // names the one to keep.
                Ok(config) => {
                    crate::logging::set_format(config.log_format);
                    self.apply_gpu_config(&config.gpu);
                }
                Err(e) => {
                    tracing::error!(error = %nri::ErrorChain(e), "invalid plugin config; refusing containers that need devgate, and releasing no pod until a valid one")
                }
            }
            *self.config.write().unwrap_or_else(PoisonError::into_inner) = state;
        }
        // One read of the config in force, for all that follows.
        let config = self.config();
        if let Ok(config) = &config {
            self.enable_grant_check(config);
        }
        self.cap_grant_wait();
        let (mode, runtime_cdi) = config
            .as_ref()
            .map(|c| (c.device_mode, c.runtime_cdi))
            .unwrap_or_default();
        let features = features::detect(runtime, runtime_cdi);
        let mut record = features::RuntimeRecord::new(
            runtime,
            features,
            mode,
            runtime_cdi,
            &self.options.host_root,
        );
        record.config_error = config
            .err()
            .map(|e| nri::ErrorChain(&e).to_string().chars().take(1024).collect());
        tracing::info!(
            runtime = %runtime.name, version = %runtime.version,
            nri = ?runtime.nri_version, events = %runtime.events,
            request_timeout_ms = runtime
                .stated_request_timeout()
                .unwrap_or(super::budget::DEFAULT_REQUEST_TIMEOUT)
                .as_millis() as u64,
            explicit_cgroup_rules = features.explicit_cgroup_rules,
            cdi_devices = features.cdi_devices, devices_as = ?record.devices_as,
            "configured"
        );
        if self.options.config_from_runtime
            && runtime
                .nri_version
                .is_some_and(|v| !v.synchronizes_launched())
        {
            tracing::warn!(
                runtime = %runtime.name, version = %runtime.version, nri = ?runtime.nri_version,
                "this runtime's NRI (before v0.7) never synchronizes a plugin it launches: pods removed while devgate was not running keep their claims, refusing those devices to later pods, until a runtime synchronizes devgate; run it on the runtime's socket (for containerd, install/bootstrap.sh without --preinstalled), where every connection synchronizes, or use a runtime with NRI v0.7 or later (containerd 1.7.26, CRI-O 1.32)"
            );
        }
        if record.device_mode != record.devices_as {
            tracing::warn!(
                runtime = %runtime.name, version = %runtime.version,
                ?runtime_cdi,
                "device_mode = \"cdi\" but this runtime does not inject cdi devices; using device nodes"
            );
        }
        *self
            .features
            .write()
            .unwrap_or_else(PoisonError::into_inner) = features;
        // containerd 1.7 (the sandbox task's pid) and 2.x (the sandbox
        // status's, cleared at exit) alike; other runtimes are not relied on.
        let pid_zero = runtime.name == "containerd";
        self.stopped_pid_zero
            .store(pid_zero, std::sync::atomic::Ordering::Relaxed);
        // For `devgate status`; the plugin works the same without it.
        if let Err(e) = record.store(&self.options.state_dir) {
            tracing::warn!(error = %nri::ErrorChain(&e), "runtime record not saved");
        }
    }

    /// Fits the waits of the request being answered to how long the runtime
    /// waits for it, and says so when that changed.
    pub(super) fn fit_waits(&self) {
        self.budget.note_request();
        self.cap_grant_wait();
    }

    /// The grant check's wait for a pod the watch has not delivered is
    /// capped here; the other waits read the budget when they wait.
    fn cap_grant_wait(&self) {
        if let Some(grant) = self.devices.grant_checker() {
            grant.cap_wait(self.budget.waits().answer_by);
        }
    }
}
