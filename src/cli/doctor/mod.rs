//! `devgate doctor`: checks a node's setup, each check pass, warn or fail with the
//! fix for it. Exits non-zero when any check fails.
//!
//! Every check reads below [`Roots`] and asks [`Host`] for what a directory tree
//! cannot hold, so the checks run on fake trees in tests.
mod cdi;
mod cgroup;
mod checks;
mod containerd;
mod crio;
mod grant;
mod hook;
mod host;
mod node;
mod registration;
mod running;
mod scan;
mod sockless;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;

pub use host::{Host, RealHost, Roots};

use crate::config::Config;
use sockless::Sockless;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DoctorFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DoctorArgs {
    /// Root holding the host's `sys/`, `proc/` and `dev/`.
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// The host's /etc (containerd config, hooks.d, modprobe.d).
    #[arg(long, default_value = "/etc")]
    pub etc_root: PathBuf,
    /// Process directories to look for a running `devgate nri`; default `<host-root>/proc`.
    #[arg(long)]
    pub proc_dir: Option<PathBuf>,
    /// devgate's config file; default: the one the running `devgate nri`
    /// reads (its `--config`, through its root: a DaemonSet's ConfigMap),
    /// else /etc/devgate/config.toml.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// containerd's config file; default `<etc-root>/containerd/config.toml`.
    #[arg(long)]
    pub containerd_config: Option<PathBuf>,
    /// The containerd binary asked for its version.
    #[arg(long, default_value = "containerd")]
    pub containerd: PathBuf,
    /// The runtime's NRI socket.
    #[arg(long, default_value = "/var/run/nri/nri.sock")]
    pub socket: PathBuf,
    /// devgate's state directory.
    #[arg(long, default_value = "/run/devgate")]
    pub state_dir: PathBuf,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: DoctorFormat,
    /// Print what the config asks of the node (`sriov_numvfs <pf> <n>`,
    /// `rdma_netns_mode <mode>`) for install/bootstrap.sh, and check nothing.
    #[arg(long)]
    pub print_node_prep: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("{failed} of {total} checks failed")]
    Failed { failed: usize, total: usize },
    #[error("load config")]
    Config(#[source] crate::config::ConfigError),
    #[error("encode report: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(transparent)]
    Stdout(#[from] super::StdoutError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about a warning or failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn pass(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Pass,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Runs every check in order. A config that does not load fails its own check
/// and the others run against the defaults.
pub fn run_checks(roots: &Roots, host: &dyn Host) -> Vec<Check> {
    // The running plugins, listed once for the checks that look at them.
    let running = running::running_plugins(&roots.proc_dir);
    let (config_check, config) = checks::config(roots, &running);
    let containerd_config = containerd::ContainerdConfig::load(roots, host);
    let inventory = crate::inventory::discover(&roots.host_root);
    let crio = crio::is_crio(roots, host);
    let (runtime, nri) = match crio {
        true => (crio::runtime(), crio::nri_enabled(roots)),
        false => (
            containerd::version(host),
            containerd::nri_enabled(host, &containerd_config, &roots.nri_socket),
        ),
    };
    let hooks_d = checks::hooks_d(roots, crio);
    let sockless = Sockless::of(crio, &nri, &hooks_d, &containerd_config, &running);
    vec![
        config_check,
        runtime,
        nri,
        Sockless::soften(sockless, checks::nri_socket(roots, host)),
        Sockless::soften(sockless, checks::registered(roots, host, &running)),
        hooks_d,
        checks::state_dirs(roots, &config),
        hook::nri_hook(roots, &config, &running),
        node::inventory(&inventory),
        node::nvidia(roots, host, &inventory, running::on_socket(roots, &running)),
        node::rdma_netns(roots, &config, &inventory),
        node::vfs(roots, &config),
        match crio {
            true => crio::cgroup(roots),
            false => cgroup::cgroup(roots, &containerd_config, &inventory),
        },
        cdi::cdi(host, &containerd_config, &config),
        cdi::specs(roots, host, &config, &inventory),
        grant::grant_check(roots, host, &config, running::on_socket(roots, &running)),
        scan::gpu_scan(roots, running::on_socket(roots, &running)),
    ]
}

/// A people-readable report: one line per check, its fix below it.
pub fn table(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let status = match c.status {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        let _ = writeln!(out, "{status}  {:<20} {}", c.name, c.detail);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "      {:<20} fix: {fix}", "");
        }
    }
    let count = |s| checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        out,
        "\n{} passed, {} warnings, {} failed",
        count(Status::Pass),
        count(Status::Warn),
        count(Status::Fail)
    );
    out
}

/// `--print-node-prep`: one line per thing bootstrap prepares.
pub fn node_prep(config: &Config) -> String {
    let mut out = String::new();
    for (pf, n) in &config.sriov.num_vfs {
        let _ = writeln!(out, "sriov_numvfs {pf} {n}");
    }
    let _ = writeln!(out, "rdma_netns_mode {}", config.rdma.netns_mode.as_str());
    out
}

pub fn run(args: DoctorArgs) -> Result<(), DoctorError> {
    if args.print_node_prep {
        let path = args
            .config
            .unwrap_or_else(|| crate::config::DEFAULT_CONFIG_PATH.into());
        let config = Config::load(&path).map_err(DoctorError::Config)?;
        return Ok(super::to_stdout(&node_prep(&config))?);
    }
    let roots = Roots {
        proc_dir: args.proc_dir.unwrap_or_else(|| args.host_root.join("proc")),
        containerd_config: args
            .containerd_config
            .unwrap_or_else(|| args.etc_root.join("containerd/config.toml")),
        host_root: args.host_root,
        etc_root: args.etc_root,
        config: args.config,
        state_dir: args.state_dir,
        nri_socket: args.socket,
    };
    let host = RealHost::new(args.containerd);
    let checks = run_checks(&roots, &host);
    let text = match args.output {
        DoctorFormat::Table => table(&checks),
        DoctorFormat::Json => serde_json::to_string_pretty(&checks)? + "\n",
    };
    super::to_stdout(&text)?;
    verdict(&checks)
}

/// The exit status: a failed check fails the command (exit 1); warnings alone
/// do not (exit 0).
fn verdict(checks: &[Check]) -> Result<(), DoctorError> {
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if failed > 0 {
        return Err(DoctorError::Failed {
            failed,
            total: checks.len(),
        });
    }
    Ok(())
}
