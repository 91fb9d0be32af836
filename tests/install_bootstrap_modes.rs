//! `install/bootstrap.sh` and what it finds: containerd configs it must edit,
//! leave alone or refuse, and a node switched between its two install modes.
mod bootstrap;

use bootstrap::*;

#[test]
fn containerd_configs_it_must_not_touch_or_cannot_edit() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    // (containerd version, config, bootstrap succeeds, config after)
    let on = "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = \"/x\"\n  disable = false\n";
    let cases = [
        (
            "2.1.9",
            "version = 3\n[plugins]\n",
            true,
            Some("version = 3\n[plugins]\n"),
        ),
        ("1.7.24", on, true, Some(on)),
        (
            "1.7.24",
            "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n    disable = true # off\n[x]\n",
            true,
            Some("version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n    disable = false\n[x]\n"),
        ),
        (
            "2.1.9",
            "version = 3\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = \"/x\"\n",
            true,
            Some("version = 3\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = \"/x\"\n"),
        ),
        (
            "1.7.24",
            "version = 2\ndisabled_plugins = [\"io.containerd.nri.v1.nri\"]\n",
            false,
            None,
        ),
        // The quoting `containerd config default` of 2.x writes: edited in
        // place, never a second table of the same name.
        (
            "2.1.9",
            "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n",
            true,
            Some("version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = false\n"),
        ),
        (
            "1.7.24",
            "version = 2\n[ plugins.'io.containerd.nri.v1.nri' ]\n  socket_path = '/x'\n",
            true,
            Some("version = 2\n[ plugins.'io.containerd.nri.v1.nri' ]\n  socket_path = '/x'\n  disable = false\n"),
        ),
        ("1.7.24", "[plugins.cri]\n", false, None),
        ("1.6.20", "version = 2\n", false, None),
    ];
    for (i, (version, config, ok, after)) in cases.into_iter().enumerate() {
        let prefix = dir.path().join(format!("node{i}"));
        let path = prefix.join("etc/containerd/config.toml");
        write(&path, config);
        let run = bootstrap(&prefix, &hooks, &["--containerd-version", version]);
        assert_eq!(run.ok, ok, "case {i}:\n{}", run.out);
        let want = after.unwrap_or(config);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            want,
            "case {i}:\n{}",
            run.out
        );
        assert_eq!(
            run.out.contains("systemctl restart containerd"),
            ok && want != config,
            "case {i}:\n{}",
            run.out
        );
    }
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

/// One plugin per node: switching between the systemd unit and the
/// pre-installed plugin removes the other, so two never share the ledger.
#[test]
fn switching_modes_leaves_one_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("node");
    std::fs::create_dir_all(&prefix).unwrap();
    let hooks = hooks_dir(dir.path());
    let unit = prefix.join("etc/systemd/system/devgate.service");
    let plugin = prefix.join("opt/nri/plugins/10-devgate");
    let conf = prefix.join("etc/nri/conf.d/10-devgate.conf");
    let version = ["--containerd-version", "1.7.24"];

    assert!(bootstrap(&prefix, &hooks, &version).ok);
    assert!(unit.exists() && !plugin.exists());

    let pre = bootstrap(&prefix, &hooks, &["--preinstalled", version[0], version[1]]);
    assert!(pre.ok, "{}", pre.out);
    assert!(!unit.exists(), "{}", pre.out);
    assert!(plugin.exists() && conf.is_symlink());
    assert!(
        position(&pre.out, "systemctl disable --now devgate.service")
            < position(&pre.out, "systemctl daemon-reload"),
        "{}",
        pre.out
    );

    let back = bootstrap(&prefix, &hooks, &version);
    assert!(back.ok, "{}", back.out);
    assert!(unit.exists(), "{}", back.out);
    assert!(!plugin.exists() && !conf.is_symlink(), "{}", back.out);
    position(&back.out, "systemctl restart containerd.service");

    let undo = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(undo.ok, "{}", undo.out);
    assert!(!unit.exists() && !plugin.exists(), "{}", undo.out);
}
