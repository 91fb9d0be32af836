//! Tests of GPU teardown: against fakes, and against real processes and cgroups.

mod daemons;
pub mod fake_host;
mod forking;
mod no_nvml;
mod partial;
mod real_forked;
pub(super) mod real_proc;
mod real_recreated;
mod real_threads;
mod recreated;
mod scan_threads;
mod teardown;
mod teardown_shared;

use crate::fixture::HostRootBuilder;
use crate::inventory::Inventory;
use crate::ledger::PodRef;

/// The fixture's GPUs with the given minors and `nvidia` major, renamed `GPU-<i>`.
pub fn gpu_inventory(major: u32, minors: &[u32]) -> Inventory {
    let mut inv = HostRootBuilder::hgx()
        .gpus(minors.len())
        .nics(0)
        .intel_rdma(false)
        .gpu_minors(minors.to_vec())
        .nvidia_major(major)
        .expected()
        .unwrap();
    for (i, gpu) in inv.gpus.iter_mut().enumerate() {
        gpu.uuid = format!("GPU-{i}");
    }
    inv
}

pub fn pod(name: &str) -> PodRef {
    PodRef {
        sandbox_id: format!("sb-{name}"),
        namespace: "ns".to_string(),
        name: name.to_string(),
        uid: format!("uid-{name}"),
    }
}

/// The teardown composes with others: `Teardowns` takes `Send + Sync` boxes.
#[test]
fn gpu_teardown_is_send_and_sync() {
    fn assert<T: Send + Sync>() {}
    assert::<crate::gpu::GpuTeardown>();
}
