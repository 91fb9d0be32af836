//! Real-runtime test harness: a private containerd per test (1.7 or 2.1, chosen
//! by `DEVGATE_TEST_RUNTIME`), driven over CRI the way kubelet drives it, with
//! images built locally from busybox-static and a stand-in CNI plugin. Every
//! resource is owned by an RAII guard.
//!
//! Included by each end-to-end test file with `mod support;`; each binary uses a
//! different subset, hence the module-level allowances for unused items below.
//!
//! ```ignore
//! let ctrd = Containerd::launch();                  // private containerd, images imported
//! let _plugin = DevgatePlugin::launch(&ctrd, &[]);  // `devgate nri`, registered
//! let cri = ctrd.cri();
//! let pod = cri.run_pod(&PodSpec::new("p").annotation("k", "v")).expect("RunPodSandbox");
//! let run = cri.run_container(&pod, &ContainerSpec::shell("c", "env")).expect("run");
//! assert!(run.log.contains("..."));
//! ```
#![allow(dead_code, unused_imports)]

mod cni;
mod containerd;
mod cri;
mod images;
pub mod node;
mod plugin;
mod process;
pub mod runtime;
mod spec;

use std::time::{Duration, Instant};

pub use containerd::Containerd;
pub use cri::{ContainerRun, Cri, Pod};
pub use images::{image_set, SANDBOX_IMAGE, WORKLOAD_IMAGE};
pub use plugin::{DevgatePlugin, DEVGATE};
pub use process::{pids_matching, run};
pub use runtime::Runtime;
pub use spec::{ContainerSpec, PodSpec};

/// Generous bound for anything that starts processes: a loaded 2-core machine
/// can take several seconds to start containerd, a shim and runc.
pub const SLOW: Duration = Duration::from_secs(60);

/// The end-to-end tests mount, create namespaces and start containerd: they need
/// root. Fail loudly instead of skipping so that a non-root run cannot pass.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "end-to-end tests need root (they start containerd, runc and network namespaces); run ./tests/run.sh as root"
    );
}

/// Polls `probe` every 50 ms until it returns `Some`, or panics after `timeout`
/// naming `what` so that a hang reads as a clear failure.
pub fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last `lines` lines of `text`, for failure output.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
