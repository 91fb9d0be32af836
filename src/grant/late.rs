//! An API server found after start. A node where devgate starts before it
//! joins the cluster (bootstrap before `kubeadm join`, a golden image joined
//! by cloud-init) has no kubelet kubeconfig yet, so the check resolves to off;
//! the join restarts neither devgate nor containerd. Unless `grant_check` is
//! `"off"`, the checker therefore looks again, at most every [`RETRY`], while
//! it has no API server, and starts the watch once one is there. A kubeconfig
//! still unusable (half written) is looked at again later: only a usable one
//! changes the mode.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::cache::PodCache;
use super::settings::{self, Mode};
use super::watch;
use crate::config::Config;

/// How often a checker without an API server looks for one.
pub const RETRY: Duration = Duration::from_secs(5);

/// Where to look, and what was found.
pub(super) struct LateMode {
    config: Config,
    host_root: PathBuf,
    kubelet_conf: PathBuf,
    next_try: Mutex<Instant>,
    found: OnceLock<Found>,
}

struct Found {
    mode: Mode,
    _watch: Option<watch::PodWatch>,
}

impl LateMode {
    pub(super) fn new(config: &Config, host_root: PathBuf, kubelet_conf: PathBuf) -> LateMode {
        LateMode {
            config: config.clone(),
            host_root,
            kubelet_conf,
            next_try: Mutex::new(Instant::now()),
            found: OnceLock::new(),
        }
    }

    /// The mode found since start, if any; looks again when it is time.
    pub(super) fn found(&self, cache: &Arc<PodCache>) -> Option<&Mode> {
        if let Some(f) = self.found.get() {
            return Some(&f.mode);
        }
        {
            let mut next = self.next_try.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if now < *next {
                return None;
            }
            *next = now + RETRY;
        }
        let mode = settings::resolve_on_host(&self.config, &self.host_root, &self.kubelet_conf);
        let Mode::Requests(ep) = mode else {
            return None;
        };
        tracing::info!(api = %ep.base, "grant check: an api server is configured now");
        let (mode, watch) = super::watch::start(ep, cache);
        // Only this thread gets here within one RETRY; a lost race keeps the first.
        let _ = self.found.set(Found {
            mode,
            _watch: watch,
        });
        self.found.get().map(|f| &f.mode)
    }
}
