//! `install/bootstrap.sh --uninstall` after a re-run that replaced the
//! installed devgate: the manifest then records the binary after the PF's
//! VF count, and the count is still put back, read with that devgate before
//! it goes.
mod bootstrap;

use bootstrap::*;

#[test]
fn the_vf_count_is_put_back_before_the_devgate_reading_the_ledger_goes() {
    use devgate::ledger::{Ledger, NoTeardown};
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let pf_dir = link_vfs(&prefix);
    let hooks = hooks_dir(dir.path());
    let version = ["--containerd-version", "1.7.24"];
    let numvfs = || std::fs::read_to_string(pf_dir.join("sriov_numvfs")).unwrap();
    let installed = bootstrap(&prefix, &hooks, &version);
    assert!(installed.ok, "{}", installed.out);
    assert_eq!(numvfs().trim(), "4");

    // A newer build: the re-run replaces the installed devgate and records
    // it last.
    let newer = dir.path().join("newer");
    let mut build = std::fs::read(DEVGATE).unwrap();
    build.extend_from_slice(b"a newer build");
    write_executable(&newer.join("devgate"), build);
    let hook = std::fs::read(env!("CARGO_BIN_EXE_devgate-hook")).unwrap();
    write_executable(&newer.join("devgate-hook"), hook);
    let devgate = prefix.join("usr/local/bin/devgate");
    let newer_bin = ["--bin-dir", newer.to_str().unwrap()];
    let rerun = bootstrap(&prefix, &hooks, &[&version[..], &newer_bin].concat());
    assert!(rerun.ok, "{}", rerun.out);
    let manifest =
        std::fs::read_to_string(prefix.join("var/lib/devgate/install/manifest")).unwrap();
    let line = |kind: &str, key: &str| {
        manifest
            .lines()
            .position(|l| l.starts_with(&format!("{kind}\t{key}\t")))
            .unwrap_or_else(|| panic!("no {kind} {key} in:\n{manifest}"))
    };
    assert!(
        line("created", "/usr/local/bin/devgate") > line("numvfs", PF),
        "{manifest}"
    );

    // The ledger, which the pods have left: read to see that no VF is held.
    hold_vf(&prefix, "0000:19:00.2");
    let ledger = Ledger::open(&prefix.join("run/devgate")).unwrap();
    ledger.release_pod("sb-a", &NoTeardown).unwrap();

    // No other devgate to read it with than the installed one.
    let no_bin = dir.path().join("no-bin");
    std::fs::create_dir(&no_bin).unwrap();
    let args = ["--uninstall", "--bin-dir", no_bin.to_str().unwrap()];
    let undone = bootstrap(&prefix, &hooks, &args);
    assert!(undone.ok, "{}", undone.out);
    assert_eq!(numvfs().trim(), "2");
    assert!(!devgate.exists());
    assert!(!prefix.join("var/lib/devgate/install/manifest").exists());
}
