//! `install/bootstrap.sh` on nodes other than a plain containerd one.
//! `--hooks-only`: a node whose runtime runs devgate-hook from hooks.d
//! (podman, CRI-O without NRI) gets the binaries, the config and the hooks.d
//! files, and no NRI change and no plugin; one switched from a plugin install
//! loses the plugin. `--node-only`: a node whose plugin is the DaemonSet's
//! gets NRI enabled and the config, and no plugin. A k3s or RKE2 node, whose
//! containerd reads a config bootstrap does not edit, is refused before any
//! change.
mod bootstrap;

use std::path::Path;

use bootstrap::*;

const HOOKS_D: [&str; 2] = [
    "etc/containers/oci/hooks.d/devgate.json",
    "usr/share/containers/oci/hooks.d/devgate.json",
];

fn fresh(dir: &Path, name: &str) -> std::path::PathBuf {
    let prefix = dir.join(name);
    std::fs::create_dir_all(&prefix).unwrap();
    prefix
}

#[test]
fn hooks_only_installs_the_hook_side_and_no_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = fresh(dir.path(), "podman");
    let args = ["--hooks-only", "--containerd-version", "none"];

    let run = bootstrap(&prefix, &hooks, &args);
    assert!(run.ok, "{}", run.out);
    for file in [
        "usr/local/bin/devgate",
        "usr/local/bin/devgate-hook",
        "etc/devgate/config.toml",
    ]
    .into_iter()
    .chain(HOOKS_D)
    {
        assert!(prefix.join(file).is_file(), "{file} missing:\n{}", run.out);
    }
    for absent in [
        "etc/systemd/system/devgate.service",
        "opt/nri/plugins/10-devgate",
        "etc/containerd/config.toml",
    ] {
        assert!(!prefix.join(absent).exists(), "{absent}:\n{}", run.out);
    }
    assert!(!run.out.contains("systemctl"), "{}", run.out);

    let again = bootstrap(&prefix, &hooks, &args);
    assert!(again.ok, "{}", again.out);
    position(&again.out, "no changes");

    let gone = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(gone.ok, "{}", gone.out);
    for file in ["usr/local/bin/devgate-hook"].into_iter().chain(HOOKS_D) {
        assert!(!prefix.join(file).exists(), "{file} left:\n{}", gone.out);
    }
}

/// A node switched from either plugin install: the plugin goes (it would
/// apply the same pods through NRI), containerd's config stays as it was.
#[test]
fn hooks_only_takes_away_an_earlier_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    for (name, mode, plugin, says) in [
        (
            "systemd",
            None,
            "etc/systemd/system/devgate.service",
            "systemctl disable --now devgate.service",
        ),
        (
            "preinstalled",
            Some("--preinstalled"),
            "opt/nri/plugins/10-devgate",
            "systemctl restart containerd.service",
        ),
    ] {
        let prefix = fresh(dir.path(), name);
        let version = ["--containerd-version", "1.7.24"];
        let args: Vec<&str> = mode.into_iter().chain(version).collect();
        let installed = bootstrap(&prefix, &hooks, &args);
        assert!(installed.ok, "{name}: {}", installed.out);
        assert!(prefix.join(plugin).exists(), "{name}: {}", installed.out);
        let ctrd = prefix.join("etc/containerd/config.toml");
        let config = std::fs::read_to_string(&ctrd).unwrap();

        let switched = bootstrap(&prefix, &hooks, &["--hooks-only", version[0], version[1]]);
        assert!(switched.ok, "{name}: {}", switched.out);
        assert!(!prefix.join(plugin).exists(), "{name}: {}", switched.out);
        position(&switched.out, says);
        position(&switched.out, "never reads hooks.d");
        assert_eq!(std::fs::read_to_string(&ctrd).unwrap(), config, "{name}");
        assert!(HOOKS_D.iter().all(|f| prefix.join(f).is_file()), "{name}");
        assert!(
            !prefix.join("etc/nri/conf.d/10-devgate.conf").exists(),
            "{name}"
        );
        let again = bootstrap(&prefix, &hooks, &["--hooks-only", version[0], version[1]]);
        assert!(again.ok, "{name}: {}", again.out);
        position(&again.out, "no changes");
    }
}

/// A pre-installed plugin that stays where containerd starts it after the
/// switch (edited since it was written, or the file it replaced put back)
/// would apply the same pods again through NRI: the run fails, naming it.
#[test]
fn hooks_only_fails_where_a_pre_installed_plugin_stays() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let plugin = "opt/nri/plugins/10-devgate";
    let version = ["--containerd-version", "1.7.24"];
    for case in ["edited", "replaced"] {
        let prefix = fresh(dir.path(), case);
        let original = b"#!/bin/sh\n# a plugin put here by hand\n";
        if case == "replaced" {
            write_executable(&prefix.join(plugin), original);
        }
        let installed = bootstrap(&prefix, &hooks, &["--preinstalled", version[0], version[1]]);
        assert!(installed.ok, "{case}: {}", installed.out);
        let edited = b"#!/bin/sh\n# changed after the install\n";
        if case == "edited" {
            std::fs::write(prefix.join(plugin), edited).unwrap();
        }

        let switched = bootstrap(&prefix, &hooks, &["--hooks-only", version[0], version[1]]);
        assert!(!switched.ok, "{case}: {}", switched.out);
        position(&switched.out, "/opt/nri/plugins/10-devgate is still there");
        let left = std::fs::read(prefix.join(plugin)).unwrap();
        let expected: &[u8] = if case == "edited" { edited } else { original };
        assert_eq!(left, expected, "{case}: {}", switched.out);
        assert!(HOOKS_D.iter().all(|f| prefix.join(f).is_file()), "{case}");
        // No longer in the manifest, it still fails the next run.
        let again = bootstrap(&prefix, &hooks, &["--hooks-only", version[0], version[1]]);
        assert!(!again.ok, "{case}: {}", again.out);
        position(&again.out, "/opt/nri/plugins/10-devgate is still there");
    }
}

#[test]
fn hooks_only_refuses_other_modes_and_a_missing_hooks_file() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    for other in ["--node-only", "--preinstalled"] {
        let prefix = fresh(dir.path(), other.trim_start_matches('-'));
        let run = bootstrap(&prefix, &hooks, &["--hooks-only", other]);
        assert!(!run.ok, "{}", run.out);
        position(&run.out, "it takes neither --preinstalled nor --node-only");
        assert!(
            std::fs::read_dir(&prefix).unwrap().next().is_none(),
            "{}",
            run.out
        );
    }
    // Without a hooks.d file to install, the mode would install nothing a
    // runtime runs.
    let empty = dir.path().join("no-hooks");
    std::fs::create_dir_all(&empty).unwrap();
    let prefix = fresh(dir.path(), "bare");
    let run = bootstrap(
        &prefix,
        &empty,
        &["--hooks-only", "--containerd-version", "none"],
    );
    assert!(!run.ok, "{}", run.out);
    position(
        &run.out,
        "no runtime would run devgate-hook; nothing changed",
    );
    assert!(
        std::fs::read_dir(&prefix).unwrap().next().is_none(),
        "{}",
        run.out
    );
}

/// The plugin an earlier install left releases the pods it admitted; while
/// pods hold devices, `--hooks-only` does not take it away.
#[test]
fn hooks_only_keeps_a_plugin_whose_pods_hold_devices() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = node(dir.path());
    let version = ["--containerd-version", "1.7.24"];
    let installed = bootstrap(&prefix, &hooks, &version);
    assert!(installed.ok, "{}", installed.out);
    hold_vf(&prefix, "0000:19:00.2");
    let before = snapshot(&prefix);
    let switched = bootstrap(&prefix, &hooks, &["--hooks-only", version[0], version[1]]);
    assert!(!switched.ok, "{}", switched.out);
    position(
        &switched.out,
        "only the NRI plugin this would remove releases",
    );
    assert_eq!(snapshot(&prefix), before, "{}", switched.out);
}

/// k3s's and RKE2's containerd renders its config from a template at each
/// start: refused, naming it, before any change, unless `--containerd-version
/// none` says NRI was enabled there by hand.
#[test]
fn an_embedded_containerd_is_refused_before_any_change() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = fresh(dir.path(), "k3s");
    let socket = prefix.join("run/k3s/containerd/containerd.sock");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    std::fs::write(&socket, b"").unwrap();
    let before = snapshot(&prefix);
    for args in [&[][..], &["--containerd-version", "1.7.24"][..]] {
        let run = bootstrap(&prefix, &hooks, args);
        assert!(!run.ok, "{args:?}: {}", run.out);
        position(&run.out, "config.toml.tmpl");
        assert_eq!(snapshot(&prefix), before, "{args:?}: {}", run.out);
    }
    let run = bootstrap(&prefix, &hooks, &["--containerd-version", "none"]);
    assert!(run.ok, "{}", run.out);
    assert!(prefix.join("etc/systemd/system/devgate.service").exists());
    assert!(!prefix.join("etc/containerd/config.toml").exists());
    // Nor does that containerd read hooks.d.
    let hooks_only = fresh(dir.path(), "k3s-hooks");
    std::fs::create_dir_all(hooks_only.join("run/k3s/containerd")).unwrap();
    std::fs::write(hooks_only.join("run/k3s/containerd/containerd.sock"), b"").unwrap();
    let run = bootstrap(
        &hooks_only,
        &hooks,
        &["--hooks-only", "--containerd-version", "none"],
    );
    assert!(run.ok, "{}", run.out);
    position(&run.out, "never reads hooks.d");
}

/// The hooks.d directories CRI-O and podman are configured to read get
/// devgate's file too: the `hooks_dir` of the last of CRI-O's config files
/// that sets it (a drop-in after crio.conf, any name, in a subdirectory as
/// CRI-O walks them) in `[crio.runtime]`, a dotted key included, and
/// containers.conf's in `[engine]`, each a TOML array that may span lines, a
/// key of that name in another table not one of them; the uninstall takes
/// them away again.
#[test]
fn hooks_dirs_the_runtimes_configure_get_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = fresh(dir.path(), "crio");
    for (file, text) in [
        (
            "etc/crio/crio.conf",
            "[crio.runtime]\nhooks_dir = [\"/etc/crio/superseded.d\"]\n",
        ),
        (
            "etc/crio/crio.conf.d/10-site/hooks",
            // A dotted key: `[crio.runtime] hooks_dir` to TOML.
            "[crio]\nruntime.hooks_dir = [\n  \"/usr/share/containers/oci/hooks.d\",  # the default\n  \"/opt/crio/hooks.d\",\n  \"relative/hooks.d\",\n]\n",
        ),
        (
            "etc/crio/crio.conf.d/20-other.conf",
            "[crio.api]\nhooks_dir = [\"/etc/crio/decoy.d\"]\n",
        ),
        (
            "etc/containers/containers.conf",
            // A multi-line basic string, on one line.
            "[containers]\nhooks_dir = [\"/etc/containers/decoy.d\"]\n[ engine ]\nhooks_dir = [\"\"\"/var/lib/podman/hooks\"\"\"]\n",
        ),
    ] {
        write(&prefix.join(file), text);
    }
    let args = ["--hooks-only", "--containerd-version", "none"];
    let run = bootstrap(&prefix, &hooks, &args);
    assert!(run.ok, "{}", run.out);
    let refused = "hooks_dir relative/hooks.d is not an absolute path";
    assert_eq!(run.out.matches(refused).count(), 1, "{}", run.out);
    let any_refused = "is not an absolute path";
    assert_eq!(run.out.matches(any_refused).count(), 1, "{}", run.out);
    let placed = [
        "opt/crio/hooks.d/devgate.json",
        "var/lib/podman/hooks/devgate.json",
    ];
    for file in placed.into_iter().chain(HOOKS_D) {
        assert!(prefix.join(file).is_file(), "{file} missing:\n{}", run.out);
    }
    let unread = [
        "etc/crio/superseded.d",
        "etc/crio/decoy.d",
        "etc/containers/decoy.d",
    ];
    for dir in unread {
        assert!(!prefix.join(dir).exists(), "{dir}: {}", run.out);
    }
    let again = bootstrap(&prefix, &hooks, &args);
    assert!(again.ok, "{}", again.out);
    position(&again.out, "no changes");

    let gone = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(gone.ok, "{}", gone.out);
    for file in placed.into_iter().chain(HOOKS_D) {
        assert!(!prefix.join(file).exists(), "{file} left:\n{}", gone.out);
    }
    // With the directories it made for them.
    for made in ["opt/crio", "var/lib/podman"] {
        assert!(!prefix.join(made).exists(), "{made} left:\n{}", gone.out);
    }
}

/// A node whose plugin is the DaemonSet's: `--node-only` enables NRI and
/// writes the config, installs no plugin, and takes away the one an earlier
/// install left, which would run beside the DaemonSet's on the same ledger.
#[test]
fn node_only_prepares_the_node_and_leaves_the_plugin_to_the_daemonset() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("node");
    std::fs::create_dir_all(&prefix).unwrap();
    let hooks = hooks_dir(dir.path());
    let version = ["--containerd-version", "1.7.24"];
    let unit = prefix.join("etc/systemd/system/devgate.service");
    let plugin = prefix.join("opt/nri/plugins/10-devgate");
    let ctrd = prefix.join("etc/containerd/config.toml");

    let fresh = bootstrap(&prefix, &hooks, &["--node-only", version[0], version[1]]);
    assert!(fresh.ok, "{}", fresh.out);
    assert!(!unit.exists() && !plugin.exists(), "{}", fresh.out);
    assert!(
        !prefix.join("usr/local/bin/devgate").exists(),
        "{}",
        fresh.out
    );
    assert!(prefix.join("etc/devgate/config.toml").exists());
    assert!(std::fs::read_to_string(&ctrd)
        .unwrap()
        .contains("disable = false"));

    let systemd = bootstrap(&prefix, &hooks, &version);
    assert!(systemd.ok && unit.exists(), "{}", systemd.out);
    let switched = bootstrap(&prefix, &hooks, &["--node-only", version[0], version[1]]);
    assert!(switched.ok, "{}", switched.out);
    assert!(!unit.exists(), "{}", switched.out);
    position(&switched.out, "systemctl disable --now devgate.service");

    let both = bootstrap(&prefix, &hooks, &["--node-only", "--preinstalled"]);
    assert!(!both.ok, "{}", both.out);
}

/// Without a `devgate` to read the node preparation with, `--node-only` (as
/// on a node that has only the DaemonSet's image) stops before its first
/// change, naming `--bin-dir`, instead of after editing containerd's config.
#[test]
fn node_only_without_devgate_stops_before_any_change() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("node");
    let empty = dir.path().join("no-binaries");
    std::fs::create_dir_all(&empty).unwrap();
    let hooks = hooks_dir(dir.path());
    let ctrd = prefix.join("etc/containerd/config.toml");
    let config = "version = 2\n";
    write(&ctrd, config);
    for mode in [&["--node-only"][..], &[]] {
        let args = [
            mode,
            &[
                "--containerd-version",
                "1.7.24",
                "--bin-dir",
                empty.to_str().unwrap(),
            ],
        ]
        .concat();
        let run = bootstrap(&prefix, &hooks, &args);
        assert!(!run.ok, "{}", run.out);
        assert!(run.out.contains("nothing changed"), "{}", run.out);
        assert_eq!(
            run.out.contains("--bin-dir with a directory"),
            !mode.is_empty(),
            "{}",
            run.out
        );
        assert_eq!(std::fs::read_to_string(&ctrd).unwrap(), config);
        assert!(!prefix.join("etc/devgate").exists(), "{}", run.out);
        assert!(!prefix.join("var/lib/devgate").exists(), "{}", run.out);
    }
    // A full install needs the hook as well: without it, nothing is copied.
    let half = dir.path().join("devgate-only");
    std::fs::create_dir_all(&half).unwrap();
    std::os::unix::fs::symlink(DEVGATE, half.join("devgate")).unwrap();
    let args = [
        "--containerd-version",
        "1.7.24",
        "--bin-dir",
        half.to_str().unwrap(),
    ];
    let run = bootstrap(&prefix, &hooks, &args);
    assert!(!run.ok, "{}", run.out);
    assert!(
        run.out.contains("no devgate-hook in --bin-dir"),
        "{}",
        run.out
    );
    assert!(
        !prefix.join("usr/local/bin/devgate").exists(),
        "{}",
        run.out
    );
    assert_eq!(std::fs::read_to_string(&ctrd).unwrap(), config);
}
