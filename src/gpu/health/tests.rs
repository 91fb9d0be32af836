use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::config::GpuConfig;
use crate::gpu::nvml::fake::FakeNvml;
use crate::gpu::nvml::Unwatched;
use crate::gpu::tests::gpu_inventory;
use crate::inventory::Health;

fn xid(uuid: &str, code: u64) -> GpuEvent {
    GpuEvent {
        uuid: uuid.to_string(),
        kind: EventKind::Xid(code),
    }
}

fn policy(clean_checks: u32, quiet_secs: u64) -> HealthPolicy {
    HealthPolicy {
        ignored_xids: GpuConfig::default().ignored_xids,
        recovery: Recovery {
            clean_checks,
            quiet_secs,
        },
        interval: Duration::from_millis(1),
    }
}

fn monitor(dir: &std::path::Path, nvml: &Arc<FakeNvml>, p: HealthPolicy) -> HealthMonitor {
    let inv = gpu_inventory(195, &[0, 1]);
    HealthMonitor::new(nvml.clone(), HealthStore::new(dir), &inv, p)
}

#[test]
fn critical_xids_mark_unhealthy_and_application_xids_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    let m = monitor(dir.path(), &nvml, policy(3, 60));
    nvml.push_events(vec![xid("GPU-0", 13), xid("GPU-0", 43), xid("GPU-1", 79)]);
    let changes = m.step(1000).unwrap();
    assert_eq!(
        changes,
        vec![Transition::Unhealthy {
            uuid: "GPU-1".into(),
            reason: "xid 79".into()
        }]
    );
    let store = HealthStore::new(dir.path());
    store.check("GPU-0").unwrap();
    let err = store.check("GPU-1").unwrap_err();
    assert_eq!(err.to_string(), "gpu GPU-1 is unhealthy: xid 79");
}

/// An idle GPU that fell off the bus sends no event a wait can read; NVML
/// answers GPU_IS_LOST for it from then on. That is a fault, not a check
/// that merely did not complete.
#[test]
fn a_gpu_nvml_reports_lost_is_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    let m = monitor(dir.path(), &nvml, policy(3, 60));
    nvml.lost.lock().unwrap().insert("GPU-1".into());
    let changes = m.step(1000).unwrap();
    assert_eq!(
        changes,
        vec![Transition::Unhealthy {
            uuid: "GPU-1".into(),
            reason: "gpu is lost (nvml)".into()
        }]
    );
    let err = HealthStore::new(dir.path()).check("GPU-1").unwrap_err();
    assert!(err.to_string().contains("gpu is lost"), "{err}");
    HealthStore::new(dir.path()).check("GPU-0").unwrap();
}

/// The clock stepped back (NTP, by hand) after a fault: checks still count
/// and the quiet period runs from the step, so the GPU recovers as it would
/// have, instead of only once the clock caught up with its old reading.
#[test]
fn a_clock_stepped_back_does_not_hold_recovery_back() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    let m = monitor(dir.path(), &nvml, policy(2, 100));
    nvml.push_events(vec![xid("GPU-0", 48)]);
    m.step(10_000).unwrap();
    assert!(m.step(5_000).unwrap().is_empty(), "1 clean check");
    assert!(
        m.step(5_050).unwrap().is_empty(),
        "2 clean checks, not quiet yet"
    );
    let store = HealthStore::new(dir.path());
    assert_eq!(store.snapshot().unwrap().gpus["GPU-0"].clean_checks, 2);
    assert_eq!(
        m.step(5_100).unwrap(),
        vec![Transition::Recovered {
            uuid: "GPU-0".into()
        }]
    );
}

#[test]
fn a_gpu_recovers_after_clean_checks_and_a_quiet_period() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    let m = monitor(dir.path(), &nvml, policy(2, 100));
    nvml.push_events(vec![xid("GPU-0", 48)]);
    m.step(1000).unwrap();
    nvml.push_events(vec![xid("GPU-0", 48)]);
    assert_eq!(
        m.step(1050).unwrap(),
        vec![],
        "a repeat is no new transition"
    );
    assert!(m.step(1060).unwrap().is_empty(), "1 clean check");
    assert!(
        m.step(1070).unwrap().is_empty(),
        "2 clean checks, not quiet yet"
    );
    let store = HealthStore::new(dir.path());
    assert_eq!(store.snapshot().unwrap().gpus["GPU-0"].clean_checks, 2);
    let changes = m.step(1150).unwrap();
    assert_eq!(
        changes,
        vec![Transition::Recovered {
            uuid: "GPU-0".into()
        }]
    );
    store.check("GPU-0").unwrap();
    assert_eq!(
        store.snapshot().unwrap().gpus["GPU-0"].recovered_unix,
        Some(1150)
    );
}

#[test]
fn pending_retired_pages_hold_a_gpu_out_until_they_clear() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    let m = monitor(dir.path(), &nvml, policy(1, 0));
    let pending = MemoryHealth {
        retired_pages_pending: Some(true),
        dbe_volatile: Some(0),
        ..MemoryHealth::default()
    };
    nvml.set_health("GPU-0", pending);
    assert_eq!(m.step(10).unwrap().len(), 1);
    for now in 11..20 {
        assert!(m.step(now).unwrap().is_empty());
    }
    let clean = MemoryHealth {
        retired_pages_pending: Some(false),
        dbe_volatile: Some(0),
        ..MemoryHealth::default()
    };
    nvml.set_health("GPU-0", clean);
    assert_eq!(
        m.step(20).unwrap(),
        vec![Transition::Recovered {
            uuid: "GPU-0".into()
        }]
    );
}

/// A monitor following the inventory reads a GPU that came after its
/// start; one fixed at the start would never look at it.
#[test]
fn a_gpu_that_comes_later_has_its_readings_checked() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    let gpus = Arc::new(std::sync::Mutex::new(vec!["GPU-0".to_string()]));
    let listed = Arc::clone(&gpus);
    let m =
        monitor(dir.path(), &nvml, policy(1, 0)).following(move || listed.lock().unwrap().clone());
    let failed = MemoryHealth {
        remap_failed: Some(true),
        ..MemoryHealth::default()
    };
    nvml.set_health("GPU-7", failed);
    assert!(m.step(10).unwrap().is_empty());
    gpus.lock().unwrap().push("GPU-7".into());
    assert!(matches!(
        m.step(20).unwrap().as_slice(),
        [Transition::Unhealthy { uuid, .. }] if uuid == "GPU-7"
    ));
}

/// NVML without events (NOT_SUPPORTED) still reads memory health: a GPU
/// held out by its readings comes back when they clear, instead of never.
#[test]
fn without_event_support_a_gpu_recovers_by_its_readings() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    nvml.events_unsupported
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let m = monitor(dir.path(), &nvml, policy(1, 0));
    let pending = |on| MemoryHealth {
        retired_pages_pending: Some(on),
        ..MemoryHealth::default()
    };
    nvml.set_health("GPU-0", pending(true));
    assert_eq!(m.step(10).unwrap().len(), 1);
    nvml.set_health("GPU-0", pending(false));
    assert_eq!(
        m.step(20).unwrap(),
        vec![Transition::Recovered {
            uuid: "GPU-0".into()
        }]
    );
}

/// A GPU NVML could not register for events may have had XIDs nobody saw:
/// it does not recover while so, the others do; one NVML could not name
/// may be any GPU, so none does; registered again, it recovers.
#[test]
fn a_gpu_not_registered_for_events_holds_its_recovery_back() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    let m = monitor(dir.path(), &nvml, policy(1, 0));
    nvml.push_events(vec![xid("GPU-0", 79), xid("GPU-1", 79)]);
    assert_eq!(m.step(10).unwrap().len(), 2);
    *nvml.unwatched.lock().unwrap() = vec![Unwatched::Gpu("GPU-0".into())];
    assert_eq!(
        m.step(20).unwrap(),
        vec![Transition::Recovered {
            uuid: "GPU-1".into()
        }]
    );
    assert!(m.step(30).unwrap().is_empty(), "GPU-0 unwatched");
    nvml.push_events(vec![xid("GPU-1", 79)]);
    m.step(40).unwrap();
    *nvml.unwatched.lock().unwrap() = vec![Unwatched::Unnamed];
    assert!(m.step(50).unwrap().is_empty(), "any GPU may be unwatched");
    nvml.unwatched.lock().unwrap().clear();
    assert_eq!(m.step(60).unwrap().len(), 2);

    // A GPU NVML calls lost and cannot name holds no other back: its own
    // reading keeps it out (GPU_IS_LOST).
    nvml.push_events(vec![xid("GPU-1", 79)]);
    m.step(70).unwrap();
    nvml.lost.lock().unwrap().insert("GPU-0".into());
    *nvml.unwatched.lock().unwrap() = vec![Unwatched::Lost];
    let changes = m.step(80).unwrap();
    assert!(
        changes.contains(&Transition::Recovered {
            uuid: "GPU-1".into()
        }),
        "{changes:?}"
    );
    assert!(
        !changes
            .iter()
            .any(|t| matches!(t, Transition::Recovered { uuid } if uuid == "GPU-0")),
        "{changes:?}"
    );
}

#[test]
fn a_rising_double_bit_count_is_a_fault_and_a_driver_reload_is_not() {
    let mut seen = None;
    let reading = |n| MemoryHealth {
        dbe_volatile: Some(n),
        ..MemoryHealth::default()
    };
    assert!(
        observe(&[], Some(&reading(4)), &mut seen, &[]).is_empty(),
        "baseline"
    );
    assert_eq!(
        observe(&[], Some(&reading(5)), &mut seen, &[]),
        vec![Fault::DoubleBitEcc]
    );
    assert!(
        observe(&[], Some(&reading(0)), &mut seen, &[]).is_empty(),
        "counter reset"
    );
    assert_eq!(seen, Some(0));
    // Up to 7, then a reload and 2 errors before the next reading: below
    // what was seen, yet above 0, so new.
    assert_eq!(
        observe(&[], Some(&reading(7)), &mut seen, &[]),
        vec![Fault::DoubleBitEcc]
    );
    assert_eq!(
        observe(&[], Some(&reading(2)), &mut seen, &[]),
        vec![Fault::DoubleBitEcc],
        "a restart followed by errors"
    );
    assert_eq!(seen, Some(2));
}

#[test]
fn incomplete_checks_do_not_count_towards_recovery() {
    let mut h = GpuHealth::default();
    let r = Recovery {
        clean_checks: 1,
        quiet_secs: 0,
    };
    let bad = Observation {
        faults: vec![Fault::Xid { code: 79 }],
        complete: true,
    };
    assert!(apply("g", &mut h, &bad, r, 1).is_some());
    assert!(apply("g", &mut h, &Observation::default(), r, 2).is_none());
    let clean = Observation {
        faults: vec![],
        complete: true,
    };
    assert!(matches!(
        apply("g", &mut h, &clean, r, 3),
        Some(Transition::Recovered { .. })
    ));
}

#[test]
fn health_survives_a_restart_and_can_be_cleared_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    HealthStore::new(dir.path())
        .mark("GPU-0", &[Fault::Xid { code: 79 }, Fault::DoubleBitEcc], 5)
        .unwrap();
    let reopened = HealthStore::new(dir.path());
    let err = reopened.check("GPU-0").unwrap_err();
    assert_eq!(
        err.to_string(),
        "gpu GPU-0 is unhealthy: xid 79, double-bit ecc error"
    );
    let state = reopened.snapshot().unwrap();
    let text = std::fs::read_to_string(reopened.path()).unwrap();
    assert_eq!(serde_json::from_str::<HealthState>(&text).unwrap(), state);
    assert!(reopened.clear("GPU-0").unwrap());
    assert!(!reopened.clear("GPU-0").unwrap());
    HealthStore::new(dir.path()).check("GPU-0").unwrap();
}

#[test]
fn a_corrupt_store_is_an_error_not_healthy() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("health.json"), "{not json").unwrap();
    let err = HealthStore::new(dir.path()).check("GPU-0").unwrap_err();
    assert!(err.to_string().contains("is corrupt"), "{err}");
}

#[test]
fn health_merges_into_the_inventory_and_the_status_table() {
    let mut inv = gpu_inventory(195, &[0, 1]);
    let mut state = HealthState::default();
    let entry = state.gpus.entry("GPU-1".into()).or_default();
    add_faults("GPU-1", entry, &[Fault::Xid { code: 94 }], 77);
    merge_into(&mut inv, &state);
    assert_eq!(inv.gpus[0].health, Health::Healthy);
    assert_eq!(
        inv.gpus[1].health,
        Health::Unhealthy {
            reason: "xid 94".into()
        }
    );
    let text = table(&state);
    assert!(text.lines().nth(1).unwrap().starts_with("GPU-1"), "{text}");
    assert!(text.contains("unhealthy") && text.contains("xid 94") && text.contains("77"));
}

#[test]
fn an_event_wait_that_fails_at_once_is_paced_not_spun() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    nvml.events_unsupported
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut p = policy(3, 0);
    p.interval = Duration::from_millis(50);
    let m = Arc::new(monitor(dir.path(), &nvml, p));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (m2, stop2) = (Arc::clone(&m), Arc::clone(&stop));
    let started = Instant::now();
    let looping = std::thread::spawn(move || m2.run(&stop2));
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    looping.join().unwrap();
    // One wait per 50 ms interval, however long the machine let it run; a
    // loop that does not pace itself makes thousands.
    let ran = started.elapsed();
    let paced = ran.as_millis() / 50 + 3;
    let waits = nvml.waits.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (1..=paced).contains(&(waits as u128)),
        "{waits} waits in {ran:?}"
    );
}

/// Application XIDs a tenant can raise wake the wait at once; clean checks
/// still count once an interval, not once a wake-up.
#[test]
fn wake_ups_within_an_interval_count_one_clean_check() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = Arc::new(FakeNvml::default());
    let m = monitor(dir.path(), &nvml, policy(3, 0));
    nvml.push_events(vec![xid("GPU-0", 48)]);
    m.step(1000).unwrap();
    for _ in 0..5 {
        nvml.push_events(vec![xid("GPU-1", 13)]);
        assert!(m.step(1001).unwrap().is_empty());
    }
    let store = HealthStore::new(dir.path());
    assert_eq!(store.snapshot().unwrap().gpus["GPU-0"].clean_checks, 1);
    store.check("GPU-0").unwrap_err();
    // A fault still counts at once.
    nvml.push_events(vec![xid("GPU-1", 79)]);
    assert_eq!(m.step(1001).unwrap().len(), 1);
}

/// The plugin checks health at every container creation: it reads the file
/// once per version, and sees every write of another process at once.
#[test]
fn the_checked_document_is_read_once_per_version() {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, other) = (HealthStore::new(dir.path()), HealthStore::new(dir.path()));
    assert!(plugin.current().unwrap().gpus.is_empty(), "no file yet");
    other
        .mark("GPU-1", &[Fault::Xid { code: 79 }], 1000)
        .unwrap();
    let first = plugin.current().unwrap();
    assert!(first.unhealthy("GPU-1").is_some());
    assert!(
        Arc::ptr_eq(&first, &plugin.current().unwrap()),
        "read again"
    );
    assert!(other.clear("GPU-1").unwrap());
    plugin.check("GPU-1").unwrap();
    other
        .mark("GPU-0", &[Fault::Xid { code: 48 }], 1001)
        .unwrap();
    assert!(plugin.check("GPU-0").is_err());
    std::fs::remove_file(plugin.path()).unwrap();
    plugin.check("GPU-0").unwrap();
}

/// The plugin makes an empty document at start, so that the check keeps a
/// version and looks at it through its descriptor; what only the path shows
/// (the file renamed away, or linked twice, and another put in its place) is
/// seen within a second.
#[test]
fn the_kept_version_follows_the_path_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, other) = (HealthStore::new(dir.path()), HealthStore::new(dir.path()));
    plugin.create_if_absent().unwrap();
    let empty = plugin.current().unwrap();
    assert!(empty.gpus.is_empty());
    assert!(Arc::ptr_eq(&empty, &plugin.current().unwrap()), "kept");
    // Another process's write replaces the file: seen at once.
    other
        .mark("GPU-1", &[Fault::Xid { code: 79 }], 1000)
        .unwrap();
    assert!(plugin.check("GPU-1").is_err());
    // An existing document is left as it is.
    other.create_if_absent().unwrap();
    assert!(plugin.check("GPU-1").is_err());
    for (how, detach) in [
        ("renamed away", rename_away as fn(&Path)),
        ("linked twice", link_twice as fn(&Path)),
    ] {
        detach(&plugin.path());
        let text = serde_json::to_string(&HealthState::default()).unwrap();
        crate::fsutil::replace_file(&plugin.path(), text.as_bytes()).unwrap();
        // Rechecked once a second (`PATH_RECHECK`); bounded generously, so
        // that a stalled machine does not fail the mechanism.
        let deadline = Instant::now() + Duration::from_secs(10);
        while plugin.check("GPU-1").is_err() {
            assert!(Instant::now() < deadline, "{how}: still the old version");
            std::thread::sleep(Duration::from_millis(20));
        }
        other
            .mark("GPU-1", &[Fault::Xid { code: 79 }], 1001)
            .unwrap();
        assert!(plugin.check("GPU-1").is_err(), "{how}");
    }
}

fn rename_away(path: &Path) {
    std::fs::rename(path, path.with_extension("old")).unwrap();
}

fn link_twice(path: &Path) {
    let link = path.with_extension("link");
    let _ = std::fs::remove_file(&link);
    std::fs::hard_link(path, link).unwrap();
}
