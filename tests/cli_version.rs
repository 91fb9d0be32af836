//! `--version` of both binaries: what an operator checks after an upgrade.
use std::process::Command;

#[test]
fn both_binaries_print_their_version() {
    let want = env!("CARGO_PKG_VERSION");
    for (bin, name) in [
        (env!("CARGO_BIN_EXE_devgate"), "devgate"),
        (env!("CARGO_BIN_EXE_devgate-hook"), "devgate-hook"),
    ] {
        let out = Command::new(bin).arg("--version").output().expect(name);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {stdout}");
        assert_eq!(stdout.trim(), format!("{name} {want}"), "{name}");
    }
}
