//! podman with a private store and the shipped hooks.d file pointed at the
//! built `devgate-hook`, shared by the `e2e_podman*` files that drive it;
//! each uses a different subset.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use devgate::hook::FAULT_ENV;

/// podman with its own root, runroot and tmpdir; everything removed on drop.
pub struct Podman {
    pub dir: PathBuf,
    pub hooks: PathBuf,
}

impl Podman {
    pub fn new(dir: &Path, hooks: PathBuf) -> Podman {
        Podman {
            dir: dir.to_path_buf(),
            hooks,
        }
    }

    pub fn cmd(&self, args: &[&str]) -> Output {
        let d = |p: &str| self.dir.join(p).display().to_string();
        Command::new("podman")
            .args([
                "--root",
                &d("root"),
                "--runroot",
                &d("run"),
                "--tmpdir",
                &d("tmp"),
                // `system reset` at the end removes every network and volume
                // podman knows: only this test's.
                "--network-config-dir",
                &d("net"),
                "--volumepath",
                &d("volumes"),
            ])
            .args([
                "--storage-driver",
                "overlay",
                "--cgroup-manager",
                "cgroupfs",
            ])
            .args(["--events-backend", "none", "--hooks-dir"])
            .arg(&self.hooks)
            .args(args)
            .output()
            .expect("spawn podman (tests/setup-host.sh installs it)")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(
            out.status.success(),
            "podman {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sh -c script` in a running container: (exit code, stdout + stderr).
    pub fn exec(&self, name: &str, script: &str) -> (i32, String) {
        let out = self.cmd(&["exec", name, "sh", "-c", script]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd(&["rm", "--force", "--all", "--time", "0"]);
        let _ = self.cmd(&["system", "reset", "--force"]);
    }
}

/// The shipped hooks file, with the hook binary, state and host root of this test.
pub fn hooks_dir(
    dir: &Path,
    host_root: &Path,
    state: &Path,
    config: &Path,
    fault: Option<&str>,
) -> PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/devgate.json");
    let mut hook: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&shipped).unwrap()).unwrap();
    assert_eq!(hook["version"], "1.0.0");
    assert_eq!(hook["hook"]["path"], "/usr/local/bin/devgate-hook");
    let mut args: Vec<String> = serde_json::from_value(hook["hook"]["args"].clone()).unwrap();
    let at = args.iter().position(|a| a == "--state-dir").unwrap();
    args[at + 1] = state.display().to_string();
    args.extend(["--host-root".to_string(), host_root.display().to_string()]);
    hook["hook"]["path"] = env!("CARGO_BIN_EXE_devgate-hook").into();
    hook["hook"]["args"] = args.into();
    let mut env = vec![format!("DEVGATE_CONFIG={}", config.display())];
    env.extend(fault.map(|f| format!("{FAULT_ENV}={f}")));
    hook["hook"]["env"] = env.into();
    let hooks = dir.join(if fault.is_some() {
        "hooks-fault.d"
    } else {
        "hooks.d"
    });
    std::fs::create_dir_all(&hooks).unwrap();
    std::fs::write(hooks.join("devgate.json"), hook.to_string()).unwrap();
    hooks
}

/// A hooks-only node under `dir`: devgate's config and state directory, and
/// podman with the hooks file for `host_root` and the workload image loaded.
/// Returns podman, the state directory and the config file.
pub fn hooks_only(dir: &Path, host_root: &Path, fault: Option<&str>) -> (Podman, PathBuf, PathBuf) {
    let state = dir.join("state");
    let config = dir.join("config.toml");
    std::fs::write(&config, "log_format = \"text\"\n").unwrap();
    let hooks = hooks_dir(dir, host_root, &state, &config, fault);
    let podman = Podman::new(dir, hooks);
    podman.ok(&[
        "load",
        "--input",
        &crate::support::image_set().workload.display().to_string(),
    ]);
    (podman, state, config)
}

/// Limits for every container: runc cannot raise the ones this host's
/// defaults would give it (`setrlimit` EPERM at the container's init).
pub const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// `key=value` as one `--annotation` argument: podman 4.3 reads the flag as
/// a CSV list (pflag StringSlice), so it is quoted.
pub fn annotation_arg(key: &str, value: &str) -> String {
    format!("\"{}\"", format!("{key}={value}").replace('"', "\"\""))
}

/// What the hook logged so far in the state directory (empty before its
/// first run).
pub fn hook_log(state: &Path) -> String {
    std::fs::read_to_string(state.join("hook.log")).unwrap_or_default()
}

/// The pods the ledger in `state` holds claims for.
pub fn ledger_pods(state: &Path) -> usize {
    let ledger = devgate::ledger::Ledger::open(state).and_then(|l| l.snapshot());
    ledger.expect("read the ledger").pods.len()
}
