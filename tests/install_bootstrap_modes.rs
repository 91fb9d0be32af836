//! `install/bootstrap.sh` and what it finds: containerd configs it must edit,
//! leave alone or refuse, and a node switched between its two install modes.
mod bootstrap;

use std::path::Path;

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
        // A table beneath NRI's, as `containerd config default` of 2.2 writes
        // ([plugins.'io.containerd.nri.v1.nri'.default_validator]): NRI's
        // own keys end at its header.
        (
            "2.2.0",
            "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = false\n\n  [plugins.'io.containerd.nri.v1.nri'.default_validator]\n    enable = false\n",
            true,
            None,
        ),
        (
            "2.2.0",
            "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n  [plugins.'io.containerd.nri.v1.nri'.default_validator]\n    enable = false\n",
            true,
            Some("version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = false\n  [plugins.'io.containerd.nri.v1.nri'.default_validator]\n    enable = false\n"),
        ),
        (
            "1.7.24",
            "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = \"/x\"\n  [plugins.\"io.containerd.nri.v1.nri\".x]\n    y = 1\n",
            true,
            Some("version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = \"/x\"\n  disable = false\n  [plugins.\"io.containerd.nri.v1.nri\".x]\n    y = 1\n"),
        ),
        (
            "1.7.24",
            "version = 2\n[plugins.\"io.containerd.nri.v1.nri\".x]\n  y = 1\n",
            true,
            Some("version = 2\n[plugins.\"io.containerd.nri.v1.nri\".x]\n  y = 1\n\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n"),
        ),
        // External plugins shut out, `devgate nri` among them: the
        // operator's choice is refused, not undone.
        (
            "2.1.9",
            "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable_connections = true # x\n",
            false,
            None,
        ),
        (
            "1.7.24",
            "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  disable_connections = true\n",
            false,
            None,
        ),
        ("1.7.24", "[plugins.cri]\n", false, None),
        // A version 1 config: 2.x migrates it as it loads, NRI on, unless
        // it names NRI, which is not read in that layout.
        ("2.1.9", "[plugins.cri]\n", true, None),
        ("2.1.9", "disabled_plugins = [\"io.containerd.nri.v1.nri\"]\n", false, None),
        ("2.1.9", "# nri\n[plugins.cri]\n", true, None),
        ("1.6.20", "version = 2\n", false, None),
        // CRLF line endings: neither the table's header nor its keys read as
        // such, so an edit would add a second table, which containerd
        // refuses to load; refused, unless nothing needs reading or adding.
        (
            "1.7.24",
            "version = 2\r\n[plugins.\"io.containerd.nri.v1.nri\"]\r\n  disable = true\r\n",
            false,
            None,
        ),
        ("1.7.24", "version = 2\r\n[plugins.cri]\r\n", false, None),
        ("2.1.9", "version = 3\r\n[plugins]\r\n", true, None),
        // The table under another spelling, or a quoted key in it.
        (
            "1.7.24",
            "version = 2\n[\"plugins\".\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
            false,
            None,
        ),
        (
            "1.7.24",
            "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  \"disable\" = true\n",
            false,
            None,
        ),
        // NRI already on, as written by hand: no rewrite, no restart.
        ("2.1.9", "version = 3\n[plugins]", true, None),
        (
            "1.7.24",
            "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n\tdisable=false # on\n",
            true,
            None,
        ),
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
        // containerd 1.7 has no `config migrate`: the refusal of a version 1
        // config names what to do instead.
        if config == "[plugins.cri]\n" && !ok {
            position(&run.out, "with version = 2 at its top");
            assert!(!run.out.contains("migrate"), "{}", run.out);
        }
        if config.contains('\r') && !ok {
            position(
                &run.out,
                "has CRLF line endings, which this edit does not read",
            );
        }
        if version == "2.1.9" && !config.contains("version") && !ok {
            position(
                &run.out,
                "is a version 1 config that names NRI: this script",
            );
        }
    }
    // A version 1 config's imports are migrated with it: one that names NRI
    // is refused, named, as the config itself would be.
    let prefix = dir.path().join("imports");
    let config = "imports = [\"conf.d/*.toml\"]\n[plugins.cri]\n";
    let path = importing_nri_off(&prefix, config);
    let run = bootstrap(&prefix, &hooks, &["--containerd-version", "2.1.9"]);
    assert!(!run.ok, "{}", run.out);
    position(
        &run.out,
        "is a version 1 config that imports /etc/containerd/conf.d/nri.toml, which names NRI:",
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), config);
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

/// A write that fails (a full disk; here the temporary name is taken by a
/// directory) stops bootstrap: nothing is installed, recorded or restarted.
#[test]
fn a_failed_write_stops_before_anything_is_installed_or_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let hooks = hooks_dir(dir.path());
    let cfg = prefix.join("etc/containerd/config.toml");
    std::fs::create_dir_all(prefix.join("etc/containerd/config.toml.devgate-new")).unwrap();
    let run = bootstrap(&prefix, &hooks, &[]);
    assert!(!run.ok, "{}", run.out);
    position(&run.out, "cannot install /etc/containerd/config.toml");
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), CONTAINERD_CONFIG);
    assert!(
        !run.out.contains("systemctl restart containerd"),
        "{}",
        run.out
    );
    let manifest = std::fs::read_to_string(prefix.join("var/lib/devgate/install/manifest"))
        .unwrap_or_default();
    assert!(
        !manifest.contains("/etc/containerd/config.toml"),
        "{manifest}"
    );
}

/// A plugin someone put in containerd's plugin directory by hand, replaced by
/// a pre-installed install: its backup is kept out of that directory, where
/// containerd would start it as a second plugin, and comes back at uninstall.
#[test]
fn a_replaced_plugin_is_backed_up_outside_the_plugin_directory() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("node");
    let plugins = prefix.join("opt/nri/plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let by_hand = plugins.join("10-devgate");
    write_executable(&by_hand, "#!/bin/sh\n# an older devgate, copied by hand\n");
    let hooks = hooks_dir(dir.path());
    let version = ["--containerd-version", "1.7.24"];
    let pre = bootstrap(&prefix, &hooks, &["--preinstalled", version[0], version[1]]);
    assert!(pre.ok, "{}", pre.out);
    let entries: Vec<String> = std::fs::read_dir(&plugins)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, ["10-devgate"], "{}", pre.out);
    let undo = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(undo.ok, "{}", undo.out);
    assert_eq!(
        std::fs::read_to_string(&by_hand).unwrap(),
        "#!/bin/sh\n# an older devgate, copied by hand\n"
    );
}

/// A run that installed devgate's files and then stopped on an error owes
/// devgate its restart: the next run, with the error gone, restarts it even
/// though devgate's own files are unchanged by then.
#[test]
fn a_run_stopped_after_its_changes_leaves_the_restarts_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let hooks = hooks_dir(dir.path());
    let blocker = prefix.join("etc/containerd/config.toml.devgate-new");
    std::fs::create_dir_all(&blocker).unwrap();
    let failed = bootstrap(&prefix, &hooks, &[]);
    assert!(!failed.ok, "{}", failed.out);
    assert!(
        !failed.out.contains("systemctl restart devgate"),
        "{}",
        failed.out
    );
    std::fs::remove_dir_all(&blocker).unwrap();
    let rerun = bootstrap(&prefix, &hooks, &[]);
    assert!(rerun.ok, "{}", rerun.out);
    position(&rerun.out, "restarts owed by an earlier run");
    position(&rerun.out, "systemctl restart devgate.service");
    // Paid: a third run owes nothing.
    let third = bootstrap(&prefix, &hooks, &[]);
    assert!(third.ok, "{}", third.out);
    assert!(!third.out.contains("systemctl restart"), "{}", third.out);
}

/// Binaries that do not run on the node (built against a newer C library,
/// another architecture) stop every mode before its first change: a
/// pre-installed plugin that cannot start would take containerd down.
#[test]
fn binaries_that_do_not_run_here_stop_before_any_change() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("node");
    let hooks = hooks_dir(dir.path());
    let ctrd = prefix.join("etc/containerd/config.toml");
    let config = "version = 2\n";
    write(&ctrd, config);
    let bins = dir.path().join("foreign");
    let broken = "#!/bin/sh\necho \"$0: /lib/x86_64-linux-gnu/libc.so.6: version 'GLIBC_2.39' not found\" >&2\nexit 1\n";
    let hook = Path::new(DEVGATE).with_file_name("devgate-hook");
    for (bad, good) in [
        ("devgate", hook.as_path()),
        ("devgate-hook", Path::new(DEVGATE)),
    ] {
        std::fs::remove_dir_all(&bins).ok();
        write_executable(&bins.join(bad), broken);
        let other = if bad == "devgate" {
            "devgate-hook"
        } else {
            "devgate"
        };
        std::os::unix::fs::symlink(good, bins.join(other)).unwrap();
        for mode in [&["--preinstalled"][..], &[], &["--node-only"]] {
            let args = [
                mode,
                &[
                    "--containerd-version",
                    "1.7.24",
                    "--bin-dir",
                    bins.to_str().unwrap(),
                ],
            ]
            .concat();
            let run = bootstrap(&prefix, &hooks, &args);
            if bad == "devgate-hook" && mode == ["--node-only"] {
                // --node-only installs no hook, and does not run it.
                assert!(run.ok, "{}", run.out);
                std::fs::remove_dir_all(&prefix).unwrap();
                write(&ctrd, config);
                continue;
            }
            assert!(!run.ok, "{}", run.out);
            position(&run.out, &format!("/{bad} does not run on this node: "));
            position(&run.out, "GLIBC_2.39");
            position(&run.out, "nothing changed");
            assert_eq!(std::fs::read_to_string(&ctrd).unwrap(), config);
            assert!(!prefix.join("usr/local/bin").exists(), "{}", run.out);
            assert!(!prefix.join("opt/nri").exists(), "{}", run.out);
        }
    }
}

/// A dry run shows the containerd config's edit without its context lines:
/// a config ending in a registry's credentials keeps them out of the output,
/// its last line without a newline too.
#[test]
fn a_dry_run_shows_no_lines_around_an_edit() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let hooks = hooks_dir(dir.path());
    let config = format!(
        "{CONTAINERD_CONFIG}\n  [plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"r.example\".auth]\n    username = \"ci\"\n    password = \"s3cret-token\""
    );
    std::fs::write(prefix.join("etc/containerd/config.toml"), config).unwrap();
    let dry = bootstrap(&prefix, &hooks, &["--dry-run"]);
    assert!(dry.ok, "{}", dry.out);
    assert!(dry.out.contains("+  disable = false"), "{}", dry.out);
    assert!(!dry.out.contains("s3cret-token"), "{}", dry.out);
    assert!(!dry.out.contains("username"), "{}", dry.out);
}

/// A file of someone else's where `--preinstalled` links the plugin's config
/// (`/etc/nri/conf.d/10-devgate.conf`) is refused before any change: the
/// unit of an earlier install still runs the plugin, and no pre-installed
/// copy waits for containerd's next start.
#[test]
fn a_foreign_preinstalled_config_is_refused_before_any_change() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("node");
    std::fs::create_dir_all(&prefix).unwrap();
    let hooks = hooks_dir(dir.path());
    let version = ["--containerd-version", "1.7.24"];
    assert!(bootstrap(&prefix, &hooks, &version).ok);
    let conf = prefix.join("etc/nri/conf.d/10-devgate.conf");
    write(&conf, "failure_policy = \"ignore\"\n");
    let before = snapshot(&prefix);
    let pre = bootstrap(&prefix, &hooks, &["--preinstalled", version[0], version[1]]);
    assert!(!pre.ok, "{}", pre.out);
    position(&pre.out, "10-devgate.conf exists and is not devgate's link");
    position(&pre.out, "nothing changed");
    assert_eq!(snapshot(&prefix), before, "{}", pre.out);
    assert!(!pre.out.contains("disable --now"), "{}", pre.out);
}
