//! The hook's command-line entry, shared by `devgate-hook` and, for hooks-only
//! mode under a statically linked `devgate-hook`, by `devgate hook`.
//!
//! `install/build.sh` links `devgate-hook` statically: runc runs it at every
//! container start and stop, and the dynamic loader's work was most of a no-op
//! run. A static glibc program cannot safely `dlopen` the host's NVML (the
//! library would bring a second C library, of the host's version, into the
//! process), and hooks-only mode tears GPUs down with NVML; NRI mode never
//! loads it (the plugin tears GPUs down). So a static hook hands a
//! hooks-only run to the dynamically linked `devgate` beside it, which runs this
//! same entry ([`delegate_hooks_only`]).
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::args::{self, Command, HookArgs, USAGE};
use super::{HookEnv, HookError, Stage, State, SysContainerOs, CONFIG_ENV, FAULT_ENV};
use crate::config::{Config, DEFAULT_CONFIG_PATH};
use crate::netdev::NetnsRoots;

/// The subcommand of `devgate` that runs this entry.
pub const DEVGATE_SUBCOMMAND: &str = "hook";

/// Whether this program is linked statically (it cannot load NVML).
pub const STATIC: bool = cfg!(target_feature = "crt-static");

/// In a statically linked hook, a hooks-only run becomes `devgate hook ARGS`,
/// `devgate` being the file beside this program (never a path from the
/// container). Returns only when that is not to be done or failed; the reason
/// is then logged by the caller, which goes on in-process without NVML.
pub fn delegate_hooks_only(argv: &[OsString]) -> Option<String> {
    if !STATIC {
        return None;
    }
    let wants = matches!(args::parse(argv.iter().cloned()), Ok(Command::Run(a)) if a.hooks_only);
    if !wants {
        return None;
    }
    let devgate = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name("devgate"),
        Err(e) => return Some(format!("own path unknown: {e}")),
    };
    Some(exec_devgate(&devgate, argv))
}

/// execs `devgate hook ARGS`; returns why it could not.
fn exec_devgate(devgate: &Path, argv: &[OsString]) -> String {
    use std::os::unix::process::CommandExt;
    if !devgate.is_file() {
        return format!("{} not found", devgate.display());
    }
    // A failed exec may leave this process altered (signal dispositions), so
    // what would fail it is checked first.
    if let Err(e) = nix::unistd::access(devgate, nix::unistd::AccessFlags::X_OK) {
        return format!("{} is not executable: {e}", devgate.display());
    }
    // stdin (the container state) is inherited unread.
    let err = std::process::Command::new(devgate)
        .arg(DEVGATE_SUBCOMMAND)
        .args(argv)
        .exec();
    format!("exec {}: {err}", devgate.display())
}

/// The hook's `main`: `argv` without the program name.
pub fn main(argv: impl IntoIterator<Item = OsString>) -> ExitCode {
    main_with(argv, None)
}

/// [`main`], logging why a hooks-only run was not handed to `devgate`
/// (`not_delegated`, from [`delegate_hooks_only`]).
pub fn main_with(
    argv: impl IntoIterator<Item = OsString>,
    not_delegated: Option<String>,
) -> ExitCode {
    let args = match args::parse(argv) {
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
    let _ = super::init_log(&log_file, args.log_level);
    if let Some(reason) = &not_delegated {
        tracing::warn!(
            %reason,
            "statically linked hook in hooks-only mode could not run devgate: nvml is not used"
        );
    }
    match run(&args, not_delegated) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let line = nri::ErrorChain(&e).to_string();
            tracing::error!(stage = %args.stage, error = %line, "hook failed");
            eprintln!("devgate-hook: {line}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the stage. A hooks-only run that a static hook could not hand to
/// `devgate` (`not_delegated`) admits nothing (fail closed: the GPUs would be
/// set up without NVML's view) but still tears down, since a VF must go back
/// whatever else is missing; its GPU teardown then keeps the GPUs quarantined
/// (`SysContainerOs::gpu_teardown`).
fn run(args: &HookArgs, not_delegated: Option<String>) -> Result<(), HookError> {
    let started = std::time::Instant::now();
    let fixed: Option<Stage> = match args.stage.as_str() {
        "auto" => None,
        other => Some(other.parse()?),
    };
    let state = State::read(std::io::stdin().lock())?;
    let stage = match fixed {
        Some(stage) => stage,
        None => super::auto_stage::resolve(&state)?,
    };
    if let (Some(reason), Stage::Prestart | Stage::CreateRuntime) = (not_delegated, stage) {
        return Err(HookError::NotHandedOver { stage, reason });
    }
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
        let path = std::env::var_os(CONFIG_ENV)
            .map_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH), PathBuf::from);
        let mut os = SysContainerOs::new(
            env.clone(),
            args.cgroup_root.clone(),
            args.cgroup2_root.clone(),
        );
        // Only hooks-only mode reads the config (NRI mode acts on what the
        // plugin resolved). One that does not load fails the run, but a
        // poststop first does its network part, which needs none.
        let config = match Config::load(&path) {
            Ok(config) => config,
            Err(e) => {
                if stage == Stage::Poststop {
                    let defaults = Config::default();
                    let mut run = super::HooksOnly {
                        env: &env,
                        config: &defaults,
                        os: &mut os,
                        checkpoint: &checkpoint,
                        reap_until: started,
                    };
                    super::release::leave_without_config(&mut run, &state);
                }
                return Err(e.into());
            }
        };
        let run = super::HooksOnly {
            env: &env,
            config: &config,
            os: &mut os,
            checkpoint: &checkpoint,
            reap_until: super::standalone::reap_deadline(started),
        };
        super::run_hooks_only(stage, &state, run)?
    } else {
        super::run(stage, &state, &env, &checkpoint)?
    };
    let linked = if STATIC { "static" } else { "dynamic" };
    tracing::info!(%stage, container = %state.id, ?outcome, linked, "hook done");
    Ok(())
}
