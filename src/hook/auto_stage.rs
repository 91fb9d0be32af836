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

use super::{HookError, Stage, State};

/// The stage a run of `devgate-hook auto` takes for `state`.
pub(crate) fn resolve(state: &State) -> Result<Stage, HookError> {
    resolve_as(state, &Own::current())
}

/// The hook's own pid, as its pid namespace and as `/proc` number it, and
/// its parent's, as its pid namespace numbers it.
#[derive(Debug)]
struct Own {
    pid: u32,
    in_proc: std::io::Result<u32>,
    parent: u32,
}

impl Own {
    fn current() -> Own {
        let in_proc = std::fs::read_link("/proc/self").and_then(|target| {
            target
                .to_str()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| std::io::Error::other("/proc/self is not a pid"))
        });
        Own {
            pid: std::process::id(),
            in_proc,
            parent: std::os::unix::process::parent_id(),
        }
    }
}

fn resolve_as(state: &State, own: &Own) -> Result<Stage, HookError> {
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
    // The init as parent: a container in the runtime's pid namespace
    // (hostPID), whose state numbers its init as the host does. At
    // createRuntime the parent is the runtime, never the init it created.
    if state.pid() == Some(own.parent) {
        return Err(inside("the container's init is this hook's parent"));
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
            parent: 50,
        }
    }

    #[test]
    fn a_run_inside_the_container_is_refused_with_the_fix() {
        let check =
            |status: &str, pid: Option<i64>, own: Own| resolve_as(&state(status, pid), &own);
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
            parent: 1,
        };
        for (status, pid) in [
            ("creating", Some(1)),
            ("created", Some(0)),
            ("created", None),
        ] {
            assert!(inside(check(status, pid, in_pidns())), "{status} {pid:?}");
        }
        // In the host's pid namespace (hostPID): the init is the parent.
        let host_pidns = || Own {
            pid: 70,
            in_proc: Ok(70),
            parent: 60,
        };
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
        // A stop is not compared: the init is gone by then.
        assert_eq!(
            check("stopped", Some(60), host_pidns()).unwrap(),
            Stage::Poststop
        );
        assert!(matches!(
            check("running", Some(60), runtime_child()),
            Err(HookError::AutoStage(_))
        ));
        // `/proc` unreadable: only the parent is compared.
        let unread = || Own {
            pid: 70,
            in_proc: Err(std::io::Error::other("no /proc")),
            parent: 50,
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

    /// The test process as a runtime's hook sees itself, and a process that
    /// shares its mount namespace (a spec without one of its own) is not
    /// taken for the container the hook runs in.
    #[test]
    fn the_hooks_own_process_is_read_from_the_kernel() {
        let own = Own::current();
        assert_eq!(own.in_proc.as_ref().ok(), Some(&own.pid));
        assert_eq!(own.parent, nix::unistd::getppid().as_raw() as u32);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let stage = resolve(&state("creating", Some(child.id().into()))).unwrap();
        assert_eq!(stage, Stage::CreateRuntime);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
