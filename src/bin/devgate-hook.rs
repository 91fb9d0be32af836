//! `devgate-hook <stage>`: the OCI hook (see `devgate::hook`).
//!
//! Exit 0 on success; on failure one line on stderr and exit 1. runc puts that
//! line into its "error running hook" message, so it must say what failed.
use std::path::PathBuf;
use std::process::ExitCode;

use devgate::config::{Config, DEFAULT_CONFIG_PATH};
use devgate::hook::args::{self, Command, HookArgs, USAGE};
use devgate::hook::{
    self, HookEnv, HookError, Stage, State, SysContainerOs, CONFIG_ENV, FAULT_ENV,
};
use devgate::netdev::NetnsRoots;

fn main() -> ExitCode {
    let args = match args::parse(std::env::args_os().skip(1)) {
        Ok(Command::Run(args)) => args,
        Ok(Command::Help) => {
            println!("devgate-hook: OCI hook: give pods their VFs and take them back\n{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("devgate-hook {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("devgate-hook: {e}; {USAGE}");
            return ExitCode::from(2);
        }
    };
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

fn run(args: &HookArgs) -> Result<(), HookError> {
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
        let mut os = SysContainerOs::new(
            env.clone(),
            args.cgroup_root.clone(),
            args.cgroup2_root.clone(),
        );
        let run = hook::HooksOnly {
            env: &env,
            config: &config,
            os: &mut os,
            checkpoint: &checkpoint,
        };
        hook::run_hooks_only(stage, &state, run)?
    } else {
        hook::run(stage, &state, &env, &checkpoint)?
    };
    tracing::info!(%stage, container = %state.id, ?outcome, "hook done");
    Ok(())
}

fn chain(e: &dyn std::error::Error) -> String {
    devgate::netdev::chain(e)
}
