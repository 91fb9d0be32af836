//! `devgate-hook <stage>`: the OCI hook (see `devgate::hook`).
//!
//! Exit 0 on success; on failure one line on stderr and exit 1. runc puts that
//! line into its "error running hook" message, so it must say what failed.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use devgate::config::{Config, DEFAULT_CONFIG_PATH};
use devgate::hook::{
    self, HookEnv, HookError, Stage, State, SysContainerOs, CONFIG_ENV, DEFAULT_STATE_DIR,
    FAULT_ENV,
};
use devgate::netdev::NetnsRoots;
use tracing::level_filters::LevelFilter;

#[derive(Parser)]
#[command(
    name = "devgate-hook",
    version,
    about = "OCI hook: give pods their VFs and take them back"
)]
struct Args {
    /// prestart, createRuntime, createContainer or poststop; `auto` takes it
    /// from the state's status (creating: createRuntime, stopped: poststop),
    /// for a hooks.d file that lists both stages with one argument list.
    stage: String,
    /// Root of the host filesystem for sysfs reads.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// Saved VF state (keep it on tmpfs: it describes this boot only).
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Log file; default `<state-dir>/hook.log`.
    #[arg(long)]
    log_file: Option<PathBuf>,
    #[arg(long, default_value = "info")]
    log_level: LevelFilter,
    /// Resolve devices from the pod annotation without the NRI plugin
    /// (hooks.d): device nodes, device cgroup rules and VFs.
    #[arg(long)]
    hooks_only: bool,
    /// Where the cgroup v1 hierarchies are mounted (hooks-only mode).
    #[arg(long, default_value = "/sys/fs/cgroup")]
    cgroup_root: PathBuf,
    /// Where the cgroup v2 hierarchy is mounted (hooks-only mode; on a hybrid
    /// host usually `/sys/fs/cgroup/unified`).
    #[arg(long, default_value = "/sys/fs/cgroup")]
    cgroup2_root: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let log_file = args
        .log_file
        .clone()
        .unwrap_or_else(|| args.state_dir.join("hook.log"));
    let _ = hook::init_log(&log_file, args.log_level);
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let line = chain(&e);
            tracing::error!(stage = %args.stage, error = %line, "hook failed");
            eprintln!("devgate-hook: {line}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), HookError> {
    let fixed: Option<Stage> = match args.stage.as_str() {
        "auto" => None,
        other => Some(other.parse()?),
    };
    let config_path = std::env::var_os(CONFIG_ENV)
        .map_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH), PathBuf::from);
    let config = Config::load(&config_path)?;
    let state = State::read(std::io::stdin().lock())?;
    let stage = match fixed {
        Some(stage) => stage,
        None => Stage::from_status(&state.status)?,
    };
    let env = HookEnv {
        host_root: args.host_root.clone(),
        state_dir: args.state_dir.clone(),
        roots: NetnsRoots::default(),
    };
    let fault = std::env::var(FAULT_ENV).ok();
    let checkpoint = |name: &'static str| {
        if fault
            .as_deref()
            .and_then(|f| f.strip_prefix("abort-after:"))
            == Some(name)
        {
            // Exactly what `kill -9` leaves behind: no destructor, no rollback.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    };
    let outcome = if args.hooks_only {
        let mut os = SysContainerOs {
            env: env.clone(),
            cgroup_root: args.cgroup_root.clone(),
            cgroup2_root: args.cgroup2_root.clone(),
        };
        hook::run_hooks_only(stage, &state, &env, &config, &mut os, &checkpoint)?
    } else {
        hook::run(stage, &state, &env, &checkpoint)?
    };
    tracing::info!(%stage, container = %state.id, ?outcome, "hook done");
    Ok(())
}

fn chain(e: &dyn std::error::Error) -> String {
    devgate::netdev::chain(e)
}
