//! `install/bootstrap.sh` on a containerd whose NRI table moves its socket or
//! its plugin directories: the unit dials the socket the config names (an
//! import's table replacing the main config's on containerd 1.x, merged with
//! it key by key on 2.x),
//! a pre-installed plugin is refused where containerd would not look for it,
//! and a path the unit cannot carry is refused, each before any change; so is
//! a table that shuts out plugin connections, unless containerd starts
//! devgate itself.
mod bootstrap;

use std::path::Path;

use bootstrap::*;

const UNIT: &str = "etc/systemd/system/devgate.service";

/// A node of [`node`] whose containerd config's NRI table (in containerd
/// 2.x's quoting) holds `table`.
fn node_with_nri(dir: &Path, table: &str) -> std::path::PathBuf {
    let prefix = node(dir);
    write(
        &prefix.join("etc/containerd/config.toml"),
        &format!("version = 3\n\n[plugins.'io.containerd.nri.v1.nri']\n  disable = false\n{table}\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_cdi = true\n"),
    );
    prefix
}

/// Asserts that the installed unit's `devgate nri` dials `socket`.
fn assert_dials(prefix: &Path, socket: &str) {
    let unit = std::fs::read_to_string(prefix.join(UNIT)).unwrap();
    let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
    assert!(exec.contains(&format!(" --socket {socket} ")), "{exec}");
}

const VERSION: [&str; 2] = ["--containerd-version", "2.1.9"];

#[test]
fn the_unit_dials_the_socket_the_config_names() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = node_with_nri(
        dir.path(),
        "  socket_path = \"/run/containerd/nri.sock\"  # moved\n",
    );
    let run = bootstrap(&prefix, &hooks, &VERSION);
    assert!(run.ok, "{}", run.out);
    assert_dials(&prefix, "/run/containerd/nri.sock");
    position(
        &run.out,
        "containerd's NRI socket, from /etc/containerd/config.toml: /run/containerd/nri.sock",
    );

    // An imported file's socket_path wins over the main config's.
    let mut main = std::fs::read_to_string(prefix.join("etc/containerd/config.toml")).unwrap();
    main.insert_str(0, "imports = ['conf.d/*.toml']\n");
    write(&prefix.join("etc/containerd/config.toml"), &main);
    write(
        &prefix.join("etc/containerd/conf.d/nri.toml"),
        "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  socket_path = '/var/lib/nri/api.sock'\n",
    );
    let again = bootstrap(&prefix, &hooks, &VERSION);
    assert!(again.ok, "{}", again.out);
    assert_dials(&prefix, "/var/lib/nri/api.sock");
    // containerd 2.x merges the tables key by key: one that sets no
    // socket_path leaves the main config's in force.
    write(
        &prefix.join("etc/containerd/conf.d/nri.toml"),
        "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n",
    );
    let third = bootstrap(&prefix, &hooks, &VERSION);
    assert!(third.ok, "{}", third.out);
    assert_dials(&prefix, "/run/containerd/nri.sock");

    // The default socket, under either name, is the default.
    let prefix = node_with_nri(
        &dir.path().join("plain"),
        "  socket_path = \"/run/nri/nri.sock\"\n",
    );
    let run = bootstrap(&prefix, &hooks, &VERSION);
    assert!(run.ok, "{}", run.out);
    assert_dials(&prefix, "/var/run/nri/nri.sock");
}

/// containerd 1.x replaces a plugin's whole table with an imported one: an
/// imported NRI table without socket_path puts the default back, whatever
/// the main config's table said.
#[test]
fn on_containerd_1_an_imported_table_replaces_the_socket_path() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = node(dir.path());
    write(
        &prefix.join("etc/containerd/config.toml"),
        "version = 2\nimports = ['conf.d/*.toml']\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  socket_path = \"/run/containerd/nri.sock\"\n",
    );
    let nri = prefix.join("etc/containerd/conf.d/nri.toml");
    write(
        &nri,
        "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n",
    );
    let version = ["--containerd-version", "1.7.24"];
    let run = bootstrap(&prefix, &hooks, &version);
    assert!(run.ok, "{}", run.out);
    assert_dials(&prefix, "/var/run/nri/nri.sock");

    write(&nri, "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  socket_path = '/var/lib/nri/api.sock'\n");
    let again = bootstrap(&prefix, &hooks, &version);
    assert!(again.ok, "{}", again.out);
    assert_dials(&prefix, "/var/lib/nri/api.sock");
}

/// `--containerd-version none` with a containerd config left on the node
/// (containerd removed): there are no NRI settings to read, and no version
/// to read them by.
#[test]
fn without_containerd_its_config_is_not_read_for_nri_settings() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = node_with_nri(dir.path(), "  socket_path = \"/run/containerd/nri.sock\"\n");
    let run = bootstrap(&prefix, &hooks, &["--containerd-version", "none"]);
    assert!(run.ok, "{}", run.out);
    assert!(
        !run.out.contains("cannot read the containerd version"),
        "{}",
        run.out
    );
    position(&run.out, "no containerd on this node");
}

/// TOML's multi-line strings, written on one line as a path is, name the
/// socket too, in either quotes.
#[test]
fn a_socket_path_in_triple_quotes_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    for (i, value) in [r#""""/run/a/nri.sock""""#, "'''/run/a/nri.sock'''"]
        .iter()
        .enumerate()
    {
        let table = format!("  socket_path = {value}\n");
        let prefix = node_with_nri(&dir.path().join(i.to_string()), &table);
        let run = bootstrap(&prefix, &hooks, &VERSION);
        assert!(run.ok, "{value}: {}", run.out);
        assert_dials(&prefix, "/run/a/nri.sock");
    }
}

#[test]
fn paths_the_install_cannot_follow_are_refused_before_any_change() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    for (name, table, args, refusal) in [
        (
            "spaced",
            "  socket_path = \"/run/my nri/nri.sock\"\n",
            &[][..],
            "sets the NRI socket_path /run/my nri/nri.sock, which the unit cannot name as written",
        ),
        (
            "plugins",
            "  plugin_path = \"/usr/libexec/nri\"\n",
            &["--preinstalled"][..],
            "sets the NRI plugin_path /usr/libexec/nri, where --preinstalled installs into /opt/nri/plugins",
        ),
        (
            "confs",
            "  plugin_config_path = '/etc/containerd/nri.d'\n",
            &["--preinstalled"][..],
            "sets the NRI plugin_config_path /etc/containerd/nri.d, where --preinstalled installs into /etc/nri/conf.d",
        ),
    ] {
        let prefix = node_with_nri(&dir.path().join(name), table);
        let before = snapshot(&prefix);
        let args: Vec<&str> = VERSION.iter().chain(args).copied().collect();
        let run = bootstrap(&prefix, &hooks, &args);
        assert!(!run.ok, "{name}: {}", run.out);
        position(&run.out, refusal);
        position(&run.out, "nothing changed");
        assert_eq!(snapshot(&prefix), before, "{name} changed:\n{}", run.out);
    }

    // A socket the unit could not name is no matter where containerd hands
    // the plugin its connection.
    let prefix = node_with_nri(
        &dir.path().join("handed"),
        "  socket_path = \"/run/my nri/nri.sock\"\n",
    );
    let run = bootstrap(&prefix, &hooks, &["--preinstalled", VERSION[0], VERSION[1]]);
    assert!(run.ok, "{}", run.out);

    // The directories as containerd's defaults name them are no refusal.
    let prefix = node_with_nri(
        &dir.path().join("defaults"),
        "  plugin_path = \"/opt/nri/plugins/\"\n  plugin_config_path = \"/etc/nri/conf.d\"\n",
    );
    let run = bootstrap(&prefix, &hooks, &["--preinstalled", VERSION[0], VERSION[1]]);
    assert!(run.ok, "{}", run.out);
    assert!(prefix.join("opt/nri/plugins/10-devgate").is_file());
}

/// The DaemonSet mounts /var/run/nri: a node-only install on a moved socket
/// says what to change there.
#[test]
fn a_node_only_install_on_a_moved_socket_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = node_with_nri(dir.path(), "  socket_path = \"/run/containerd/nri.sock\"\n");
    let run = bootstrap(&prefix, &hooks, &["--node-only", VERSION[0], VERSION[1]]);
    assert!(run.ok, "{}", run.out);
    position(
        &run.out,
        "containerd's NRI socket is /run/containerd/nri.sock: set the DaemonSet's --socket and its nri volume's hostPath to match",
    );
    assert!(!prefix.join(UNIT).exists());
}

/// `disable_connections = true` keeps every plugin that dials the socket out:
/// refused for `devgate nri`, named in the error; taken as it is for a
/// pre-installed devgate, which containerd starts itself.
#[test]
fn shut_out_connections_are_refused_unless_preinstalled() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let config = "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  disable_connections = true\n";
    for (mode, ok) in [(&[][..], false), (&["--preinstalled"], true)] {
        let prefix = dir.path().join(format!("node-{ok}"));
        write(&prefix.join("etc/containerd/config.toml"), config);
        let args = [mode, &["--containerd-version", "1.7.24"]].concat();
        let run = bootstrap(&prefix, &hooks, &args);
        assert_eq!(run.ok, ok, "{}", run.out);
        if !ok {
            position(&run.out, "sets disable_connections = true in [plugins.\"io.containerd.nri.v1.nri\"], which keeps devgate nri from ever connecting");
            let bin = prefix.join("usr/local/bin");
            assert!(!bin.exists(), "refused before any change: {}", run.out);
        }
        let after = std::fs::read_to_string(prefix.join("etc/containerd/config.toml")).unwrap();
        assert_eq!(after, config);
    }
}

/// A full temporary directory (a small `/tmp` tmpfs) fails the run at the
/// first file written through it, the devgate unit: neither it nor the
/// containerd config the run would create for NRI is installed empty, and
/// nothing is restarted onto them.
#[test]
fn a_full_temporary_directory_installs_no_empty_config() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = dir.path().join("node");
    write(&prefix.join("etc/os-release"), "ID=debian\nVERSION_ID=12\n");
    let tmp = dir.path().join("full-tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4k", "tmpfs"])
        .arg(&tmp)
        .status()
        .is_ok_and(|s| s.success());
    assert!(mounted, "mount a tmpfs (tests run as root)");
    // Filled: a file can still be made there, but nothing written to it.
    let _ = std::fs::write(tmp.join("filler"), vec![b'x'; 64 * 1024]);
    let env: [(&str, &std::ffi::OsStr); 1] = [("TMPDIR", tmp.as_os_str())];
    let run = bootstrap_with_env(&prefix, &hooks, &["--containerd-version", "1.7.24"], &env);
    let _ = std::process::Command::new("umount").arg(&tmp).status();
    assert!(!run.ok, "{}", run.out);
    position(
        &run.out,
        "cannot write a temporary file for /etc/systemd/system/devgate.service",
    );
    assert!(!prefix.join(UNIT).exists(), "{}", run.out);
    assert!(
        !prefix.join("etc/containerd/config.toml").exists(),
        "{}",
        run.out
    );
    assert!(!run.out.contains("systemctl restart"), "{}", run.out);
}
