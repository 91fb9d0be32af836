//! `devgate nri`: run the NRI plugin.
//!
//! Two modes (nri.md §1):
//! - external (default): dial `--socket` and stay registered across runtime
//!   restarts; config from `--config`.
//! - pre-installed: the runtime launched us from its plugin directory with
//!   the connection on a descriptor (`NRI_PLUGIN_SOCKET`); name, index and
//!   config (`ConfigureRequest.config`) come from the runtime, flags are
//!   ignored, and we exit when the runtime closes the connection.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use nri::{
    stub::{Preinstalled, RequestGate},
    Stub, StubError,
};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;

use crate::{
    config::{Config, ConfigError, LogFormat},
    plugin::{DevgatePlugin, PluginOptions},
};

/// Environment variable holding the log filter: a default level and per-target
/// levels, `info,devgate::ledger=debug` (`tracing_subscriber::filter::Targets`;
/// no regular expressions, which keeps them out of the resident binary).
pub const LOG_ENV: &str = "DEVGATE_LOG";
const DEFAULT_LOG_LEVEL: LevelFilter = LevelFilter::INFO;

/// Flags of `devgate nri` (a contract: install scripts and tests rely on them).
#[derive(Debug, Clone, clap::Args)]
pub struct NriArgs {
    /// NRI socket of the runtime; ignored in pre-installed mode (fd 3 from the runtime).
    #[arg(long, default_value = "/var/run/nri/nri.sock")]
    pub socket: PathBuf,
    /// Plugin name registered with the runtime.
    #[arg(long, default_value = "devgate")]
    pub name: String,
    /// Two-digit plugin index; lower runs first.
    #[arg(long, default_value = "10")]
    pub idx: String,
    /// Node config file; a missing file means defaults.
    #[arg(long, default_value = devgate_default_config())]
    pub config: PathBuf,
    /// Root holding the host's `sys/` and `proc/`.
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// Directory of claims and saved device state.
    #[arg(long, default_value = "/run/devgate")]
    pub state_dir: PathBuf,
}

const fn devgate_default_config() -> &'static str {
    crate::config::DEFAULT_CONFIG_PATH
}

#[derive(Debug, thiserror::Error)]
pub enum NriCmdError {
    // The filter's parse error repeats its own cause in its text, so it is
    // kept as text rather than chained.
    #[error("invalid {LOG_ENV}={value:?}: {reason}")]
    LogFilter { value: String, reason: String },
    #[error("set up logging")]
    Logging(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("set up signal handling")]
    Signals(#[source] std::io::Error),
    #[error("start a thread")]
    Threads(#[source] std::io::Error),
    #[error("nri plugin")]
    Stub(#[from] StubError),
    #[error("open device state")]
    State(#[source] crate::ledger::LedgerError),
}

/// The plugin's options from the flags. The state directory is made
/// absolute: the hook gets it as `--state-dir` and runc runs hooks in the
/// bundle directory, where a relative path would name another directory.
fn plugin_options(args: &NriArgs, preinstalled: bool) -> PluginOptions {
    PluginOptions {
        host_root: args.host_root.clone(),
        state_dir: std::path::absolute(&args.state_dir).unwrap_or_else(|_| args.state_dir.clone()),
        config_from_runtime: preinstalled,
    }
}

pub fn run(args: NriArgs) -> Result<(), NriCmdError> {
    // A launched plugin's stderr is the null device: its log goes to a file,
    // and so does an error that stops it before that log is set up.
    let log_file = (Preinstalled::launched() && crate::logging_file::stderr_is_null()).then(|| {
        plugin_options(&args, true)
            .state_dir
            .join(crate::logging_file::NRI_LOG_FILE)
    });
    let mut logging = false;
    let result = set_up_and_serve(args, log_file.as_deref(), &mut logging);
    if let (Err(e), Some(path)) = (&result, &log_file) {
        // Into the log file too: main says it on stderr, here the null device.
        match logging {
            true => tracing::error!(error = %nri::ErrorChain(e), "devgate nri stopped"),
            false => crate::logging_file::append_line(
                path,
                &format!(
                    "devgate nri did not start (unix time {}): {}",
                    crate::ledger::now_unix(),
                    nri::ErrorChain(e)
                ),
            ),
        }
    }
    result
}

/// `run` up to its logging, which `logging` says is set up, then the rest.
fn set_up_and_serve(
    args: NriArgs,
    log_file: Option<&std::path::Path>,
    logging: &mut bool,
) -> Result<(), NriCmdError> {
    // Before any thread starts, so that all of them inherit the mask.
    let signals = block_exit_signals()?;
    let preinstalled = Preinstalled::from_env()?;
    // A bad flag fails before the ledger, the uevent socket or NVML are set up.
    if preinstalled.is_none() {
        nri::stub::check_identity(&args.name, &args.idx)?;
    }
    // A runtime-launched plugin gets its config in Configure; until then,
    // and for its log format, the defaults apply. An invalid file does not
    // stop the plugin: exited, it would leave the node's containers created
    // without their devices (a runtime creates them as usual while no plugin
    // is connected); connected, it refuses those that ask devgate for any,
    // with the config's error, releases no pod (its `[gpu]` is unknown), and
    // `devgate ready` fails, which stops a rollout there.
    let (config, invalid) = match preinstalled {
        Some(_) => (Config::default(), None),
        None => match Config::load(&args.config) {
            Ok(config) => (config, None),
            Err(e) => (Config::default(), Some(e)),
        },
    };
    let options = plugin_options(&args, preinstalled.is_some());
    init_logging(config.log_format, log_file)?;
    *logging = true;
    start_and_serve(args, config, invalid, options, preinstalled, signals)
}

/// `run` once logging is set up: the plugin made, its host watched, served.
fn start_and_serve(
    args: NriArgs,
    config: Config,
    invalid: Option<ConfigError>,
    options: PluginOptions,
    preinstalled: Option<Preinstalled>,
    signals: SigSet,
) -> Result<(), NriCmdError> {
    // Which config is in force: a mistyped --config path, or a ConfigMap key
    // renamed, reads as no file and so as the defaults.
    match (&preinstalled, &invalid, args.config.is_file()) {
        (Some(_), _, _) => tracing::info!("config: the runtime's, at Configure"),
        (None, Some(e), _) => {
            tracing::error!(config = %args.config.display(), error = %nri::ErrorChain(e), "invalid config; refusing containers that need devgate until it is mended and the plugin restarted")
        }
        (None, None, true) => tracing::info!(config = %args.config.display(), "config loaded"),
        (None, None, false) => {
            tracing::warn!(config = %args.config.display(), "no config file there: the defaults apply")
        }
    }
    let gpu_config = config.gpu.clone();
    // Opened before the plugin's first read of the host: a device change
    // from then on is queued in it.
    let uevents = crate::inventory::uevents::UeventSocket::open();
    let plugin = DevgatePlugin::new(config, options).map_err(NriCmdError::State)?;
    if let Some(e) = invalid {
        plugin.refuse_for_config(e);
    }
    if let Err(e) = uevents.and_then(|sock| plugin.watch_host_changes(sock)) {
        let period = crate::plugin::POLL_PERIOD;
        tracing::warn!(error = %e, period_s = period.as_secs(), "kernel uevents cannot be read: the host's devices are read again each period, and a device the kernel numbers anew in between (VFs made again, a module reloaded) is seen before then only when a plan names one the inventory does not know");
        if let Err(e) = plugin.poll_host_changes(period) {
            tracing::warn!(error = %e, "the host's devices cannot be read again in the background either: only when a plan names a device the inventory does not know");
        }
    }
    if preinstalled.is_none() && plugin.config().is_ok() {
        // A runtime-started plugin starts it at Configure, with its `[gpu]`;
        // under an invalid config its `[gpu]` is unknown.
        plugin.start_gpu_health(&gpu_config);
    }
    let stub = match preinstalled {
        Some(runtime) => {
            tracing::info!(name = %runtime.name, idx = %runtime.idx, "started by the runtime");
            Stub::preinstalled(plugin, runtime)
        }
        None => {
            tracing::info!(socket = %args.socket.display(), name = %args.name, idx = %args.idx, "starting");
            Stub::new(plugin)
                .with_name(args.name)
                .with_idx(args.idx)
                .with_socket_path(args.socket)
        }
    };
    serve(stub, signals)
}

/// Serves on this thread (the plugin answers one runtime request at a time);
/// GPU quarantine retries and signals get a thread each.
fn serve(stub: Stub<DevgatePlugin>, signals: SigSet) -> Result<(), NriCmdError> {
    let plugin = Arc::clone(stub.plugin());
    let on_signal = Arc::clone(&plugin);
    let gate = stub.request_gate();
    std::thread::Builder::new()
        .name("signals".to_string())
        .spawn(move || exit_on_signal(signals, &gate, &on_signal))
        .map_err(NriCmdError::Signals)?;
    let retrying = Arc::clone(&plugin);
    std::thread::Builder::new()
        .name("gpu-retry".to_string())
        .spawn(move || retrying.retry_quarantined_every())
        .map_err(NriCmdError::Threads)?;
    let result = stub.run();
    if result.is_ok() {
        tracing::info!("runtime closed the connection; exiting");
    }
    // A plugin the runtime launched ends with its connection: teardowns in
    // progress (a VF half way home, a GPU being reset) finish first, as at
    // a signal, rather than be cut for the next start to redo.
    if !plugin.wait_for_releases(RELEASE_WAIT) {
        tracing::warn!(
            waited_s = RELEASE_WAIT.as_secs(),
            "teardown still running at exit; the next start finishes it"
        );
    }
    // The grant counters are written in the background; the last ones now.
    plugin.flush_at_exit();
    result?;
    Ok(())
}

/// SIGTERM and SIGINT, blocked in this thread and every thread it starts
/// afterwards, so that only [`exit_on_signal`] receives them.
fn block_exit_signals() -> Result<SigSet, NriCmdError> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.thread_block()
        .map_err(|e| NriCmdError::Signals(e.into()))?;
    Ok(set)
}

/// How long an exit waits for teardowns in progress: well inside systemd's
/// default stop timeout (90 s) and the kubelet's grace period (30 s).
const RELEASE_WAIT: Duration = Duration::from_secs(20);

/// Waits for SIGTERM or SIGINT, then for the teardowns in progress (requests
/// still answered) and the request in progress, writes the last grant
/// counters, folds the ledger's journal and exits
/// ([`DevgatePlugin::drain_for_exit`]). Claims need nothing more: every
/// ledger change is on disk when its transaction ends.
fn exit_on_signal(signals: SigSet, gate: &RequestGate, plugin: &DevgatePlugin) {
    match signals.wait() {
        Ok(signal) => tracing::info!(signal = %signal.as_str(), "exiting"),
        Err(e) => {
            // Signals then keep their default action, which also ends us.
            tracing::warn!(error = %nri::ErrorChain(&e), "waiting for signals failed");
            return;
        }
    }
    // Held until the process is gone: no request starts after the drain.
    let _between_requests = plugin.drain_for_exit(gate, RELEASE_WAIT);
    std::process::exit(0);
}

/// The log on stderr, or in `file` where nobody reads stderr, filtered by
/// `DEVGATE_LOG` (default `info`).
fn init_logging(format: LogFormat, file: Option<&std::path::Path>) -> Result<(), NriCmdError> {
    let filter = log_filter(std::env::var(LOG_ENV).ok())?;
    let stderr = |filter| {
        crate::logging::init_stderr(format, filter).map_err(|e| NriCmdError::Logging(Box::new(e)))
    };
    let Some(path) = file else {
        return stderr(filter);
    };
    match crate::logging_file::RotatingFile::open(path, crate::hook::MAX_LOG_BYTES) {
        Ok(log) => crate::logging::init_with(format, filter, std::sync::Arc::new(log), false)
            .map_err(|e| NriCmdError::Logging(Box::new(e))),
        // No log is no reason not to serve: stderr, where nobody may read it.
        Err(e) => {
            stderr(filter)?;
            tracing::error!(path = %path.display(), error = %e, "cannot open the log file: logging to stderr");
            Ok(())
        }
    }
}

/// The filter `DEVGATE_LOG` asks for: a level, and levels per target.
fn log_filter(value: Option<String>) -> Result<Targets, NriCmdError> {
    match value {
        Some(value) => value
            .parse::<Targets>()
            .map_err(|e| NriCmdError::LogFilter {
                reason: e.to_string(),
                value,
            }),
        None => Ok(Targets::new().with_default(DEFAULT_LOG_LEVEL)),
    }
}

#[cfg(test)]
#[path = "nri_tests.rs"]
mod tests;
