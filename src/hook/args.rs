//! The hook's command line, parsed by hand: `devgate-hook` runs on the container
//! start path, where an argument-parsing framework would cost startup time and
//! resident pages for six flags (the runtime, not a person, writes these lines).

use std::ffi::OsString;
use std::path::PathBuf;

use tracing::level_filters::LevelFilter;

use super::DEFAULT_STATE_DIR;

pub const USAGE: &str =
    "usage: devgate-hook <prestart|createRuntime|createContainer|poststop|auto> \
[--host-root DIR] [--state-dir DIR] [--log-file FILE] [--log-level LEVEL] [--hooks-only] \
[--cgroup-root DIR] [--cgroup2-root DIR]";

/// What the runtime asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookArgs {
    /// A stage name, or `auto`: taken from the state's status (creating:
    /// createRuntime, stopped: poststop), for a hooks.d file that lists both
    /// stages with one argument list.
    pub stage: String,
    /// Root of the host filesystem for sysfs reads.
    pub host_root: PathBuf,
    /// Ledger and saved VF state (keep it on tmpfs: it describes this boot only).
    pub state_dir: PathBuf,
    /// Default `<state-dir>/hook.log`.
    pub log_file: Option<PathBuf>,
    pub log_level: LevelFilter,
    /// Resolve devices from the pod annotation without the NRI plugin (hooks.d).
    pub hooks_only: bool,
    /// Where the cgroup v1 hierarchies are mounted (hooks-only mode).
    pub cgroup_root: PathBuf,
    /// Where the cgroup v2 hierarchy is mounted on a unified host (hooks-only
    /// mode). The hook works on cgroup v2 only when this is a cgroup2
    /// filesystem, as runc and crun decide by `/sys/fs/cgroup`: on a hybrid
    /// host it stays `/sys/fs/cgroup` (a tmpfs there), never the
    /// `/sys/fs/cgroup/unified` mount, which the runtimes' device rules do
    /// not use.
    pub cgroup2_root: PathBuf,
}

/// What the command line asks for besides running the hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(HookArgs),
    Help,
    Version,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("missing the stage")]
    MissingStage,
    #[error(
        "unknown stage {stage:?} (prestart, createRuntime, createContainer, poststop or auto)"
    )]
    UnknownStage { stage: String },
    #[error("unexpected argument {arg:?}")]
    Unexpected { arg: String },
    #[error("unknown flag {flag:?}")]
    UnknownFlag { flag: String },
    #[error("flag {flag} needs a value")]
    MissingValue { flag: String },
    #[error("flag {flag}: {reason}")]
    BadValue { flag: String, reason: String },
    #[error("flag {flag} given twice")]
    Repeated { flag: String },
    #[error("argument is not valid utf-8: {arg:?}")]
    NotUtf8 { arg: OsString },
}

impl Default for HookArgs {
    fn default() -> Self {
        HookArgs {
            stage: String::new(),
            host_root: PathBuf::from("/"),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            log_file: None,
            log_level: LevelFilter::INFO,
            hooks_only: false,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup2_root: PathBuf::from("/sys/fs/cgroup"),
        }
    }
}

/// Parses the arguments after the program name: `--flag value` or `--flag=value`.
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Command, ArgsError> {
    let mut out = HookArgs::default();
    let mut stage = None;
    let mut seen: Vec<String> = Vec::new();
    let mut it = args.into_iter();
    while let Some(raw) = it.next() {
        let arg = raw
            .into_string()
            .map_err(|arg| ArgsError::NotUtf8 { arg })?;
        let Some(flag_text) = arg.strip_prefix("--") else {
            if stage.is_some() {
                return Err(ArgsError::Unexpected { arg });
            }
            stage = Some(arg);
            continue;
        };
        let (name, inline) = match flag_text.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag_text.to_string(), None),
        };
        let flag = format!("--{name}");
        match name.as_str() {
            "help" => return Ok(Command::Help),
            "version" => return Ok(Command::Version),
            "hooks-only" if inline.is_none() => {}
            "hooks-only" => {
                return Err(ArgsError::BadValue {
                    flag,
                    reason: "takes no value".to_string(),
                })
            }
            "host-root" | "state-dir" | "log-file" | "log-level" | "cgroup-root"
            | "cgroup2-root" => {}
            _ => return Err(ArgsError::UnknownFlag { flag }),
        }
        if seen.contains(&name) {
            return Err(ArgsError::Repeated { flag });
        }
        seen.push(name.clone());
        if name == "hooks-only" {
            out.hooks_only = true;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => match it.next() {
                Some(v) => v.into_string().map_err(|arg| ArgsError::NotUtf8 { arg })?,
                None => return Err(ArgsError::MissingValue { flag }),
            },
        };
        if value.is_empty() {
            return Err(ArgsError::MissingValue { flag });
        }
        set(&mut out, &name, &flag, value)?;
    }
    let stage = stage.ok_or(ArgsError::MissingStage)?;
    // A stage is part of the command line: a misspelt one is a usage error,
    // told before anything runs.
    if stage != "auto" && stage.parse::<super::Stage>().is_err() {
        return Err(ArgsError::UnknownStage {
            stage: stage.chars().take(64).collect(),
        });
    }
    out.stage = stage;
    Ok(Command::Run(out))
}

fn set(out: &mut HookArgs, name: &str, flag: &str, value: String) -> Result<(), ArgsError> {
    match name {
        "host-root" => out.host_root = value.into(),
        "state-dir" => out.state_dir = value.into(),
        "log-file" => out.log_file = Some(value.into()),
        "cgroup-root" => out.cgroup_root = value.into(),
        "cgroup2-root" => out.cgroup2_root = value.into(),
        _ => {
            out.log_level = value.parse().map_err(|_| ArgsError::BadValue {
                flag: flag.to_string(),
                reason: format!("{value:?} is not one of off, error, warn, info, debug, trace"),
            })?
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str) -> Result<Command, ArgsError> {
        parse(line.split_whitespace().map(OsString::from))
    }

    fn args(edit: impl FnOnce(&mut HookArgs)) -> Command {
        let mut a = HookArgs {
            stage: "poststop".to_string(),
            ..HookArgs::default()
        };
        edit(&mut a);
        Command::Run(a)
    }

    #[test]
    fn command_lines() {
        let cases: Vec<(&str, Result<Command, ArgsError>)> = vec![
            ("poststop", Ok(args(|_| {}))),
            (
                "poststop --state-dir /run/x --host-root=/h --hooks-only",
                Ok(args(|a| {
                    a.state_dir = "/run/x".into();
                    a.host_root = "/h".into();
                    a.hooks_only = true;
                })),
            ),
            (
                "--log-level debug --log-file /l poststop --cgroup2-root /u --cgroup-root /c",
                Ok(args(|a| {
                    a.log_level = LevelFilter::DEBUG;
                    a.log_file = Some("/l".into());
                    a.cgroup_root = "/c".into();
                    a.cgroup2_root = "/u".into();
                })),
            ),
            ("poststop --help", Ok(Command::Help)),
            ("--version", Ok(Command::Version)),
            ("", Err(ArgsError::MissingStage)),
            ("--hooks-only", Err(ArgsError::MissingStage)),
            (
                "auto --hooks-only",
                Ok(args(|a| {
                    a.stage = "auto".into();
                    a.hooks_only = true;
                })),
            ),
            (
                "createruntime",
                Err(ArgsError::UnknownStage {
                    stage: "createruntime".to_string(),
                }),
            ),
            (
                "poststop extra",
                Err(ArgsError::Unexpected {
                    arg: "extra".to_string(),
                }),
            ),
            (
                "poststop --bogus 1",
                Err(ArgsError::UnknownFlag {
                    flag: "--bogus".to_string(),
                }),
            ),
            (
                "poststop --state-dir",
                Err(ArgsError::MissingValue {
                    flag: "--state-dir".to_string(),
                }),
            ),
            (
                "poststop --state-dir=",
                Err(ArgsError::MissingValue {
                    flag: "--state-dir".to_string(),
                }),
            ),
            (
                "poststop --state-dir /a --state-dir /b",
                Err(ArgsError::Repeated {
                    flag: "--state-dir".to_string(),
                }),
            ),
            (
                "poststop --hooks-only=yes",
                Err(ArgsError::BadValue {
                    flag: "--hooks-only".to_string(),
                    reason: "takes no value".to_string(),
                }),
            ),
        ];
        for (line, want) in cases {
            assert_eq!(run(line), want, "{line:?}");
        }
    }

    #[test]
    fn a_bad_level_names_the_flag() {
        let err = run("poststop --log-level loud").unwrap_err();
        assert!(
            err.to_string().starts_with("flag --log-level: \"loud\""),
            "{err}"
        );
    }

    #[test]
    fn non_utf8_is_refused_not_mangled() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![b'/', 0xff]);
        let err = parse(["poststop".into(), "--state-dir".into(), bad.clone()]).unwrap_err();
        assert_eq!(err, ArgsError::NotUtf8 { arg: bad });
    }
}
