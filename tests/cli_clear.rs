//! `devgate clear` end to end: the binary against the fixture's HGX host root,
//! a ledger with quarantined and held devices, and a GPU marked unhealthy.
use std::path::Path;
use std::process::Command;

use devgate::fixture::HostRootBuilder;
use devgate::gpu::health::Fault;
use devgate::gpu::HealthStore;
use devgate::ledger::{Claim, DeviceId, Ledger, PodRef, Share};

fn clear(dir: &Path, host: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_devgate"))
        .arg("clear")
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--health-dir")
        .arg(dir.join("health"))
        .arg("--host-root")
        .arg(host)
        .arg("--config")
        .arg(dir.join("devgate.toml"))
        .args(extra)
        .output()
        .expect("run devgate clear");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn pod(name: &str) -> PodRef {
    PodRef {
        sandbox_id: format!("sb-{name}"),
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

#[test]
fn gpus_and_nics_return_to_service_unless_held_or_still_configured() {
    let dir = tempfile::tempdir().unwrap();
    // The fixture's GPUs are not this host's: no NVML to ask about them.
    std::fs::write(dir.path().join("devgate.toml"), "[gpu]\nnvml = false\n").unwrap();
    let fx = HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .unwrap();
    let inv = fx.expected();
    let (g0, g1) = (inv.gpus[0].uuid.clone(), inv.gpus[1].uuid.clone());
    let vf = inv.rdma[0].vfs[0].bus_id;
    let ledger = Ledger::open(&dir.path().join("state")).unwrap();
    let health = HealthStore::new(&dir.path().join("health"));
    health.mark(&g0, &[Fault::Xid { code: 79 }], 1).unwrap();
    ledger
        .quarantine(&DeviceId::Gpu(g0.clone()), "was open in pids [42]")
        .unwrap();
    // GPU 1 is held by a pod whose teardown failed.
    let held = Claim {
        device: DeviceId::Gpu(g1.clone()),
        share: Share::Exclusive,
        pf: None,
    };
    ledger.claim(&pod("a"), &[held]).unwrap();
    ledger
        .quarantine(&DeviceId::Gpu(g1.clone()), "teardown failed")
        .unwrap();
    // A VF whose restore failed: its saved state is still there.
    let vf_id = DeviceId::Vf(vf);
    ledger.quarantine(&vf_id, "restore failed").unwrap();
    let record = dir.path().join("state/vf").join(format!("{vf}.json"));
    std::fs::create_dir_all(record.parent().unwrap()).unwrap();
    std::fs::write(&record, "{}").unwrap();

    let (ok, text) = clear(dir.path(), fx.root(), &[&g0, &g1, &vf.to_string()]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "gpu {g0}: health mark cleared (was: xid 79); cleaned, quarantine cleared (was: was open in pids [42])"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("gpu {g1}: not cleared: held by ns/a")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{vf}: not cleared: its saved vf state is still there"
        )),
        "{text}"
    );
    assert!(
        text.contains("2 of the devices named could not be cleared"),
        "{text}"
    );
    let state = ledger.snapshot().unwrap();
    assert!(!state.devices.contains_key(&format!("gpu {g0}")));
    assert!(state.devices[&format!("gpu {g1}")].quarantine.is_some());
    assert!(state.devices[&vf_id.to_string()].quarantine.is_some());
    assert!(health.snapshot().unwrap().gpus[&g0].unhealthy.is_none());

    // Once restored by hand (the record gone), the VF clears; a second
    // run finds nothing to do for the GPU.
    std::fs::remove_file(&record).unwrap();
    let (ok, text) = clear(dir.path(), fx.root(), &[&vf.to_string(), &g0]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("{vf}: quarantine cleared (was: restore failed)")),
        "{text}"
    );
    assert!(
        text.contains(&format!("gpu {g0}: nothing to clear")),
        "{text}"
    );
    assert!(ledger.snapshot().unwrap().devices[&format!("gpu {g1}")]
        .quarantine
        .is_some());
}

#[test]
fn a_name_that_is_no_device_is_refused_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, text) = clear(dir.path(), dir.path(), &["../etc"]);
    assert!(!ok, "{text}");
    assert!(text.contains("neither a gpu uuid"), "{text}");
    assert!(!dir.path().join("state").exists(), "nothing created");
}

/// A GPU whose health cannot be read is its own "not cleared" line: the
/// devices named after it are still cleared.
#[test]
fn a_device_whose_state_cannot_be_read_does_not_stop_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("devgate.toml"), "[gpu]\nnvml = false\n").unwrap();
    let fx = HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .unwrap();
    let inv = fx.expected();
    let g0 = inv.gpus[0].uuid.clone();
    let vf = inv.rdma[0].vfs[0].bus_id;
    let ledger = Ledger::open(&dir.path().join("state")).unwrap();
    ledger
        .quarantine(&DeviceId::Vf(vf), "restore failed")
        .unwrap();
    std::fs::create_dir_all(dir.path().join("health")).unwrap();
    std::fs::write(dir.path().join("health/health.json"), "{torn").unwrap();

    let (ok, text) = clear(dir.path(), fx.root(), &[&g0, &vf.to_string()]);
    assert!(!ok, "{text}");
    assert!(text.contains(&format!("gpu {g0}: not cleared: ")), "{text}");
    assert!(
        text.contains(&format!("{vf}: quarantine cleared (was: restore failed)")),
        "{text}"
    );
    assert!(
        text.contains("1 of the devices named could not be cleared"),
        "{text}"
    );
    assert!(ledger.snapshot().unwrap().devices.is_empty());
}
