//! `install/bootstrap.sh` cut short after it changed files and before it
//! restarted what reads them: by a signal, or by its manifest not being
//! written after a file went into place. The restarts it owes are recorded
//! (`<prefix>/var/lib/devgate/install/pending-restart`) and paid by the next
//! run, and no temporary file (perhaps a copy of containerd's config) stays.
mod bootstrap;

use std::ffi::OsStr;
use std::path::PathBuf;

use bootstrap::*;

const ARGS: &[&str] = &["--containerd-version", "1.7.24"];

/// A systemctl stand-in that records its calls, registers devgate at every
/// restart (as the plugin's Configure record does) and, while `kill` exists,
/// sends SIGTERM to bootstrap at `daemon-reload` and lingers, as an operator
/// or a configuration tool stopping the run would.
struct Stage {
    dir: tempfile::TempDir,
    prefix: PathBuf,
    hooks: PathBuf,
    tmp: PathBuf,
}

impl Stage {
    fn new() -> Stage {
        let dir = tempfile::tempdir().unwrap();
        let prefix = node(dir.path());
        let hooks = hooks_dir(dir.path());
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let script = format!(
            "#!/bin/sh\necho \"$*\" >> {calls}\ncase \"$1\" in\n  daemon-reload) if [ -e {kill} ]; then kill -TERM $PPID; sleep 1; fi ;;\n  restart) mkdir -p {run} && touch {run}/runtime.json ;;\nesac\n",
            calls = dir.path().join("calls").display(),
            kill = dir.path().join("kill").display(),
            run = prefix.join("run/devgate").display(),
        );
        write_executable(&dir.path().join("systemctl"), script);
        Stage {
            dir,
            prefix,
            hooks,
            tmp,
        }
    }

    fn kills(&self, yes: bool) {
        let flag = self.dir.path().join("kill");
        if yes {
            write(&flag, "");
        } else {
            let _ = std::fs::remove_file(flag);
        }
    }

    fn run(&self) -> (Run, Vec<String>) {
        let calls = self.dir.path().join("calls");
        let _ = std::fs::remove_file(&calls);
        let systemctl = self.dir.path().join("systemctl");
        let env: [(&str, &OsStr); 3] = [
            ("DEVGATE_BOOTSTRAP_SYSTEMCTL", systemctl.as_os_str()),
            ("DEVGATE_REGISTER_WAIT", OsStr::new("1")),
            ("TMPDIR", self.tmp.as_os_str()),
        ];
        let run = bootstrap_with_env(&self.prefix, &self.hooks, ARGS, &env);
        let calls = std::fs::read_to_string(calls).unwrap_or_default();
        (run, calls.lines().map(str::to_string).collect())
    }

    fn owed(&self) -> Option<String> {
        std::fs::read_to_string(self.prefix.join("var/lib/devgate/install/pending-restart")).ok()
    }

    fn temps_left(&self) -> Vec<PathBuf> {
        let entries = std::fs::read_dir(&self.tmp).unwrap();
        entries.map(|e| e.unwrap().path()).collect()
    }
}

fn restarted(calls: &[String], unit: &str) -> bool {
    calls.iter().any(|c| c == &format!("restart {unit}"))
}

/// SIGTERM while the first restarts start: the run fails, owing both
/// restarts (containerd's config and the unit changed), and the next run,
/// which changes nothing, pays them.
#[test]
fn a_run_stopped_by_a_signal_leaves_its_restarts_owed() {
    let stage = Stage::new();
    stage.kills(true);
    let (stopped, calls) = stage.run();
    assert!(!stopped.ok, "{}", stopped.out);
    assert_eq!(calls, ["daemon-reload"], "{}", stopped.out);
    assert_eq!(
        stage.owed().as_deref(),
        Some("containerd\ndevgate\n"),
        "{}",
        stopped.out
    );
    assert_eq!(stage.temps_left(), Vec::<PathBuf>::new());
    stage.kills(false);
    let (next, calls) = stage.run();
    assert!(next.ok, "{}", next.out);
    position(&next.out, "restarts owed by an earlier run");
    assert!(
        restarted(&calls, "devgate.service") && restarted(&calls, "containerd.service"),
        "{calls:?}\n{}",
        next.out
    );
    assert_eq!(stage.owed(), None);
}

/// containerd's config put in place, then its manifest line not written (a
/// full or read-only /var; here the manifest's temporary name is taken):
/// the run fails owing containerd's restart, which the next run pays.
#[test]
fn a_config_in_place_whose_manifest_failed_leaves_its_restart_owed() {
    let stage = Stage::new();
    let (first, _) = stage.run();
    assert!(first.ok, "{}", first.out);
    let cfg = stage.prefix.join("etc/containerd/config.toml");
    let on = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, on.replace("disable = false", "disable = true")).unwrap();
    let blocker = stage.prefix.join("var/lib/devgate/install/manifest.new");
    std::fs::create_dir_all(&blocker).unwrap();
    let (failed, calls) = stage.run();
    assert!(!failed.ok, "{}", failed.out);
    position(
        &failed.out,
        "cannot write /var/lib/devgate/install/manifest",
    );
    assert_eq!(
        std::fs::read_to_string(&cfg).unwrap(),
        on,
        "the edit is in place"
    );
    assert!(calls.is_empty(), "{calls:?}");
    assert_eq!(
        stage.owed().as_deref(),
        Some("containerd\n"),
        "{}",
        failed.out
    );
    assert_eq!(stage.temps_left(), Vec::<PathBuf>::new());
    std::fs::remove_dir(&blocker).unwrap();
    let (next, calls) = stage.run();
    assert!(next.ok, "{}", next.out);
    assert!(
        restarted(&calls, "containerd.service"),
        "{calls:?}\n{}",
        next.out
    );
}

/// A refused config leaves no copy of it among the temporary files.
#[test]
fn a_refused_config_leaves_no_temporary_copy() {
    let stage = Stage::new();
    let cfg = stage.prefix.join("etc/containerd/config.toml");
    let blocker = PathBuf::from(format!("{}.devgate-new", cfg.display()));
    std::fs::create_dir_all(&blocker).unwrap();
    let (failed, _) = stage.run();
    assert!(!failed.ok, "{}", failed.out);
    assert_eq!(stage.temps_left(), Vec::<PathBuf>::new(), "{}", failed.out);
}

/// A signal between a file's copy under its temporary name and the rename
/// leaves no copy behind: beside the NRI plugin, an executable would be
/// started by containerd as another plugin.
#[test]
fn a_signal_before_a_rename_leaves_no_staged_copy() {
    let stage = Stage::new();
    let stubs = stage.dir.path().join("stubs");
    write_executable(
        &stubs.join("mv"),
        "#!/bin/sh\ncase \"$2\" in *.devgate-new) kill -TERM $PPID; exit 1 ;; esac\nexec /bin/mv \"$@\"\n",
    );
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", stubs.display());
    let run = bootstrap_with_path(&stage.prefix, &stage.hooks, ARGS, Some(path.as_ref()));
    assert!(!run.ok, "{}", run.out);
    let mut staged = Vec::new();
    let mut dirs = vec![stage.prefix.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                dirs.push(path);
            } else if path.to_string_lossy().ends_with(".devgate-new") {
                staged.push(path);
            }
        }
    }
    assert!(staged.is_empty(), "{staged:?}\n{}", run.out);
}
