//! Stage `auto`, the hooks.d file's (OCI hooks carry no stage of their own):
//! the container's status tells a creation from a stop, but not which of a
//! creation's stages is running. createRuntime and prestart hooks run in the
//! runtime's namespaces, children of the runtime's process; createContainer
//! and startContainer hooks run in the container's, children of its init,
//! and are passed a creation's status too (runtime-spec `config.md`,
//! "POSIX-platform Hooks"; runc passes `creating` and `created`, crun
//! `created` and `starting`). There the state's pid is the init's as the
//! container numbers it (runc's `getpid()` in the container: 1; crun's 0), so
//! a createRuntime run would take whatever holds that number in the host's
//! `/proc` (its init) for the container: pin it, compare its network with the
//! host's, make nodes through its root, move VFs into its namespace. So a
//! run inside the container is refused, with the fix in the error: an
//! operator who lists the hook at createContainer or startContainer too gets
//! a container that fails to start, not one set up against another process.

use std::path::Path;

use super::{HookError, Stage, State};

/// The stage a run of `devgate-hook auto` takes for `state`.
pub(crate) fn resolve(state: &State) -> Result<Stage, HookError> {
    resolve_as(state, Own::current)
}

/// How many of the hook's ancestors are looked at: a hooks.d entry may run
/// the hook through wrappers (`timeout`, a shell, `flock`), each a process.
const MAX_ANCESTORS: usize = 16;

/// The hook's own pid, as its pid namespace and as `/proc` number it, and
/// its ancestors', its parent first, as `/proc` numbers them.
#[derive(Debug)]
struct Own {
    pid: u32,
    in_proc: std::io::Result<u32>,
    ancestors: Vec<u32>,
}

impl Own {
    fn current() -> Own {
        let proc_root = Path::new("/proc");
        let in_proc = std::fs::read_link(proc_root.join("self")).and_then(|target| {
            target
                .to_str()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| std::io::Error::other("/proc/self is not a pid"))
        });
        Own {
            pid: std::process::id(),
            in_proc,
            ancestors: ancestors(proc_root, std::os::unix::process::parent_id()),
        }
    }
}

/// `first` and its ancestors up to pid 1, read from `<proc_root>/<pid>/stat`,
/// at most [`MAX_ANCESTORS`]; as far as they can be read.
fn ancestors(proc_root: &Path, first: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut pid = first;
    while pid > 1 && out.len() < MAX_ANCESTORS {
        out.push(pid);
        let stat = crate::fsutil::read_proc_stat(&proc_root.join(pid.to_string()).join("stat"));
        match stat
            .ok()
            .as_deref()
            .and_then(crate::proc_stat::StatLine::parse)
        {
            Some(line) => pid = line.ppid,
            None => break,
        }
    }
    out
}

/// `own` is asked for only at a creation's status: a poststop reads nothing.
fn resolve_as(state: &State, own: impl FnOnce() -> Own) -> Result<Stage, HookError> {
    let inside = |why| HookError::AutoInContainer {
        status: state.status.chars().take(32).collect(),
        why,
    };
    // crun's startContainer status: never a stage this hook runs at.
    if state.status == "starting" {
        return Err(inside("crun's startContainer status"));
    }
    let stage = Stage::from_status(&state.status)?;
    if stage != Stage::CreateRuntime {
        return Ok(stage);
    }
    let own = own();
    match &own.in_proc {
        // A pid namespace other than the one `/proc` numbers: the
        // container's own (a runtime's `/proc` is its pid namespace's).
        Ok(in_proc) if *in_proc != own.pid => {
            return Err(inside(
                "/proc numbers this hook apart from its own pid namespace, which is then the \
                 container's, unless /proc is not the runtime's",
            ))
        }
        Ok(_) => {}
        // Told apart only to catch a misconfiguration: a hook that cannot
        // read `/proc` fails the run's later steps anyway.
        Err(e) => {
            tracing::warn!(error = %e, "stage auto: /proc/self unreadable, pid namespace not compared")
        }
    }
    // crun's createContainer passes pid 0; at createRuntime and prestart
    // every runtime passes the init's pid (runtime-spec `runtime.md`).
    if state.pid == Some(0) {
        return Err(inside("pid 0, as crun passes to createContainer hooks"));
    }
    // The init among the hook's ancestors: a container in the runtime's
    // pid namespace (hostPID), whose state numbers its init as the host
    // does. At createRuntime the hook descends from the runtime, never from
    // the init the runtime created.
    if state.pid().is_some_and(|pid| own.ancestors.contains(&pid)) {
        return Err(inside(
            "the container's init is this hook's parent or an ancestor",
        ));
    }
    Ok(stage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(status: &str, pid: Option<i64>) -> State {
        State {
            oci_version: "1.0.2".into(),
            id: "c1".into(),
            status: status.into(),
            pid,
            bundle: String::new(),
            annotations: Default::default(),
        }
    }

    /// The hook as runtimes run it at createRuntime: in their pid namespace,
    /// a child of the runtime's process (pid 50), the init being 60.
    fn runtime_child() -> Own {
        Own {
            pid: 70,
            in_proc: Ok(70),
            ancestors: vec![50, 40, 30],
        }
    }

    #[test]
    fn a_run_inside_the_container_is_refused_with_the_fix() {
        let check =
            |status: &str, pid: Option<i64>, own: Own| resolve_as(&state(status, pid), || own);
        let inside =
            |r: Result<Stage, HookError>| matches!(r, Err(HookError::AutoInContainer { .. }));
        // createRuntime and prestart (runc `creating`, crun `created`).
        for status in ["creating", "created"] {
            assert_eq!(
                check(status, Some(60), runtime_child()).unwrap(),
                Stage::CreateRuntime
            );
        }
        // In the container's own pid namespace: `/proc` numbers the hook
        // otherwise, whatever pid the state gives (runc 1, crun 0).
        let in_pidns = || Own {
            pid: 3,
            in_proc: Ok(4242),
            ancestors: vec![],
        };
        for (status, pid) in [
            ("creating", Some(1)),
            ("created", Some(0)),
            ("created", None),
        ] {
            assert!(inside(check(status, pid, in_pidns())), "{status} {pid:?}");
        }
        // In the host's pid namespace (hostPID): the init is the parent, or
        // a wrapper's (`timeout` in the hooks.d entry).
        let host_pidns = || Own {
            pid: 70,
            in_proc: Ok(70),
            ancestors: vec![60, 40, 30],
        };
        let wrapped = || Own {
            pid: 70,
            in_proc: Ok(70),
            ancestors: vec![65, 60, 40, 30],
        };
        assert!(inside(check("creating", Some(60), wrapped())));
        // crun's createContainer: pid 0.
        assert!(inside(check("created", Some(0), runtime_child())));
        for status in ["creating", "created"] {
            let e = check(status, Some(60), host_pidns()).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, HookError::AutoInContainer { .. }), "{text}");
            assert!(text.contains("createContainer or startContainer"), "{text}");
            assert!(
                text.contains("createRuntime (or prestart) and poststop"),
                "{text}"
            );
        }
        // crun's startContainer.
        assert!(inside(check("starting", Some(0), runtime_child())));
        // A stop reads nothing of the hook's own process: the init is gone.
        let stop = resolve_as(&state("stopped", Some(60)), || panic!("read at a stop"));
        assert_eq!(stop.unwrap(), Stage::Poststop);
        assert!(matches!(
            check("running", Some(60), runtime_child()),
            Err(HookError::AutoStage(_))
        ));
        // `/proc` unreadable: only the ancestors are compared.
        let unread = || Own {
            pid: 70,
            in_proc: Err(std::io::Error::other("no /proc")),
            ancestors: vec![50],
        };
        assert_eq!(
            check("creating", Some(60), unread()).unwrap(),
            Stage::CreateRuntime
        );
        // No pid: the stage's own checks judge.
        assert_eq!(
            check("creating", None, runtime_child()).unwrap(),
            Stage::CreateRuntime
        );
    }

    /// The test process as a runtime's hook sees itself (this test runs in
    /// the pid namespace its `/proc` numbers), and its ancestors read from
    /// the kernel: a child's are its parent, then this process and up.
    #[test]
    fn the_hooks_own_process_and_ancestors_are_read_from_the_kernel() {
        let own = Own::current();
        assert_eq!(own.in_proc.as_ref().ok(), Some(&own.pid));
        assert_eq!(own.ancestors[0], std::os::unix::process::parent_id());
        // `sh` waits for `sleep` (no exec of the last command: `; :`).
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait; :"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(shell.stdout.as_mut().unwrap()),
            &mut first,
        )
        .unwrap();
        let sleep: u32 = first.trim().parse().unwrap();
        let chain = ancestors(Path::new("/proc"), sleep);
        assert_eq!(chain[..3], [sleep, shell.id(), own.pid], "{chain:?}");
        assert!(chain.len() <= MAX_ANCESTORS);
        // A process that is neither the hook's ancestor nor in another pid
        // namespace: createRuntime.
        let stage = resolve(&state("creating", Some(sleep.into()))).unwrap();
        assert_eq!(stage, Stage::CreateRuntime);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sleep as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        shell.wait().unwrap();
        assert!(
            ancestors(Path::new("/proc"), u32::MAX).len() <= 1,
            "no such process"
        );
    }
}
