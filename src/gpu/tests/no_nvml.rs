//! NVML enabled but not loaded: on a node with the NVIDIA driver a release
//! cannot reset anything, so it fails and the GPU stays quarantined; on a node
//! without the driver (no GPU to reset) it passes as before.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::fake_host::FakeHost;
use super::{gpu_inventory, pod};
use crate::config::GpuConfig;
use crate::gpu::{GpuTeardown, NoNvml};
use crate::ledger::{Claim, DeviceId, Ledger, Share};

fn release(driver_loaded: bool, nvml: bool) -> (Vec<String>, bool) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger")).unwrap();
    let host = Arc::new(FakeHost::default());
    host.driver_loaded.store(driver_loaded, Ordering::Relaxed);
    let config = GpuConfig {
        health_dir: dir.path().join("health"),
        nvml,
        ..GpuConfig::default()
    };
    let teardown = GpuTeardown::new(
        gpu_inventory(195, &[0]),
        config,
        host,
        Arc::new(NoNvml),
        Arc::new(ledger.clone()),
    );
    let claim = Claim {
        device: DeviceId::Gpu("GPU-0".into()),
        share: Share::Exclusive,
        pf: None,
    };
    ledger.claim(&pod("a"), &[claim]).unwrap();
    let out = ledger.release_pod("sb-a", &teardown).unwrap();
    let failed = out.failed.into_iter().map(|f| f.reason).collect();
    let quarantined = ledger
        .snapshot()
        .unwrap()
        .devices
        .get("gpu GPU-0")
        .is_some_and(|d| d.quarantine.is_some());
    (failed, quarantined)
}

#[test]
fn a_release_without_nvml_on_a_node_with_the_driver_quarantines_the_gpu() {
    let (failed, quarantined) = release(true, true);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].contains("nvidia driver is loaded but nvml did not load"),
        "{failed:?}"
    );
    assert!(quarantined);
}

#[test]
fn without_the_driver_or_with_nvml_off_a_release_needs_no_nvml() {
    for (driver, nvml) in [(false, true), (true, false)] {
        let (failed, quarantined) = release(driver, nvml);
        assert_eq!(failed, Vec::<String>::new(), "driver {driver}, nvml {nvml}");
        assert!(!quarantined);
    }
}
