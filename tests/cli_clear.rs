//! `devgate clear` end to end: the binary against the fixture's HGX host root,
//! a ledger with quarantined and held devices, and a GPU marked unhealthy.
use std::path::Path;
use std::process::Command;

use devgate::fixture::HostRootBuilder;
use devgate::gpu::health::Fault;
use devgate::gpu::HealthStore;
use devgate::ledger::{Claim, DeviceId, Ledger, PodRef, Share};

/// Taken shared by every test that starts a process, and exclusively by the
/// one whose open GPU node must have no holder but this process: a child
/// another test starts holds a copy of every descriptor of this process,
/// close-on-exec ones included, from its fork until its exec, and a clear
/// scanning `/proc` in that window counts it as a user.
static SPAWNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// `devgate clear` with `extra` arguments, while no test holds [`SPAWNS`]
/// exclusively.
fn clear(dir: &Path, host: &Path, extra: &[&str]) -> (bool, String) {
    let _spawns = SPAWNS.read().unwrap_or_else(|p| p.into_inner());
    run_clear(dir, host, extra)
}

/// `devgate clear`, for a caller that holds [`SPAWNS`] itself.
fn run_clear(dir: &Path, host: &Path, extra: &[&str]) -> (bool, String) {
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

/// The HGX fixture under `dir/host`, and a config: the fixture's GPUs are
/// not this host's, so no NVML to ask about them.
fn node(dir: &Path) -> devgate::fixture::Fixture {
    std::fs::write(dir.join("devgate.toml"), "[gpu]\nnvml = false\n").unwrap();
    HostRootBuilder::hgx().build(&dir.join("host")).unwrap()
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
    let fx = node(dir.path());
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
    let fx = node(dir.path());
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

/// The running plugin keeps every GPU open through NVML, whatever its cgroup
/// (a DaemonSet pod's is no `gpu.ignored_cgroups` entry): `devgate clear`
/// counts the process the plugin recorded (pid and start time) as no user.
/// Any other process holding the GPU still refuses the clear.
#[test]
fn the_running_plugins_own_gpu_handles_do_not_refuse_a_clear() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    // The node's `nvidia` major is 1 and its GPUs' minors 0 to 7, so that
    // GPU 7's node is `/dev/full`'s device (1:7), which a process can hold
    // open without NVIDIA's driver. The other tests run as threads of this
    // process on nodes of their own, with the real major.
    std::fs::write(dir.path().join("devgate.toml"), "[gpu]\nnvml = false\n").unwrap();
    let fx = HostRootBuilder::hgx()
        .nvidia_major(1)
        .gpu_minors((0..8).collect())
        .build(&dir.path().join("host"))
        .unwrap();
    let gpu = fx.expected().gpus[7].clone();
    assert_eq!(gpu.minor, 7);
    let ledger = Ledger::open(&dir.path().join("state")).unwrap();
    ledger
        .quarantine(&DeviceId::Gpu(gpu.uuid.clone()), "teardown failed")
        .unwrap();
    // This test process stands for the plugin: it holds the GPU's node open
    // (a descriptor opened with O_PATH would open nothing, and not count).
    // The node lies in /dev: a devtmpfs, where device nodes open, which a
    // `nodev` /dev/shm (systemd's, Docker's) refuses.
    let nodes = tempfile::tempdir_in("/dev").unwrap();
    let node = nodes.path().join("nvidia-node");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(
            fx.expected().nvidia_majors.nvidia.unwrap().into(),
            gpu.minor.into(),
        ),
    )
    .unwrap();
    // No other test starts a process while this one holds the node.
    let _spawns = SPAWNS.write().unwrap_or_else(|p| p.into_inner());
    let _held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&node)
        .unwrap();

    let (ok, text) = run_clear(dir.path(), fx.root(), &[&gpu.uuid]);
    assert!(!ok, "{text}");
    let me = std::process::id();
    assert!(text.contains(&format!("pids [{me}]")), "{text}");

    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let start: u64 = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let record = |start_ticks: u64| {
        std::fs::write(
            dir.path().join("state/runtime.json"),
            serde_json::json!({
                "runtime": "containerd", "version": "1.7.24", "nri_version": null,
                "events": "0x0", "explicit_cgroup_rules": false, "cdi_devices": false,
                "device_mode": "nodes", "devices_as": "nodes", "configured_unix": 0,
                "plugin": {"pid": me, "start_ticks": start_ticks},
            })
            .to_string(),
        )
        .unwrap()
    };
    // A plugin that exited, its pid now another process's: that process counts.
    record(start + 1);
    let (ok, text) = run_clear(dir.path(), fx.root(), &[&gpu.uuid]);
    assert!(!ok && text.contains(&format!("pids [{me}]")), "{text}");
    record(start);
    let (ok, text) = run_clear(dir.path(), fx.root(), &[&gpu.uuid]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("gpu {}: cleaned, quarantine cleared", gpu.uuid)),
        "{text}"
    );
}

/// A step that fails after the health mark was cleared is said after that
/// change, which stays made.
#[test]
fn a_failure_after_the_health_mark_went_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let fx = node(dir.path());
    let g0 = fx.expected().gpus[0].uuid.clone();
    let health = HealthStore::new(&dir.path().join("health"));
    health.mark(&g0, &[Fault::Xid { code: 79 }], 1).unwrap();
    Ledger::open(&dir.path().join("state")).unwrap();
    std::fs::write(dir.path().join("state/ledger.json"), "{torn").unwrap();

    let (ok, text) = clear(dir.path(), fx.root(), &[&g0]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "gpu {g0}: not cleared: health mark cleared (was: xid 79); "
        )),
        "{text}"
    );
    assert!(health.snapshot().unwrap().gpus[&g0].unhealthy.is_none());
}

/// A state directory that is not there (a typo) fails, naming it, instead of
/// being made and reported as having nothing to clear.
#[test]
fn a_missing_state_directory_fails_and_is_not_made() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = node(dir.path());
    let uuid = fixture.expected().gpus[0].uuid.clone();
    let (ok, text) = clear(dir.path(), fixture.root(), &[&uuid]);
    assert!(!ok, "{text}");
    assert!(text.contains("no state directory"), "{text}");
    assert!(!text.contains("nothing to clear"), "{text}");
    assert!(!dir.path().join("state").exists(), "not made");
}

/// A device nothing on the node knows (a mistyped UUID, a MIG instance, an
/// address of no NIC) is refused, not reported as having nothing to clear.
#[test]
fn an_unknown_device_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fx = node(dir.path());
    Ledger::open(&dir.path().join("state")).unwrap();
    let known = fx.expected().gpus[0].uuid.clone();
    let typo = format!("{}0", &known[..known.len() - 1]);
    let vf = fx.expected().rdma[0].vfs[0].bus_id.to_string();
    let (ok, text) = clear(
        dir.path(),
        fx.root(),
        &[
            &known,
            &typo,
            "MIG-5c2e0a1f-4b3d-5e6f-8a9b-0c1d2e3f4a5b",
            "0000:7f:00.1",
            &vf,
        ],
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("gpu {known}: nothing to clear")),
        "{text}"
    );
    assert!(text.contains(&format!("{vf}: nothing to clear")), "{text}");
    for unknown in [
        format!("gpu {typo}"),
        "gpu MIG-5c2e0a1f-4b3d-5e6f-8a9b-0c1d2e3f4a5b".to_string(),
        "0000:7f:00.1".to_string(),
    ] {
        assert!(
            text.contains(&format!("{unknown}: not cleared: unknown device")),
            "{unknown}: {text}"
        );
    }
    assert!(
        text.contains("3 of the devices named could not be cleared"),
        "{text}"
    );
}
