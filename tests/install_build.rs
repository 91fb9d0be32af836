//! `install/build.sh`: what nodes run. `devgate` is linked against the host's C
//! library (it loads NVML with dlopen), `devgate-hook` is static-pie, and the
//! static hook does its real work: moves a VF stand-in into a pod netns and
//! back, and hands hooks-only runs (which may need NVML) to the `devgate` beside
//! it. The demo (`install/demo.sh`) runs the same build through containerd.
#[path = "hook_netns/net.rs"]
mod net;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use devgate::elf::{self, Linking};
use net::{action, hook_program, link, ok, require_root, state, vouch, In, Sleeper, Veth};

/// Runs `install/build.sh --profile dev` once for the file (the dev profile
/// shares its dependency builds with this test run and the demo), into a
/// directory under cargo's test scratch space that each run replaces. A failed
/// build fails every test with its output, without building again.
fn built() -> &'static Path {
    static OUT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let out = OUT.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("install_build");
        let run = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("install/build.sh"))
            .args(["--profile", "dev", "--out"])
            .arg(&out)
            .env("CARGO_BUILD_FLAGS", "--quiet")
            .output()
            .map_err(|e| format!("run install/build.sh: {e}"))?;
        if !run.status.success() {
            return Err(format!(
                "install/build.sh: {}",
                String::from_utf8_lossy(&run.stderr)
            ));
        }
        Ok(out)
    });
    match out {
        Ok(out) => out,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn the_hook_is_static_and_the_plugin_links_the_hosts_c_library() {
    let out = built();
    assert_eq!(
        elf::linking(&out.join("devgate-hook")).unwrap(),
        Linking::Static { pie: true }
    );
    match elf::linking(&out.join("devgate")).unwrap() {
        Linking::Dynamic(loader) => assert!(loader.starts_with('/'), "{loader}"),
        other => panic!("devgate must be dynamically linked: {other:?}"),
    }
}

#[test]
fn unknown_arguments_are_refused_naming_the_usage() {
    let run = Command::new(built().join("devgate-hook"))
        .arg("--frobnicate")
        .output()
        .expect("run the hook");
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("usage: devgate-hook"), "{err}");
    assert!(run.stdout.is_empty(), "the runtime's stdout stays clean");
}

#[test]
fn the_static_hook_moves_a_vf_into_the_pod_and_back() {
    require_root();
    let hook = built().join("devgate-hook");
    let pod = Sleeper::new();
    let v = Veth::new("dgib0v", "dgib0p", "02:00:00:0a:05:01");
    let dir = tempfile::tempdir().unwrap();
    let nets = [action(
        &v,
        "0000:ee:05.0",
        "net1",
        "02:00:00:0b:05:01",
        9000,
    )];
    let attach = state("static1", "creating", Some(pod.pid()), &nets);
    vouch(&attach, dir.path());
    let run = hook_program(&hook, "createRuntime", &attach, dir.path(), &[]);
    ok(&run);
    let moved = link(In::Pid(pod.pid()), "net1").expect("net1 in the pod");
    assert_eq!(moved.address.as_deref(), Some("02:00:00:0b:05:01"));
    assert_eq!(moved.mtu, 9000);
    assert!(link(In::Host, &v.name).is_none());

    let stop = state("static1", "stopped", None, &[]);
    let run = hook_program(&hook, "poststop", &stop, dir.path(), &[]);
    ok(&run);
    let home = link(In::Host, &v.name).expect("the stand-in is back on the host");
    assert_eq!(home.address.as_deref(), Some(v.mac.as_str()));
    assert!(link(In::Pid(pod.pid()), "net1").is_none());
    let log = std::fs::read_to_string(dir.path().join("hook.log")).unwrap();
    assert!(
        log.contains("hook done") && log.contains("linked=\"static\""),
        "{log}"
    );
}

/// `devgate-hook auto --hooks-only` from `bin` for a container with `status`
/// the ledger does not know; the run and the hook's log.
fn hooks_only(bin: &Path, status: &str) -> (std::process::Output, String) {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let state = state("ho1", status, None, &[]);
    let mut child = Command::new(bin)
        .args(["auto", "--hooks-only", "--state-dir"])
        .arg(dir.path())
        .env("DEVGATE_CONFIG", "/nonexistent/devgate.toml")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the hook");
    // A hook that fails early may not read its stdin.
    let _ = child.stdin.take().unwrap().write_all(state.as_bytes());
    let run = child.wait_with_output().unwrap();
    let log = std::fs::read_to_string(dir.path().join("hook.log")).unwrap_or_default();
    (run, log)
}

/// [`hooks_only`] for a stopped container (nothing to do), which must succeed.
fn hooks_only_poststop(bin: &Path) -> String {
    let (run, log) = hooks_only(bin, "stopped");
    ok(&run);
    log
}

/// The static hook alone in a directory of its own, with `devgate` beside it
/// when given.
fn lone_hook(devgate: Option<&str>) -> (tempfile::TempDir, PathBuf) {
    let alone = tempfile::tempdir().unwrap();
    let hook = alone.path().join("devgate-hook");
    std::fs::copy(built().join("devgate-hook"), &hook).unwrap();
    if let Some(script) = devgate {
        use std::os::unix::fs::PermissionsExt;
        let path = alone.path().join("devgate");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    (alone, hook)
}

#[test]
fn a_hooks_only_run_of_the_static_hook_is_run_by_the_dynamically_linked_devgate() {
    let log = hooks_only_poststop(&built().join("devgate-hook"));
    assert!(
        log.contains("hook done") && log.contains("linked=\"dynamic\""),
        "{log}"
    );
    assert!(!log.contains("could not run devgate"), "{log}");
}

#[test]
fn without_devgate_beside_it_the_static_hook_refuses_creation_and_still_tears_down() {
    let (_alone, hook) = lone_hook(None);
    let (run, log) = hooks_only(&hook, "creating");
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("createRuntime: hooks-only mode needs devgate beside")
            && err.contains("not found")
            && err.contains("refused"),
        "{err}"
    );
    assert!(run.stdout.is_empty());
    assert!(log.contains("could not run devgate"), "{log}");
    // poststop must still run (a VF goes back whatever else is missing).
    let log = hooks_only_poststop(&hook);
    assert!(
        log.contains("could not run devgate: nvml is not used") && log.contains("not found"),
        "{log}"
    );
    assert!(
        log.contains("hook done") && log.contains("linked=\"static\""),
        "{log}"
    );
}

#[test]
fn a_devgate_beside_it_that_cannot_run_the_hook_fails_the_hook() {
    // What an older devgate without `hook` does: clap's usage error, exit 2.
    let (_alone, hook) = lone_hook(Some(
        "#!/bin/sh\necho \"error: unrecognized subcommand '$1'\" >&2\nexit 2\n",
    ));
    let (run, _) = hooks_only(&hook, "creating");
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("unrecognized subcommand 'hook'"), "{err}");
}
