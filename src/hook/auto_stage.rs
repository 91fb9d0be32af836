//! Stage `auto`, the hooks.d file's (OCI hooks carry no stage of their own):
//! the container's status tells a creation from a stop, but not which of a
//! creation's stages is running. createRuntime and prestart hooks run in the
//! runtime's namespaces; createContainer and startContainer hooks run in the
//! container's, and are passed the same status (runtime-spec `config.md`,
//! "POSIX-platform Hooks"; runc passes `creating`, crun `created`). There the
//! state's pid is the init's as its own pid namespace numbers it (runc's is
//! `getpid()` in the container: 1), so a createRuntime run would take the
//! host's pid 1 (or whatever holds that number) for the container: pin it,
//! compare its network with the host's, make nodes through its root and move
//! VFs into its namespace. So a creation's run inside the container is
//! refused, with the fix in the error: an operator who lists the hook at
//! createContainer or startContainer too gets a container that fails to
//! start, not one set up against another process.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{HookError, Stage, State};

/// The stage a run of `devgate-hook auto` takes for `state`. `proc_root` is
/// the host's `/proc`, where the container init's namespace is looked up.
pub(crate) fn resolve(state: &State, proc_root: &Path) -> Result<Stage, HookError> {
    resolve_as(state, proc_root, Own::current())
}

/// The hook's own pid, as its pid namespace and as `/proc` number it.
#[derive(Debug)]
struct Own {
    pid: u32,
    in_proc: std::io::Result<u32>,
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
        }
    }
}

fn resolve_as(state: &State, proc_root: &Path, own: Own) -> Result<Stage, HookError> {
    let stage = Stage::from_status(&state.status)?;
    if stage != Stage::CreateRuntime {
        return Ok(stage);
    }
    // No pid: the stage's own check refuses it with its message.
    let Some(pid) = state.pid() else {
        return Ok(stage);
    };
    match inside_container(proc_root, pid, own) {
        Ok(false) => Ok(stage),
        Ok(true) => Err(HookError::AutoInContainer {
            status: state.status.clone(),
        }),
        // Told apart only to catch a misconfiguration: a process whose
        // namespaces cannot be read fails the run's later steps anyway.
        Err(e) => {
            tracing::warn!(pid, error = %e, "stage auto: namespaces not compared with the container's; taken as createRuntime");
            Ok(stage)
        }
    }
}

/// Whether the calling thread runs in the container's namespaces: in a pid
/// namespace other than the one `/proc` numbers (the container's own), or in
/// the mount namespace of `pid` (a container in the host's pid namespace,
/// whose state names its init as the host does).
fn inside_container(proc_root: &Path, pid: u32, own: Own) -> std::io::Result<bool> {
    if own.in_proc? != own.pid {
        return Ok(true);
    }
    let mine = std::fs::metadata("/proc/thread-self/ns/mnt")?;
    let init = std::fs::metadata(proc_root.join(pid.to_string()).join("ns/mnt"))?;
    Ok(mine.dev() == init.dev() && mine.ino() == init.ino())
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

    /// The hook in the runtime's pid namespace, as `/proc` numbers it.
    fn host() -> Own {
        let pid = std::process::id();
        Own {
            pid,
            in_proc: Ok(pid),
        }
    }

    /// The init's mount namespace against the hook's: a thread unshared into
    /// one of its own stands in for a container's init, the test's own
    /// thread for a hook in a container sharing the host's pid namespace.
    #[test]
    fn a_creation_run_inside_the_containers_mount_namespace_is_refused() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "a mount namespace of its own needs root (CI runs as root)"
        );
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        std::fs::create_dir(&proc_root).unwrap();
        let link = |pid: u32, tid: i32| {
            let target = format!("/proc/self/task/{tid}");
            std::os::unix::fs::symlink(target, proc_root.join(pid.to_string())).unwrap()
        };
        link(7, nix::unistd::gettid().as_raw());
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let apart = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare mount ns");
            tid_tx.send(nix::unistd::gettid().as_raw()).unwrap();
            let _ = done_rx.recv();
        });
        link(8, tid_rx.recv().unwrap());

        let e = resolve_as(&state("creating", Some(7)), &proc_root, host()).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, HookError::AutoInContainer { .. }), "{text}");
        assert!(text.contains("createContainer or startContainer"), "{text}");
        assert!(
            text.contains("createRuntime (or prestart) and poststop"),
            "{text}"
        );
        for status in ["creating", "created"] {
            let stage = resolve(&state(status, Some(8)), &proc_root).unwrap();
            assert_eq!(stage, Stage::CreateRuntime, "{status}");
        }
        // A stop is not compared: the init is gone by then.
        let stage = resolve_as(&state("stopped", Some(7)), &proc_root, host()).unwrap();
        assert_eq!(stage, Stage::Poststop);
        // Nothing to compare with: the stage's own checks judge.
        for pid in [None, Some(9)] {
            let stage = resolve_as(&state("creating", pid), &proc_root, host()).unwrap();
            assert_eq!(stage, Stage::CreateRuntime, "{pid:?}");
        }
        assert!(matches!(
            resolve_as(&state("running", Some(8)), &proc_root, host()),
            Err(HookError::AutoStage(_))
        ));
        done_tx.send(()).unwrap();
        apart.join().unwrap();
    }

    /// In the container's own pid namespace the state's pid is the init's
    /// number there (1), which `/proc` gives to another process: the hook's
    /// own pid, numbered differently by `/proc`, tells it is inside, whatever
    /// that pid leads to.
    #[test]
    fn a_creation_run_in_a_pid_namespace_of_its_own_is_refused() {
        let proc_root = Path::new("/proc");
        let inside = || Own {
            pid: 1,
            in_proc: Ok(std::process::id()),
        };
        for pid in [1, std::process::id(), u32::MAX] {
            let e = resolve_as(&state("creating", Some(pid.into())), proc_root, inside());
            assert!(
                matches!(e, Err(HookError::AutoInContainer { .. })),
                "{pid}: {e:?}"
            );
        }
        // `/proc` unreadable: taken as createRuntime, whose steps judge.
        let unread = Own {
            pid: 1,
            in_proc: Err(std::io::Error::other("no /proc")),
        };
        let stage = resolve_as(&state("creating", Some(1)), proc_root, unread).unwrap();
        assert_eq!(stage, Stage::CreateRuntime);
        // The test's own process, as the hook at createRuntime sees itself.
        let own = Own::current();
        assert_eq!(own.in_proc.unwrap(), own.pid);
    }
}
