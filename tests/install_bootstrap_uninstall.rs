//! `install/bootstrap.sh --uninstall`: a containerd config edited after the
//! install is kept, a re-run's config is the one returned to, and after a
//! re-run that replaced the installed devgate the manifest records the
//! binary after the PF's VF count, which is still put back, read with that
//! devgate before it goes.
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

#[test]
fn uninstall_keeps_a_containerd_config_edited_after_install() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let hooks = hooks_dir(dir.path());
    assert!(bootstrap(&prefix, &hooks, &[]).ok);
    let path = prefix.join("etc/containerd/config.toml");
    let edited = format!(
        "{}# edited by hand\n",
        std::fs::read_to_string(&path).unwrap()
    );
    std::fs::write(&path, &edited).unwrap();

    let undo = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(!undo.ok, "{}", undo.out);
    position(&undo.out, "changed after devgate wrote it");
    assert!(
        !undo.out.contains("systemctl restart containerd"),
        "nothing restored, so no restart:\n{}",
        undo.out
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), edited);
    let backup = prefix.join("etc/containerd/config.toml.devgate-backup");
    assert_eq!(std::fs::read_to_string(backup).unwrap(), CONTAINERD_CONFIG);
    assert!(
        !prefix.join("usr/local/bin/devgate").exists(),
        "{}",
        undo.out
    );
    assert!(
        prefix.join("var/lib/devgate/install/manifest").exists(),
        "the manifest must stay for a retry"
    );
}

/// A config rewritten by someone else after an install (configuration
/// management, `containerd config default`), then a second install: the
/// uninstall returns to that config, not to the one before the first install,
/// and never deletes it.
#[test]
fn uninstall_after_a_rerun_returns_to_the_config_found_then() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("node");
    std::fs::create_dir_all(&prefix).unwrap();
    let hooks = hooks_dir(dir.path());
    let version = ["--containerd-version", "1.7.24"];
    let path = prefix.join("etc/containerd/config.toml");
    assert!(bootstrap(&prefix, &hooks, &version).ok);
    assert!(path.exists(), "created on a node without a config");
    let operators =
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.9\"\n";
    write(&path, operators);
    let rerun = bootstrap(&prefix, &hooks, &version);
    assert!(rerun.ok, "{}", rerun.out);
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .contains("disable = false"));
    let undo = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(undo.ok, "{}", undo.out);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), operators);
}
