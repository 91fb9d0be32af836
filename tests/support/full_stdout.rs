//! `devgate` run with its stdout on `/dev/full`: a report that cannot be
//! written must fail with one line (exit 1), never panic. Included by the
//! CLI test files with `#[path]`.
use std::process::Command;

/// Runs `devgate args` with stdout on `/dev/full` and asserts exit 1 with
/// "write to stdout" and no panic on stderr.
pub fn fails_cleanly(args: &[&str]) {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_devgate"))
        .args(args)
        .stdout(full)
        .output()
        .expect("run devgate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(stderr.contains("write to stdout"), "{args:?}: {stderr}");
}
