//! Node daemons run as pods (`gpu.ignored_pods`) hold every GPU through NVML:
//! no user of a released one. A tenant's process holding it still is.
use std::sync::Arc;

use super::fake_host::FakeHost;
use super::{gpu_inventory, pod};
use crate::config::GpuConfig;
use crate::gpu::nvml::fake::FakeNvml;
use crate::gpu::{GpuTeardown, KnownPods};
use crate::ledger::{Claim, DeviceId, Ledger, Share};

#[test]
fn a_daemon_pod_named_by_ignored_pods_does_not_hold_a_released_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger")).unwrap();
    let config = GpuConfig {
        health_dir: dir.path().join("health"),
        kill_grace_ms: 10,
        kill_wait_ms: 10,
        ..GpuConfig::default()
    };
    let host = Arc::new(FakeHost::default());
    let known = Arc::new(KnownPods::default());
    let teardown = GpuTeardown::new(
        gpu_inventory(195, &[0, 1]),
        config,
        host.clone(),
        Arc::new(FakeNvml::default()),
        Arc::new(ledger.clone()),
    )
    .with_known_pods(known.clone());
    let (gpu0, gpu1) = (libc::makedev(195, 0), libc::makedev(195, 1));
    // koordlet (as its DaemonSet's pod) holds every GPU, as NVML does; a
    // tenant's pod holds GPU-0; and a pod named like a daemon holds GPU-0
    // only (descriptors passed to it): no daemon.
    host.add(300, &[gpu0, gpu1], "/kubepods/burstable/podu-koordlet/c1");
    host.add(400, &[gpu0], "/kubepods/besteffort/podu-tenant/c1");
    host.add(500, &[gpu0], "/kubepods/besteffort/podu-squat/c1");
    known.note("s-k", "u-koordlet", "koordinator-system", "koordlet-x7k2p");
    known.note("s-t", "u-tenant", "team-a", "trainer-0");
    known.note("s-s", "u-squat", "koordinator-system", "koordlet-fake");
    let claim = |name: &str| {
        let p = pod(name);
        ledger
            .claim(
                &p,
                &[Claim {
                    device: DeviceId::Gpu("GPU-0".into()),
                    share: Share::Exclusive,
                    pf: None,
                }],
            )
            .unwrap();
        p.sandbox_id
    };

    let first = claim("a");
    let out = ledger.release_pod(&first, &teardown).unwrap();
    let reason = &out.failed[0].reason;
    assert!(reason.contains("still open in pids [400, 500]"), "{reason}");
    assert!(host.alive(300) && host.alive(400) && host.alive(500));

    // The others gone, koordlet's alone keeps nothing.
    host.procs.lock().unwrap().remove(&400);
    host.procs.lock().unwrap().remove(&500);
    let out = ledger.release_pod(&first, &teardown).unwrap();
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert_eq!(teardown.retry_quarantined(&ledger).unwrap(), vec!["GPU-0"]);
    let second = claim("b");
    let out = ledger.release_pod(&second, &teardown).unwrap();
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert!(ledger.snapshot().unwrap().devices.is_empty());
}

/// A GPU the inventory finds unusable (excluded from the driver) is held by
/// no daemon: holding every other one is holding them all.
#[test]
fn a_gpu_no_daemon_can_hold_is_not_asked_of_it() {
    a_daemon_holding_only_gpu0_is_no_user(|inventory, _| {
        inventory.gpus[1].health = crate::inventory::Health::Unhealthy {
            reason: "excluded by NVreg_ExcludedGpus".into(),
        };
    });
}

/// Nor one the health monitor found lost (XID 79): a dcgm-exporter restarted
/// since cannot open it.
#[test]
fn a_gpu_found_lost_is_not_asked_of_a_daemon() {
    a_daemon_holding_only_gpu0_is_no_user(|_, health| {
        let lost = [crate::gpu::health::Fault::Lost { code: 15 }];
        health.mark("GPU-1", &lost, 1).unwrap();
    });
}

/// dcgm-exporter's pod holds GPU-0 alone; `unusable` makes GPU-1 one no
/// daemon can hold. Releasing a pod's GPU-0 hands it back.
fn a_daemon_holding_only_gpu0_is_no_user(
    unusable: impl FnOnce(&mut crate::inventory::Inventory, &crate::gpu::HealthStore),
) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger")).unwrap();
    let mut inventory = gpu_inventory(195, &[0, 1]);
    let health = crate::gpu::HealthStore::new(&dir.path().join("health"));
    unusable(&mut inventory, &health);
    let host = Arc::new(FakeHost::default());
    let known = Arc::new(KnownPods::default());
    let teardown = GpuTeardown::new(
        inventory,
        GpuConfig {
            health_dir: dir.path().join("health"),
            ..GpuConfig::default()
        },
        host.clone(),
        Arc::new(FakeNvml::default()),
        Arc::new(ledger.clone()),
    )
    .with_known_pods(known.clone());
    host.add(
        300,
        &[libc::makedev(195, 0)],
        "/kubepods/burstable/podu-dcgm/c1",
    );
    known.note(
        "s-d",
        "u-dcgm",
        "gpu-operator",
        "nvidia-dcgm-exporter-q8w2z",
    );
    let p = pod("a");
    let gpu0 = Claim {
        device: DeviceId::Gpu("GPU-0".into()),
        share: Share::Exclusive,
        pf: None,
    };
    ledger.claim(&p, &[gpu0]).unwrap();
    let out = ledger.release_pod(&p.sandbox_id, &teardown).unwrap();
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert!(ledger.snapshot().unwrap().devices.is_empty());
}

/// Within kubelet's pods `gpu.ignored_cgroups` applies only by a path lying
/// there itself: a prefix above them (kubelet's `--cgroup-root`) or a unit
/// name a pod's cgroup happens to carry hides no other pod's holder of a
/// released GPU.
#[test]
fn ignored_cgroups_never_hide_another_pods_holder() {
    use super::teardown::{claim, dev, node};
    let n = node(|c| c.ignored_cgroups.push("/k8s".to_string()));
    n.ledger
        .claim(&pod("a"), &[claim("GPU-0", Share::Exclusive)])
        .unwrap();
    n.host
        .add(100, &[dev(0)], "/k8s/kubepods/besteffort/poduid-a/c1");
    n.host
        .add(200, &[dev(0)], "/k8s/system.slice/dcgm-exporter.service");
    n.host
        .add(300, &[dev(0)], "/k8s/kubepods/besteffort/poduid-b/c1");
    n.host.add(
        400,
        &[dev(0)],
        "/k8s/kubepods/besteffort/poduid-c/c1/nvidia-persistenced.service",
    );
    let out = n.ledger.release_pod("sb-a", &n.teardown).unwrap();
    let reason = &out.failed[0].reason;
    assert!(
        reason.contains("gpu GPU-0 is still open in pids [300, 400]"),
        "{reason}"
    );
    assert!(
        !n.host.alive(100),
        "the released pod's own process is ended"
    );
    assert!(n.host.alive(200) && n.host.alive(300) && n.host.alive(400));
}
