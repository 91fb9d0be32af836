//! A private containerd instance (1.7 or 2.1, see [`Runtime`]): its own root,
//! state, sockets, NRI plugin directories, CNI and runc root, all inside one
//! short directory under /tmp, torn down on Drop together with every container
//! it started.
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use super::process::{delete_runc_containers, kill_matching, run, stop_child, unmount_below};
use super::runtime::{ConfigPaths, Runtime};
use super::{cni, cri::Cri, images, wait_for, SLOW};

/// One private containerd. Created stopped so that a test can prepare the
/// pre-installed plugin directories first; [`Containerd::launch`] prepares and starts.
pub struct Containerd {
    /// Kept short: unix socket paths must stay under 108 bytes.
    dir: tempfile::TempDir,
    child: Option<Child>,
    images_imported: bool,
    runtime: Runtime,
}

impl Containerd {
    /// Writes the config and directories; does not start the daemon.
    pub fn prepare() -> Containerd {
        super::require_root();
        let runtime = Runtime::current();
        check_version(runtime);
        let dir = tempfile::Builder::new()
            .prefix("dg")
            .tempdir_in("/tmp")
            .expect("create instance dir");
        let ctrd = Containerd {
            dir,
            child: None,
            images_imported: false,
            runtime,
        };
        for sub in ["plugins", "plugins.d", "logs", "cdi"] {
            std::fs::create_dir_all(ctrd.path(sub)).expect("create instance subdir");
        }
        cni::install(&ctrd.path("cni/bin"), &ctrd.path("cni/conf"));
        std::fs::write(ctrd.config_path(), ctrd.config()).expect("write containerd config");
        ctrd
    }

    /// Adds `lines` to the NRI section of the config [`Containerd::prepare`]
    /// wrote; takes effect at the next [`Containerd::start`].
    pub fn set_nri(&self, lines: &str) {
        let path = self.config_path();
        let text = std::fs::read_to_string(&path).expect("read containerd config");
        let section = "[plugins.\"io.containerd.nri.v1.nri\"]\n";
        assert!(text.contains(section), "no NRI section in {text}");
        let text = text.replacen(section, &format!("{section}{lines}\n"), 1);
        std::fs::write(&path, text).expect("write containerd config");
    }

    /// A started instance with the test images imported.
    pub fn launch() -> Containerd {
        let mut ctrd = Containerd::prepare();
        ctrd.start();
        ctrd
    }

    /// Starts the daemon (again, after [`Containerd::kill`]) with the same config
    /// and waits until CRI answers; imports the images on the first start.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "containerd is already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open containerd log");
        let child = Command::new(self.runtime.containerd())
            .arg("--config")
            .arg(self.config_path())
            .env_clear()
            .env("PATH", self.runtime.path_env())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.runtime));
        self.child = Some(child);
        let cri = self.cri();
        wait_for(&format!("{} to serve CRI", self.runtime), SLOW, || {
            self.assert_running();
            cri.version().ok()
        });
        wait_for("containerd's NRI socket", SLOW, || {
            self.nri_socket().exists().then_some(())
        });
        if !self.images_imported {
            self.import_images();
            self.images_imported = true;
        }
    }

    /// SIGKILLs the daemon, as a crash would; shims and containers keep running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGKILL, Duration::ZERO);
        }
        // A killed daemon leaves its socket file: gone, so that the next
        // start waits for the one it binds, not this stale one.
        let _ = std::fs::remove_file(self.nri_socket());
    }

    /// Kill and start again with the same config and state.
    pub fn restart(&mut self) {
        self.kill();
        self.start();
    }

    /// Which containerd this instance runs.
    pub fn runtime(&self) -> Runtime {
        self.runtime
    }

    /// Directory the instance reads CDI specs from (containerd 2.1; 1.7 runs
    /// with CDI off).
    pub fn cdi_dir(&self) -> PathBuf {
        self.path("cdi")
    }

    /// A new CRI client for this instance.
    pub fn cri(&self) -> Cri {
        Cri::connect(&self.path("c.sock"), &self.log_dir())
    }

    /// The socket external NRI plugins connect to.
    pub fn nri_socket(&self) -> PathBuf {
        self.path("nri.sock")
    }

    /// Where pre-installed NRI plugins (`NN-name` executables) are discovered.
    pub fn plugin_dir(&self) -> PathBuf {
        self.path("plugins")
    }

    /// Where pre-installed plugins' `NN-name.conf` files are read from.
    pub fn plugin_config_dir(&self) -> PathBuf {
        self.path("plugins.d")
    }

    /// Directory of CRI container logs.
    pub fn log_dir(&self) -> PathBuf {
        self.path("logs")
    }

    /// A path inside the instance directory, for a test's own files.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The daemon's log so far (all starts, appended).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// A position in the log; pass it to [`Containerd::wait_for_log`] to look
    /// only at what comes after it.
    pub fn log_mark(&self) -> usize {
        self.log().len()
    }

    /// Waits until `needle` appears in the log after `mark`.
    pub fn wait_for_log(&self, mark: usize, needle: &str, timeout: Duration) {
        wait_for(&format!("containerd to log {needle:?}"), timeout, || {
            self.log()
                .get(mark..)
                .is_some_and(|tail| tail.contains(needle))
                .then_some(())
        });
    }

    fn assert_running(&mut self) {
        let child = self.child.as_mut().expect("containerd started");
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{} exited ({status}); log:\n{}", self.runtime, self.log());
        }
    }

    fn import_images(&self) {
        let set = images::image_set();
        for tarball in [&set.sandbox, &set.workload] {
            self.import_image(tarball);
        }
    }

    /// Imports a docker-archive tarball into the CRI namespace (`k8s.io`).
    pub fn import_image(&self, tarball: &std::path::Path) {
        let address = self.path("c.sock");
        let ctr = self.runtime.ctr();
        run(
            &ctr.to_string_lossy(),
            &[
                "-a",
                &address.to_string_lossy(),
                "-n",
                "k8s.io",
                "images",
                "import",
                &tarball.to_string_lossy(),
            ],
        )
        .unwrap_or_else(|e| panic!("import {}: {e}", tarball.display()));
    }

    fn config_path(&self) -> PathBuf {
        self.path("config.toml")
    }

    fn log_path(&self) -> PathBuf {
        self.path("containerd.log")
    }

    fn config(&self) -> String {
        let p = |rel: &str| self.path(rel).to_string_lossy().into_owned();
        self.runtime.config(&ConfigPaths {
            root: p("root"),
            state: p("state"),
            grpc: p("c.sock"),
            ttrpc: p("t.sock"),
            opt: p("opt"),
            nri: p("nri.sock"),
            plugins: p("plugins"),
            plugins_d: p("plugins.d"),
            sandbox: images::SANDBOX_IMAGE.to_string(),
            cni_bin: p("cni/bin"),
            cni_conf: p("cni/conf"),
            runc: p("runc"),
            cdi: p("cdi"),
        })
    }

    /// Removes pods through CRI while the daemon still runs, so that shims exit
    /// and CNI DEL runs; whatever survives is swept afterwards.
    fn remove_all_pods(&mut self) {
        if !matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None))) {
            return;
        }
        let cri = self.cri();
        for pod in cri.list_pod_ids().unwrap_or_default() {
            let _ = cri.stop_pod_id(&pod);
            let _ = cri.remove_pod_id(&pod);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- {} log (last lines) ---\n{}",
                self.runtime,
                super::tail(&self.log(), 60)
            );
        }
        self.remove_all_pods();
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGTERM, Duration::from_secs(10));
        }
        delete_runc_containers(&self.path("runc"));
        // Shims (`-address <dir>/c.sock`) and runtime-launched plugins
        // (`<dir>/plugins/NN-name`) name this instance's directory.
        kill_matching(&format!("{}/", self.dir.path().display()));
        unmount_below(self.dir.path());
    }
}

/// The config layout depends on the line: refuse a binary of another one.
fn check_version(runtime: Runtime) {
    let bin = runtime.containerd();
    let out = run(&bin.to_string_lossy(), &["--version"])
        .unwrap_or_else(|e| panic!("{e}: install {runtime} (tests/setup-host.sh does)"));
    assert!(
        out.contains(runtime.version_marker()),
        "need {runtime} at {}, found: {out}",
        bin.display()
    );
}

/// So that a test's failure message can point at the instance's files.
impl std::fmt::Debug for Containerd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Containerd({}, {})",
            self.runtime,
            self.dir.path().display()
        )
    }
}
