//! `devgate status`: a state directory holding an unreadable VF record still
//! shows the rest, with the record's error; one it cannot read at all fails.
#[path = "support/full_stdout.rs"]
mod full_stdout;
use std::process::Command;

/// `devgate status` on `state` and `health`, run to its end.
fn status_output(
    state: &std::path::Path,
    health: &std::path::Path,
    extra: &[&str],
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_devgate"))
        .arg("status")
        .arg("--state-dir")
        .arg(state)
        .arg("--health-dir")
        .arg(health)
        .args(extra)
        .output()
        .expect("run devgate status")
}

fn status(state: &std::path::Path, health: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let out = status_output(state, health, extra);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn an_unreadable_vf_record_is_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(state.join("vf")).unwrap();
    std::fs::write(state.join("vf").join("0000:19:00.2.json"), "{torn").unwrap();
    let health = dir.path().join("health");

    let (ok, text) = status(&state, &health, &[]);
    assert!(ok, "{text}");
    assert!(
        text.contains("DEVICE"),
        "the ledger table is still there: {text}"
    );
    assert!(text.contains("VFS: saved state unreadable: "), "{text}");
    assert!(text.contains("0000:19:00.2.json"), "{text}");

    let (ok, json) = status(&state, &health, &["-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["vfs"], serde_json::json!([]));
    assert!(
        v["vf_state_error"]
            .as_str()
            .is_some_and(|e| e.contains("0000:19:00.2.json")),
        "{v}"
    );
}

/// A state directory that cannot be read fails the command with one line that
/// names the file and gives the cause once, although the ledger's message
/// ends with its cause's text.
#[test]
fn an_unreadable_ledger_fails_with_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::write(&state, "not a directory").unwrap();
    let out = status_output(&state, &dir.path().join("health"), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let file = state.join("ledger.json");
    assert!(
        stderr.starts_with(&format!("devgate: ledger {}: ", file.display())),
        "{stderr}"
    );
    assert_eq!(stderr.matches("Not a directory").count(), 1, "{stderr}");
}

/// A report piped into a reader that stops early (`| head -1`) ends quietly,
/// as other command-line tools do, rather than panicking on the closed pipe.
#[test]
fn a_closed_pipe_ends_the_report_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    // Close-on-exec: a child another test spawns meanwhile must not inherit the
    // read end and keep the pipe open.
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    drop(read);
    let out = Command::new(env!("CARGO_BIN_EXE_devgate"))
        .args(["status", "--state-dir"])
        .arg(dir.path())
        .arg("--health-dir")
        .arg(dir.path().join("health"))
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .expect("run devgate status");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{stderr}");
}

/// A report that cannot be written (stdout on a full disk) is the command's
/// error, exit 1 with one line, not a panic; the same for each command that
/// prints a report.
#[test]
fn a_failed_write_to_stdout_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let health = dir.path().join("health");
    let runs: [&[&str]; 3] = [
        &[
            "status",
            "--state-dir",
            state,
            "--health-dir",
            health.to_str().unwrap(),
        ],
        &[
            "status",
            "-o",
            "json",
            "--state-dir",
            state,
            "--health-dir",
            health.to_str().unwrap(),
        ],
        &[
            "doctor",
            "--print-node-prep",
            "--config",
            "/nonexistent/devgate.toml",
        ],
    ];
    for args in runs {
        full_stdout::fails_cleanly(args);
    }
}

/// `devgate status` with the state under `dir` and `config`, no `--health-dir`.
fn status_with_config(
    dir: &std::path::Path,
    config: &std::path::Path,
    extra: &[&str],
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_devgate"))
        .arg("status")
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--config")
        .arg(config)
        .args(extra)
        .output()
        .expect("run devgate status")
}

/// Without `--health-dir`, the health shown is the one the config's
/// `[gpu] health_dir` holds, where the plugin and the hook mark it.
#[test]
fn gpu_health_comes_from_the_configs_health_dir() {
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("elsewhere");
    devgate::gpu::HealthStore::new(&health)
        .mark("GPU-1", &[devgate::gpu::health::Fault::Xid { code: 79 }], 1)
        .unwrap();
    let config = dir.path().join("devgate.toml");
    std::fs::write(
        &config,
        format!("[gpu]\nhealth_dir = {:?}\n", health.display().to_string()),
    )
    .unwrap();
    let out = status_with_config(dir.path(), &config, &["-o", "json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        v["gpu_health"]["gpus"]["GPU-1"]["unhealthy"].is_object(),
        "{v}"
    );
}

/// A config that does not load is said on stderr; the report is still printed.
#[test]
fn a_config_that_does_not_load_leaves_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("devgate.toml");
    std::fs::write(&config, "[gpu]\nhealth_dir = \"relative\"\n").unwrap();
    let out = status_with_config(dir.path(), &config, &[]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("DEVICE"), "{stdout}");
    assert!(stderr.contains("gpu.health_dir"), "{stderr}");
    // In JSON too: health read from the default is not taken for the node's.
    let out = status_with_config(dir.path(), &config, &["-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gpu_health_dir"], "/var/lib/devgate");
    assert!(
        v["gpu_health_dir_error"]
            .as_str()
            .is_some_and(|e| e.contains("gpu.health_dir")),
        "{v}"
    );
}

/// GPU health, the runtime record and the grant counters that cannot be read
/// are said, each with its cause, beside the ledger's holders, which they
/// must not hide.
#[test]
fn unreadable_side_files_are_reported_beside_the_ledger() {
    use devgate::ledger::{Claim, DeviceId, Ledger, PodRef, Share};
    let dir = tempfile::tempdir().unwrap();
    let (state, health) = (dir.path().join("state"), dir.path().join("health"));
    let pod = PodRef {
        sandbox_id: "sb-a".into(),
        namespace: "ns".into(),
        name: "a".into(),
        uid: "uid-a".into(),
    };
    let gpu = Claim {
        device: DeviceId::Gpu("GPU-1111".into()),
        share: Share::Exclusive,
        pf: None,
    };
    Ledger::open(&state).unwrap().claim(&pod, &[gpu]).unwrap();
    std::fs::create_dir_all(&health).unwrap();
    for file in [
        health.join("health.json"),
        state.join("runtime.json"),
        state.join("grant-audit.json"),
        state.join("unapplied.json"),
    ] {
        std::fs::write(file, "{torn").unwrap();
    }

    let (ok, text) = status(&state, &health, &[]);
    assert!(ok, "{text}");
    assert!(text.contains("GPU-1111") && text.contains("ns/a"), "{text}");
    for what in [
        "GPU HEALTH",
        "RUNTIME RECORD",
        "GRANT COUNTERS",
        "UNAPPLIED CONTAINERS",
    ] {
        assert!(
            text.contains(&format!("{what}: unreadable: ")),
            "{what}: {text}"
        );
    }

    let (ok, json) = status(&state, &health, &["-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v["pods"]["sb-a"].is_object(), "{v}");
    for (field, file) in [
        ("gpu_health_error", "health.json"),
        ("runtime_error", "runtime.json"),
        ("grants_error", "grant-audit.json"),
        ("unapplied_error", "unapplied.json"),
    ] {
        assert!(
            v[field].as_str().is_some_and(|e| e.contains(file)),
            "{field}: {v}"
        );
    }
}

/// Containers the plugin's last Synchronize found running without their
/// allocation are listed, in the table and in JSON.
#[test]
fn containers_without_their_allocation_are_listed() {
    let dir = tempfile::tempdir().unwrap();
    let (state, health) = (dir.path().join("state"), dir.path().join("health"));
    devgate::ledger::Ledger::open(&state).unwrap();
    let listed = r#"{"containers":[{"namespace":"team","pod":"web","sandbox_id":"sb-w",
        "container":"trainer","id":"ctr-away","found_unix":1700000000}]}"#;
    std::fs::write(state.join("unapplied.json"), listed).unwrap();
    let (ok, text) = status(&state, &health, &[]);
    assert!(ok, "{text}");
    assert!(
        text.contains("CONTAINERS WITHOUT THEIR ALLOCATION")
            && text.contains("team/web container trainer (ctr-away)"),
        "{text}"
    );
    let (ok, json) = status(&state, &health, &["-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["unapplied_containers"][0]["id"], "ctr-away", "{v}");
    // None listed: no section, an empty list.
    std::fs::remove_file(state.join("unapplied.json")).unwrap();
    let (_, text) = status(&state, &health, &[]);
    assert!(!text.contains("WITHOUT THEIR ALLOCATION"), "{text}");
    let (_, json) = status(&state, &health, &["-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["unapplied_containers"], serde_json::json!([]), "{v}");
}

/// `-o json` gives each device its state and each holder its pod, beside
/// the ledger's own fields; the table says the same.
#[test]
fn devices_show_their_state_and_holders() {
    use devgate::ledger::{Claim, DeviceId, Ledger, PodRef, Share};
    let dir = tempfile::tempdir().unwrap();
    let (state, health) = (dir.path().join("state"), dir.path().join("health"));
    let ledger = Ledger::open(&state).unwrap();
    let pod = PodRef {
        sandbox_id: "sb-web".into(),
        namespace: "team".into(),
        name: "web".into(),
        uid: "u-web".into(),
    };
    let half = Share::Shared {
        core: 50,
        memory_ratio: 50,
    };
    let claims = [
        Claim {
            device: DeviceId::Gpu("GPU-held".into()),
            share: Share::Exclusive,
            pf: None,
        },
        Claim {
            device: DeviceId::Gpu("GPU-half".into()),
            share: half,
            pf: None,
        },
    ];
    ledger.claim(&pod, &claims).unwrap();
    let sick = DeviceId::Gpu("GPU-sick".into());
    ledger.quarantine(&sick, "reset failed").unwrap();

    let (ok, json) = status(&state, &health, &["-o", "json"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let held = &v["devices"]["gpu GPU-held"];
    assert_eq!(held["state"], "held", "{v}");
    assert_eq!(held["holders"][0]["pod"], "team/web", "{v}");
    assert_eq!(held["holders"][0]["sandbox_id"], "sb-web", "{v}");
    assert_eq!(v["devices"]["gpu GPU-half"]["state"], "held", "{v}");
    assert_eq!(
        v["devices"]["gpu GPU-half"]["holders"][0]["pod"],
        "team/web"
    );
    let quarantined = &v["devices"]["gpu GPU-sick"];
    assert_eq!(quarantined["state"], "quarantined", "{v}");
    assert_eq!(quarantined["quarantine"]["reason"], "reset failed", "{v}");
    assert_eq!(quarantined["holders"], serde_json::json!([]), "{v}");
    assert_eq!(v["pods"]["sb-web"]["pod"]["name"], "web", "{v}");

    let (ok, text) = status(&state, &health, &[]);
    assert!(ok, "{text}");
    let line = |device: &str| {
        text.lines()
            .find(|l| l.starts_with(device))
            .unwrap_or_else(|| panic!("{device} in:\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(line("gpu GPU-held"), "gpu GPU-held team/web exclusive held");
    assert!(line("gpu GPU-sick").ends_with("- - quarantined: reset failed"));
}

/// A state directory that is not there (a typo) shows nothing held, as an
/// idle node's would, and says on stderr that it is not there.
#[test]
fn a_missing_state_directory_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("no-such-state");
    let out = status_output(&state, &dir.path().join("health"), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("no state directory {}", state.display())),
        "{stderr}"
    );
    assert!(!state.exists(), "not made");
}

/// The runtime record names the plugin process that wrote it: status says
/// whether it still runs (table and JSON), so that the record of a plugin
/// that exited does not read as the node's present state.
#[test]
fn the_runtime_records_plugin_is_shown_running_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let (state, health) = (dir.path().join("state"), dir.path().join("health"));
    std::fs::create_dir_all(&state).unwrap();
    let me = std::process::id();
    let ticks = devgate::hook::liveness::start_ticks(std::path::Path::new("/proc"), me).unwrap();
    let write_record = |start_ticks: u64| {
        let record = serde_json::json!({
            "runtime": "containerd", "version": "1.7.24", "nri_version": "v0.6.1",
            "events": "0x60c", "explicit_cgroup_rules": false, "cdi_devices": false,
            "device_mode": "nodes", "devices_as": "nodes", "configured_unix": 1_700_000_000u64,
            "plugin": {"pid": me, "start_ticks": start_ticks},
        });
        std::fs::write(state.join("runtime.json"), record.to_string()).unwrap();
    };
    for (start_ticks, running, line) in [
        (ticks, true, format!("plugin:                   pid {me}, running\n")),
        (
            ticks + 1,
            false,
            format!("plugin:                   pid {me}, NOT RUNNING: this record is of a plugin that exited"),
        ),
    ] {
        write_record(start_ticks);
        let (ok, table) = status(&state, &health, &[]);
        assert!(ok && table.contains(&line), "{table}");
        let (ok, json) = status(&state, &health, &["-o", "json"]);
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert!(ok);
        assert_eq!(json["runtime_plugin_running"], running, "{json}");
        assert_eq!(json["runtime"]["plugin"]["pid"], me, "{json}");
    }
}
