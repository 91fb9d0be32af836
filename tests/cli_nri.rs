//! `devgate nri`'s flags: a plugin identity the runtime would refuse fails
//! the command before it sets anything up.
use std::process::Command;

#[test]
fn a_bad_plugin_identity_fails_before_any_state_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    for (flag, value, said) in [
        ("--idx", "5", "\"5\""),
        ("--idx", "1a", "\"1a\""),
        ("--name", "dev gate", "\"dev gate\""),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_devgate"))
            .arg("nri")
            .args([flag, value])
            .arg("--socket")
            .arg(dir.path().join("nri.sock"))
            .arg("--state-dir")
            .arg(&state)
            .args(["--config", "/nonexistent/devgate.toml", "--host-root"])
            .arg(dir.path())
            .output()
            .expect("run devgate nri");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}: {stderr}");
        assert!(stderr.contains(said), "{flag} {value}: {stderr}");
        assert!(
            !state.exists(),
            "{flag} {value}: state made before the check"
        );
    }
}

/// A plugin the runtime launched has its stderr on the null device: an
/// error that stops it before its log is set up (here the runtime's
/// variables, then a bad `DEVGATE_LOG`) is written to its log file, where
/// its later errors go; with stderr kept, it stays on stderr.
#[test]
fn a_launched_plugin_that_cannot_start_says_why_in_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let log = state.join("nri.log");
    let run = |env: &[(&str, &str)], stderr: std::process::Stdio| {
        Command::new(env!("CARGO_BIN_EXE_devgate"))
            .arg("nri")
            .arg("--state-dir")
            .arg(&state)
            .arg("--host-root")
            .arg(dir.path())
            .env_remove("DEVGATE_LOG")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .output()
            .expect("run devgate nri")
    };
    let bad_socket = [("NRI_PLUGIN_SOCKET", "x")];
    let out = run(&bad_socket, std::process::Stdio::piped());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("NRI_PLUGIN_SOCKET"),
        "{said}"
    );
    assert!(!log.exists(), "stderr was there to say it");
    assert!(!run(&bad_socket, std::process::Stdio::null())
        .status
        .success());
    let text = std::fs::read_to_string(&log).expect("the plugin's log");
    assert!(
        text.starts_with("devgate nri did not start (unix time ")
            && text.contains("NRI_PLUGIN_SOCKET")
            && text.ends_with('\n'),
        "{text}"
    );

    // One step later: the runtime's variables are good, the filter is not.
    let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&ours);
    // The child inherits the descriptor: clear close-on-exec.
    nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .unwrap();
    let fd = fd.to_string();
    let launched = [
        ("NRI_PLUGIN_SOCKET", fd.as_str()),
        ("NRI_PLUGIN_NAME", "devgate"),
        ("NRI_PLUGIN_IDX", "10"),
        ("DEVGATE_LOG", "no such=level"),
    ];
    assert!(!run(&launched, std::process::Stdio::null()).status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("devgate nri did not start") && last.contains("DEVGATE_LOG"),
        "{text}"
    );
}
