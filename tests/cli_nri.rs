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
