//! `devgate ready`: whether the plugin of a state directory runs and a
//! runtime configured it, for a DaemonSet's readiness probe. A plugin
//! process that runs but was never accepted (another socket, NRI off, a
//! config the runtime refuses) serves no pod, and a rollout that counted it
//! available would go on to the next node.
//!
//! The plugin records each Configure in `<state-dir>/runtime.json` with its
//! pid and start time (`RuntimeRecord::plugin`); a record whose process is
//! gone, or was replaced by another under the same pid, is an earlier
//! plugin's. The plugin marks its record when the runtime closes the
//! connection (`disconnected_unix`), until a runtime configures it again. A
//! runtime that died without closing it (the kernel closes a dead process's
//! socket, so only a hung one) is not seen.
use std::path::{Path, PathBuf};

use crate::plugin::features::{FeaturesError, RuntimeRecord};

#[derive(clap::Args, Debug)]
pub struct ReadyArgs {
    /// The plugin's `--state-dir`, where it records each Configure.
    #[arg(long, default_value = "/run/devgate")]
    pub state_dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    #[error("not ready: no runtime configured devgate (no {})", .0.display())]
    NoRecord(PathBuf),
    #[error("not ready: the runtime record names no plugin process (written by an older release, or the plugin could not read its own start time)")]
    NoProcess,
    #[error("not ready: pid {0}, which a runtime configured last, is no longer that plugin")]
    Gone(u32),
    #[error(
        "not ready: cannot tell whether pid {pid}, which a runtime configured last, still runs"
    )]
    Unreadable {
        pid: u32,
        #[source]
        source: crate::hook::liveness::LivenessError,
    },
    #[error("not ready: the config the runtime sent is invalid, so containers that need devgate are refused: {0}")]
    Config(String),
    #[error("not ready: the runtime closed its connection to pid {pid} at unix time {since}, and has not configured it again")]
    Disconnected { pid: u32, since: u64 },
    #[error("not ready")]
    Record(#[from] FeaturesError),
    #[error(transparent)]
    Stdout(#[from] super::StdoutError),
}

/// The running plugin a runtime configured and still holds, from the record
/// in `state_dir`, its process looked for in `proc_dir`.
pub fn configured(state_dir: &Path, proc_dir: &Path) -> Result<RuntimeRecord, ReadyError> {
    let record = recorded_and_running(state_dir, proc_dir)?;
    let pid = record.plugin.as_ref().map_or(0, |p| p.pid);
    match (&record.config_error, record.disconnected_unix) {
        (_, Some(since)) => Err(ReadyError::Disconnected { pid, since }),
        (Some(why), None) => Err(ReadyError::Config(why.clone())),
        (None, None) => Ok(record),
    }
}

/// The record in `state_dir` while the plugin process that wrote it still
/// runs, whether or not a runtime holds it now.
pub fn recorded_and_running(
    state_dir: &Path,
    proc_dir: &Path,
) -> Result<RuntimeRecord, ReadyError> {
    let record = RuntimeRecord::load(state_dir)?
        .ok_or_else(|| ReadyError::NoRecord(RuntimeRecord::path(state_dir)))?;
    writer_runs(&record, proc_dir)?;
    Ok(record)
}

/// Whether the plugin process that wrote `record` still runs, looked for in
/// `proc_dir`: known by its pid and start time, never by a name another
/// process could take.
pub fn writer_runs(record: &RuntimeRecord, proc_dir: &Path) -> Result<(), ReadyError> {
    let plugin = record.plugin.as_ref().ok_or(ReadyError::NoProcess)?;
    match crate::hook::liveness::start_ticks(proc_dir, plugin.pid) {
        Ok(ticks) if ticks == plugin.start_ticks => Ok(()),
        Ok(_) => Err(ReadyError::Gone(plugin.pid)),
        // ESRCH: it exited while its stat was read.
        Err(crate::hook::liveness::LivenessError::Read { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound
                || source.raw_os_error() == Some(libc::ESRCH) =>
        {
            Err(ReadyError::Gone(plugin.pid))
        }
        Err(source) => Err(ReadyError::Unreadable {
            pid: plugin.pid,
            source,
        }),
    }
}

pub fn run(args: ReadyArgs) -> Result<(), ReadyError> {
    let record = configured(&args.state_dir, Path::new("/proc"))?;
    let pid = record.plugin.as_ref().map_or(0, |p| p.pid);
    Ok(super::to_stdout(&format!(
        "ready: devgate nri (pid {pid}) configured by {} {} at unix time {}\n",
        record.runtime, record.version, record.configured_unix
    ))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nri::RuntimeInfo;

    /// A record as this process would write it at Configure.
    fn record(state: &Path) -> RuntimeRecord {
        let info = RuntimeInfo {
            name: "containerd".into(),
            version: "1.7.24".into(),
            ..RuntimeInfo::default()
        };
        let record = RuntimeRecord::new(
            &info,
            Default::default(),
            Default::default(),
            Default::default(),
            Path::new("/"),
        );
        record.save(state).unwrap();
        record
    }

    #[test]
    fn ready_only_while_the_configured_plugin_runs() {
        let dir = tempfile::tempdir().unwrap();
        let proc = Path::new("/proc");
        assert!(matches!(
            configured(dir.path(), proc),
            Err(ReadyError::NoRecord(_))
        ));

        let mut written = record(dir.path());
        let found = configured(dir.path(), proc).unwrap();
        assert_eq!(found.plugin, written.plugin);

        // Another process under the recorded pid: an earlier plugin's record.
        let plugin = written.plugin.as_mut().unwrap();
        plugin.start_ticks += 1;
        let pid = plugin.pid;
        written.save(dir.path()).unwrap();
        assert!(matches!(configured(dir.path(), proc), Err(ReadyError::Gone(p)) if p == pid));

        // No process under the pid; one whose start cannot be read.
        let fake = dir.path().join("proc");
        std::fs::create_dir_all(fake.join(pid.to_string())).unwrap();
        assert!(matches!(configured(dir.path(), &fake), Err(ReadyError::Gone(p)) if p == pid));
        std::fs::write(fake.join(pid.to_string()).join("stat"), "1 (x) S").unwrap();
        let err = configured(dir.path(), &fake).unwrap_err();
        assert!(
            matches!(err, ReadyError::Unreadable { pid: p, .. } if p == pid),
            "{err}"
        );

        written.plugin = None;
        written.save(dir.path()).unwrap();
        assert!(matches!(
            configured(dir.path(), proc),
            Err(ReadyError::NoProcess)
        ));

        // The plugin runs, but with the config the runtime sent invalid.
        let mut invalid = record(dir.path());
        invalid.config_error = Some("config from the runtime: unknown field `gpus`".into());
        invalid.save(dir.path()).unwrap();
        let err = configured(dir.path(), proc).unwrap_err();
        assert!(matches!(err, ReadyError::Config(_)), "{err}");
        assert!(err.to_string().contains("unknown field `gpus`"), "{err}");

        std::fs::write(RuntimeRecord::path(dir.path()), b"{").unwrap();
        let err = configured(dir.path(), proc).unwrap_err();
        assert!(matches!(err, ReadyError::Record(_)), "{err}");
    }

    /// The plugin marks its own record when the runtime closes the
    /// connection: not ready until a runtime configures it again, yet still
    /// the running plugin (whose NVML `devgate clear` must not count). A
    /// successor's record is never marked by its predecessor.
    #[test]
    fn not_ready_once_the_runtime_closed_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let proc = Path::new("/proc");
        assert!(
            !RuntimeRecord::note_disconnected(dir.path()).unwrap(),
            "no record"
        );
        record(dir.path());
        assert!(RuntimeRecord::note_disconnected(dir.path()).unwrap());
        assert!(
            !RuntimeRecord::note_disconnected(dir.path()).unwrap(),
            "once"
        );
        let err = configured(dir.path(), proc).unwrap_err();
        assert!(
            matches!(err, ReadyError::Disconnected { pid, .. } if pid == std::process::id()),
            "{err}"
        );
        assert!(err.to_string().contains("closed its connection"), "{err}");
        assert!(recorded_and_running(dir.path(), proc).is_ok());
        // The next Configure writes a record without the mark.
        record(dir.path());
        assert!(configured(dir.path(), proc).is_ok());

        let mut successor = record(dir.path());
        successor.plugin.as_mut().unwrap().start_ticks += 1;
        successor.save(dir.path()).unwrap();
        assert!(!RuntimeRecord::note_disconnected(dir.path()).unwrap());
        let kept = RuntimeRecord::load(dir.path()).unwrap().unwrap();
        assert_eq!(kept.disconnected_unix, None);
    }

    /// A plugin marking its record and a Configure storing one take the
    /// record's lock: a plugin whose connection closes while a successor
    /// (a rollout) writes its record waits, then finds the successor's and
    /// leaves it as it is, instead of writing its own back over it.
    #[test]
    fn marking_waits_for_a_configure_writing_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let mine = record(dir.path());
        let held = crate::fsutil::lock_exclusive(&dir.path().join("runtime.lock")).unwrap();
        let state = dir.path().to_path_buf();
        let marking = std::thread::spawn(move || RuntimeRecord::note_disconnected(&state));
        std::thread::sleep(std::time::Duration::from_millis(100));
        let read = RuntimeRecord::load(dir.path()).unwrap().unwrap();
        assert_eq!(read.disconnected_unix, None, "marked under the lock");
        let mut successor = mine;
        successor.plugin.as_mut().unwrap().start_ticks += 1;
        successor.save(dir.path()).unwrap();
        drop(held);
        assert!(!marking.join().unwrap().unwrap());
        let kept = RuntimeRecord::load(dir.path()).unwrap().unwrap();
        assert_eq!(kept.plugin, successor.plugin);
        assert_eq!(kept.disconnected_unix, None);
    }
}
