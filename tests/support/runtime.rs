//! Which containerd the harness runs: the end-to-end suite runs once per line,
//! chosen by `DEVGATE_TEST_RUNTIME` (`containerd-1.7`, the default, or
//! `containerd-2.1`). tests/setup-host.sh installs 1.7 as the system package and
//! unpacks 2.1 under a private prefix; their config layouts differ (version 2
//! against version 3, where CRI is split into `cri.v1.runtime` and `cri.v1.images`).
use std::path::PathBuf;

/// The variable that selects the runtime.
pub const RUNTIME_ENV: &str = "DEVGATE_TEST_RUNTIME";

/// Where tests/setup-host.sh unpacks containerd 2.1.
const CONTAINERD21_BIN: &str = "/opt/devgate-test/containerd-2.1/usr/bin";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// Debian's containerd 1.7.24 (NRI v0.6.1), installed in /usr/bin.
    Containerd17,
    /// Debian's containerd 2.1.9 (NRI v0.8.0), unpacked beside it.
    Containerd21,
}

impl Runtime {
    /// The runtime named by `DEVGATE_TEST_RUNTIME`; panics on a name it does not
    /// know, so that a typo cannot quietly test the default instead.
    pub fn current() -> Runtime {
        match std::env::var(RUNTIME_ENV) {
            Err(std::env::VarError::NotPresent) => Runtime::Containerd17,
            Ok(v) if v.is_empty() || v == "containerd-1.7" => Runtime::Containerd17,
            Ok(v) if v == "containerd-2.1" => Runtime::Containerd21,
            other => panic!("{RUNTIME_ENV}={other:?}: want containerd-1.7 or containerd-2.1"),
        }
    }

    /// The name failure messages and benchmark reports carry.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Containerd17 => "containerd-1.7",
            Runtime::Containerd21 => "containerd-2.1",
        }
    }

    /// Directory of `containerd`, `ctr` and `containerd-shim-runc-v2`.
    pub fn bin_dir(self) -> PathBuf {
        PathBuf::from(match self {
            Runtime::Containerd17 => "/usr/bin",
            Runtime::Containerd21 => CONTAINERD21_BIN,
        })
    }

    pub fn containerd(self) -> PathBuf {
        self.bin_dir().join("containerd")
    }

    pub fn ctr(self) -> PathBuf {
        self.bin_dir().join("ctr")
    }

    /// PATH for the daemon: it starts the shim, runc and CNI plugins through
    /// PATH, and its own shim must come before the other line's.
    pub fn path_env(self) -> String {
        format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.bin_dir().display()
        )
    }

    /// What `containerd --version` prints for this line.
    pub fn version_marker(self) -> &'static str {
        match self {
            Runtime::Containerd17 => " 1.7.",
            Runtime::Containerd21 => " 2.1.",
        }
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Paths a config refers to, all inside the instance directory.
pub struct ConfigPaths {
    pub root: String,
    pub state: String,
    pub grpc: String,
    pub ttrpc: String,
    pub opt: String,
    pub nri: String,
    pub plugins: String,
    pub plugins_d: String,
    pub sandbox: String,
    pub cni_bin: String,
    pub cni_conf: String,
    pub runc: String,
    /// CDI spec directory (read by 2.1; 1.7 runs with CDI off).
    pub cdi: String,
}

impl Runtime {
    /// The daemon's config in this line's layout.
    pub fn config(self, p: &ConfigPaths) -> String {
        let common = format!(
            r#"root = "{root}"
state = "{state}"

[grpc]
  address = "{grpc}"
[ttrpc]
  address = "{ttrpc}"
[debug]
  level = "info"

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{nri}"
  plugin_path = "{plugins}"
  plugin_config_path = "{plugins_d}"
"#,
            root = p.root,
            state = p.state,
            grpc = p.grpc,
            ttrpc = p.ttrpc,
            nri = p.nri,
            plugins = p.plugins,
            plugins_d = p.plugins_d,
        );
        match self {
            Runtime::Containerd17 => format!(
                r#"version = 2
{common}
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
{cri}"#,
                opt = p.opt,
                cri = cri_runtime(
                    "io.containerd.grpc.v1.cri",
                    &format!("  sandbox_image = \"{}\"\n", p.sandbox),
                    &format!("bin_dir = \"{}\"", p.cni_bin),
                    p,
                ),
            ),
            Runtime::Containerd21 => format!(
                r#"version = 3
{common}
{cri}[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{sandbox}"
"#,
                cri = cri_runtime(
                    "io.containerd.cri.v1.runtime",
                    &format!("  enable_cdi = true\n  cdi_spec_dirs = [\"{}\"]\n", p.cdi),
                    &format!("bin_dirs = [\"{}\"]", p.cni_bin),
                    p,
                ),
                sandbox = p.sandbox,
            ),
        }
    }
}

/// The CRI runtime settings both lines share, under `table` (`grpc.v1.cri` in 1.7,
/// `cri.v1.runtime` in 2.1): `extra` holds the line's own keys, `cni_bin` its
/// spelling of the CNI binary directory.
fn cri_runtime(table: &str, extra: &str, cni_bin: &str, p: &ConfigPaths) -> String {
    format!(
        r#"[plugins."{table}"]
  # Without it runc fails every sandbox on this kernel, which refuses negative oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
{extra}  [plugins."{table}".cni]
    {cni_bin}
    conf_dir = "{cni_conf}"
  # A private runc root keeps leftover containers findable and off the host's /run/containerd.
  [plugins."{table}".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."{table}".containerd.runtimes.runc.options]
    Root = "{runc}"
"#,
        cni_conf = p.cni_conf,
        runc = p.runc,
    )
}
