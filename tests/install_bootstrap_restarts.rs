//! `install/bootstrap.sh` after its restarts: it waits for devgate to
//! register with the runtime, and undoes a pre-installed plugin that does
//! not, since containerd 1.7 does not run with one. systemd is a stand-in
//! (`DEVGATE_BOOTSTRAP_SYSTEMCTL`) that records each call and, where the
//! test says so, registers devgate the way the plugin does: a runtime's
//! Configure recorded in `/run/devgate/runtime.json`.
mod bootstrap;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use bootstrap::*;

const OLD_PLUGIN: &str = "#!/bin/sh\n# an older devgate, copied by hand\n";

/// The stand-in systemctl: appends its arguments to `calls`; a restart
/// registers devgate while the file `registers` exists.
struct Systemd {
    dir: PathBuf,
}

impl Systemd {
    fn new(dir: &Path, prefix: &Path) -> Systemd {
        let dir = dir.join("systemd");
        let script = format!(
            "#!/bin/sh\necho \"$*\" >> {calls}\ncase \"$*\" in \"restart devgate.service\") rm -f {old}\n  if [ -e {early} ]; then mkdir -p {run} && touch {run}/runtime.json; fi ;; \"restart containerd.service\")\n  if [ -e {old} ]; then mkdir -p {run} && touch {run}/runtime.json; fi ;;\nesac\ncase \"$1\" in restart)\n  if [ -e {registers} ]; then mkdir -p {run} && touch {run}/runtime.json; fi ;;\nesac\n",
            calls = dir.join("calls").display(),
            registers = dir.join("registers").display(),
            old = dir.join("old-plugin-runs").display(),
            early = dir.join("registers-before-containerd").display(),
            run = prefix.join("run/devgate").display(),
        );
        write_executable(&dir.join("systemctl"), &script);
        Systemd { dir }
    }

    fn registers(&self, yes: bool) {
        let flag = self.dir.join("registers");
        if yes {
            write(&flag, "");
        } else {
            let _ = std::fs::remove_file(flag);
        }
    }

    /// A devgate already running, which registers with containerd when
    /// containerd restarts, until devgate's own restart ends it.
    fn old_plugin_runs(&self) {
        write(&self.dir.join("old-plugin-runs"), "");
    }

    /// The new plugin registers with the containerd it finds at its start,
    /// the one about to restart, and never with the restarted one.
    fn registers_only_before_containerd(&self) {
        write(&self.dir.join("registers-before-containerd"), "");
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn run(&self, prefix: &Path, hooks: &Path, args: &[&str]) -> Run {
        let _ = std::fs::remove_file(self.dir.join("calls"));
        let systemctl = self.dir.join("systemctl");
        let env: [(&str, &OsStr); 2] = [
            ("DEVGATE_BOOTSTRAP_SYSTEMCTL", systemctl.as_os_str()),
            ("DEVGATE_REGISTER_WAIT", OsStr::new("1")),
        ];
        bootstrap_with_env(prefix, hooks, args, &env)
    }
}

const PRE: &[&str] = &["--preinstalled", "--containerd-version", "1.7.24"];

/// A node under a prefix, the hooks.d files, and the systemctl stand-in.
struct Rig {
    _dir: tempfile::TempDir,
    prefix: PathBuf,
    hooks: PathBuf,
    systemd: Systemd,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let hooks = hooks_dir(dir.path());
    let systemd = Systemd::new(dir.path(), &prefix);
    Rig {
        _dir: dir,
        prefix,
        hooks,
        systemd,
    }
}

#[test]
fn a_preinstalled_plugin_that_registers_stays() {
    let Rig {
        _dir,
        prefix,
        hooks,
        systemd,
    } = rig();
    systemd.registers(true);
    let run = systemd.run(&prefix, &hooks, PRE);
    assert!(run.ok, "{}", run.out);
    assert_eq!(
        systemd.calls(),
        ["restart containerd.service"],
        "{}",
        run.out
    );
    assert!(prefix.join("opt/nri/plugins/10-devgate").is_file());
    assert!(prefix.join("etc/nri/conf.d/10-devgate.conf").is_symlink());
}

/// containerd restarted onto a plugin that never registers: the plugin and
/// its config link go, containerd is restarted without them, the run fails
/// saying why, and the next run, with the plugin registering, installs them
/// again.
#[test]
fn a_preinstalled_plugin_that_does_not_register_is_undone() {
    let Rig {
        _dir,
        prefix,
        hooks,
        systemd,
    } = rig();
    let plugin = prefix.join("opt/nri/plugins/10-devgate");
    let conf = prefix.join("etc/nri/conf.d/10-devgate.conf");
    let failed = systemd.run(&prefix, &hooks, PRE);
    assert!(!failed.ok, "{}", failed.out);
    assert!(
        failed.out.contains("did not register") && failed.out.contains("journalctl -u containerd"),
        "{}",
        failed.out
    );
    assert!(!plugin.exists() && !conf.is_symlink(), "{}", failed.out);
    assert_eq!(
        systemd.calls(),
        ["restart containerd.service", "restart containerd.service"],
        "{}",
        failed.out
    );
    // Everything else of the install stays: the binaries, containerd's NRI.
    assert!(prefix.join("usr/local/bin/devgate").is_file());
    let manifest =
        std::fs::read_to_string(prefix.join("var/lib/devgate/install/manifest")).unwrap();
    assert!(
        !manifest.contains("/opt/nri/plugins/10-devgate"),
        "{manifest}"
    );

    systemd.registers(true);
    let again = systemd.run(&prefix, &hooks, PRE);
    assert!(again.ok, "{}", again.out);
    assert!(plugin.is_file() && conf.is_symlink(), "{}", again.out);
    assert_eq!(
        systemd.calls(),
        ["restart containerd.service"],
        "{}",
        again.out
    );
}

/// The plugin a pre-installed install replaced comes back when the new one
/// does not register: containerd ran with it before.
#[test]
fn the_plugin_an_unregistered_one_replaced_is_put_back() {
    let Rig {
        _dir,
        prefix,
        hooks,
        systemd,
    } = rig();
    let plugin = prefix.join("opt/nri/plugins/10-devgate");
    write_executable(&plugin, OLD_PLUGIN);
    let failed = systemd.run(&prefix, &hooks, PRE);
    assert!(!failed.ok, "{}", failed.out);
    assert_eq!(
        std::fs::read_to_string(&plugin).unwrap(),
        OLD_PLUGIN,
        "{}",
        failed.out
    );
    let entries = std::fs::read_dir(prefix.join("opt/nri/plugins"))
        .unwrap()
        .count();
    assert_eq!(entries, 1, "{}", failed.out);
}

/// The systemd unit's plugin not registering is said and fails the run; it
/// is left installed (a runtime that comes up later finds it: the unit
/// retries), and containerd is restarted once: the next run, with nothing
/// changed, owes no restart, however often it runs.
#[test]
fn an_unregistered_unit_fails_the_run_and_stays() {
    let Rig {
        _dir,
        prefix,
        hooks,
        systemd,
    } = rig();
    let failed = systemd.run(&prefix, &hooks, &["--containerd-version", "1.7.24"]);
    assert!(!failed.ok, "{}", failed.out);
    assert!(
        failed.out.contains("did not register") && failed.out.contains("journalctl -u devgate"),
        "{}",
        failed.out
    );
    assert!(prefix.join("etc/systemd/system/devgate.service").is_file());
    assert_eq!(
        systemd.calls(),
        [
            "daemon-reload",
            "enable devgate.service",
            "restart devgate.service",
            "restart containerd.service"
        ],
        "{}",
        failed.out
    );
    let again = systemd.run(&prefix, &hooks, &["--containerd-version", "1.7.24"]);
    assert!(again.ok, "{}", again.out);
    assert!(!again.out.contains("restarts owed"), "{}", again.out);
    assert_eq!(systemd.calls(), Vec::<String>::new(), "{}", again.out);
    systemd.registers(true);
    let third = systemd.run(&prefix, &hooks, &["--containerd-version", "1.7.24"]);
    assert!(third.ok, "{}", third.out);
}

/// A devgate already running reconnects to a restarted containerd and
/// registers: the unit is restarted first, so that only the new binary's
/// registration counts, and one that never registers fails the run.
#[test]
fn the_plugin_the_unit_replaces_does_not_count_as_registered() {
    let Rig {
        _dir,
        prefix,
        hooks,
        systemd,
    } = rig();
    systemd.old_plugin_runs();
    let failed = systemd.run(&prefix, &hooks, &["--containerd-version", "1.7.24"]);
    assert!(
        !failed.ok && failed.out.contains("did not register"),
        "{}",
        failed.out
    );
    assert!(
        !prefix.join("run/devgate/runtime.json").exists(),
        "the old plugin was gone when containerd came back"
    );
    // Nor does the new plugin's registration with the containerd about to
    // restart: only a Configure from the restarted one counts.
    let Rig {
        _dir,
        prefix,
        hooks,
        systemd,
    } = rig();
    systemd.registers_only_before_containerd();
    let failed = systemd.run(&prefix, &hooks, &["--containerd-version", "1.7.24"]);
    assert!(
        !failed.ok && failed.out.contains("did not register"),
        "{}",
        failed.out
    );
}

/// Without containerd (CRI-O, podman) nothing says the runtime runs NRI:
/// no wait for a registration, and no failure without one.
#[test]
fn a_node_without_containerd_waits_for_no_registration() {
    let Rig {
        _dir,
        prefix,
        hooks,
        systemd,
    } = rig();
    let run = systemd.run(&prefix, &hooks, &["--containerd-version", "none"]);
    assert!(run.ok, "{}", run.out);
    assert_eq!(
        systemd.calls(),
        [
            "daemon-reload",
            "enable devgate.service",
            "restart devgate.service"
        ],
        "{}",
        run.out
    );
}

/// A wait that is no number of seconds (`08` is no number to bash) stops the
/// run before any change.
#[test]
fn a_bad_register_wait_stops_before_any_change() {
    let Rig {
        _dir,
        prefix,
        hooks,
        ..
    } = rig();
    let before = snapshot(&prefix);
    for wait in ["08", "0", "x", "-1", "99999"] {
        let env: [(&str, &OsStr); 1] = [("DEVGATE_REGISTER_WAIT", OsStr::new(wait))];
        let run = bootstrap_with_env(&prefix, &hooks, &["--containerd-version", "1.7.24"], &env);
        assert!(!run.ok, "{wait}: {}", run.out);
        assert!(
            run.out
                .contains("DEVGATE_REGISTER_WAIT must be whole seconds"),
            "{}",
            run.out
        );
        assert_eq!(snapshot(&prefix), before, "{wait}");
    }
}

/// A run that pays the restarts an earlier, stopped run owed and then fails
/// (devgate does not register) owes none: the next run restarts nothing.
#[test]
fn restarts_paid_by_a_run_that_then_fails_are_not_owed_again() {
    let Rig {
        _dir,
        prefix,
        hooks,
        systemd,
    } = rig();
    let args = ["--containerd-version", "1.7.24"];
    let blocker = prefix.join("etc/containerd/config.toml.devgate-new");
    std::fs::create_dir_all(&blocker).unwrap();
    let stopped = systemd.run(&prefix, &hooks, &args);
    assert!(!stopped.ok, "{}", stopped.out);
    assert_eq!(systemd.calls(), Vec::<String>::new(), "{}", stopped.out);
    std::fs::remove_dir_all(&blocker).unwrap();
    let paid = systemd.run(&prefix, &hooks, &args);
    assert!(!paid.ok, "{}", paid.out);
    position(&paid.out, "restarts owed by an earlier run");
    assert!(
        systemd
            .calls()
            .contains(&"restart containerd.service".to_string()),
        "{}",
        paid.out
    );
    let again = systemd.run(&prefix, &hooks, &args);
    assert!(again.ok, "{}", again.out);
    assert!(!again.out.contains("restarts owed"), "{}", again.out);
    assert_eq!(systemd.calls(), Vec::<String>::new(), "{}", again.out);
}
