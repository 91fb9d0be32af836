//! `devgate nri` as an external NRI plugin of a test's containerd: a child
//! process killed on Drop, its output kept in a file for failure messages.
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use super::containerd::Containerd;
use super::process::stop_child;
use super::SLOW;

/// The binary under test, built by cargo for this test run.
pub const DEVGATE: &str = match option_env!("CARGO_BIN_EXE_devgate") {
    Some(path) => path,
    // Examples get no CARGO_BIN_EXE_*; the demo runs what
    // `install/build.sh --profile dev` put there (the hook beside it static).
    None => "target/dist-dev/devgate",
};

pub struct DevgatePlugin {
    child: Option<Child>,
    /// The binary started: [`DEVGATE`] unless a benchmark compares another.
    program: PathBuf,
    args: Vec<String>,
    log_path: PathBuf,
    /// containerd's log position when the current process was started: its
    /// registration is looked for after it.
    mark: usize,
}

impl DevgatePlugin {
    /// Starts `devgate nri` against the instance's NRI socket, with a private
    /// state dir and config path (`devgate.toml` in the instance directory;
    /// absent means defaults), plus `extra` flags. Does not wait.
    pub fn start(ctrd: &Containerd, extra: &[&str]) -> DevgatePlugin {
        let mut args: Vec<String> = vec![
            "nri".into(),
            "--socket".into(),
            ctrd.nri_socket().to_string_lossy().into_owned(),
            "--state-dir".into(),
            ctrd.path("devgate-state").to_string_lossy().into_owned(),
            "--config".into(),
            ctrd.path("devgate.toml").to_string_lossy().into_owned(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut plugin = DevgatePlugin {
            child: None,
            program: PathBuf::from(DEVGATE),
            args,
            log_path: ctrd.path("devgate.log"),
            mark: 0,
        };
        plugin.spawn(ctrd);
        plugin
    }

    /// Starts and waits until containerd reports the plugin connected.
    pub fn launch(ctrd: &Containerd, extra: &[&str]) -> DevgatePlugin {
        let mut plugin = DevgatePlugin::start(ctrd, extra);
        plugin.wait_registered(ctrd, SLOW);
        plugin
    }

    /// Waits for containerd's "plugin connected" line (logged once Configure and
    /// Synchronize succeeded) for the current process.
    pub fn wait_registered(&mut self, ctrd: &Containerd, timeout: Duration) {
        self.wait_registered_after(ctrd, self.mark, timeout);
    }

    /// Like [`DevgatePlugin::wait_registered`], for a registration logged after
    /// `mark` (from [`Containerd::log_mark`]): a reconnection of the same process.
    pub fn wait_registered_after(&mut self, ctrd: &Containerd, mark: usize, timeout: Duration) {
        let needle = format!(r#"plugin \"{}\" connected"#, self.nri_name());
        let log_path = self.log_path.clone();
        let child = self.child.as_mut().expect("plugin started");
        super::wait_for(&format!("containerd to log {needle}"), timeout, || {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("devgate nri exited ({status}); its output:\n{log}");
            }
            ctrd.log()
                .get(mark..)
                .is_some_and(|tail| tail.contains(&needle))
                .then_some(())
        });
    }

    /// SIGKILL, as a crash or OOM kill would; containerd sees the connection drop.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGKILL, Duration::ZERO);
        }
    }

    /// Sends `signal` and waits up to `limit` for the process to end; its exit
    /// status, or `None` if it was still running (it is killed then).
    pub fn signal_and_wait(
        &mut self,
        signal: Signal,
        limit: Duration,
    ) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        stop_child(&mut child, signal, limit)
    }

    /// Starts a new process with the same flags (after [`DevgatePlugin::kill`]).
    pub fn respawn(&mut self, ctrd: &Containerd) {
        assert!(self.child.is_none(), "devgate nri is still running");
        self.spawn(ctrd);
    }

    /// Starts `program` instead from the next [`DevgatePlugin::respawn`] on
    /// (a benchmark comparing two builds).
    pub fn set_program(&mut self, program: PathBuf) {
        self.program = program;
    }

    /// The running process, for CPU and memory readings.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Everything the plugin wrote to stdout and stderr (all processes).
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// What containerd calls the plugin in its log: `<idx>-<name>`, from
    /// `--idx`/`--name` if given, else devgate's defaults.
    pub fn nri_name(&self) -> String {
        format!(
            "{}-{}",
            self.flag("--idx").unwrap_or("10"),
            self.flag("--name").unwrap_or("devgate")
        )
    }

    fn flag(&self, flag: &str) -> Option<&str> {
        let pos = self.args.iter().position(|a| a == flag)?;
        self.args.get(pos + 1).map(String::as_str)
    }

    fn spawn(&mut self, ctrd: &Containerd) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open devgate log");
        self.mark = ctrd.log_mark();
        let child = Command::new(&self.program)
            .args(&self.args)
            // Keep the caller's NRI identity variables from overriding the flags.
            .env_remove("NRI_PLUGIN_NAME")
            .env_remove("NRI_PLUGIN_IDX")
            .env_remove("NRI_PLUGIN_SOCKET")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log fd"))
            .stderr(log)
            .spawn()
            .expect("spawn devgate nri");
        self.child = Some(child);
    }
}

impl Drop for DevgatePlugin {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- devgate nri output (last lines) ---\n{}",
                super::tail(&self.output(), 60)
            );
        }
        self.kill();
    }
}
