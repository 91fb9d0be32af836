//! Running the optional reset command: bounded in time, its stderr's last
//! line kept for the error.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `argv` with nothing on stdin and stdout, up to `timeout`; a failure
/// says how it ended and the last line the command wrote on stderr.
pub(super) fn run(argv: &[String], timeout: Duration) -> Result<(), String> {
    let (program, args) = argv.split_first().ok_or("empty command")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start {program}: {e}"))?;
    // Read while it runs: a command that writes more than a pipe holds
    // would otherwise block on it and look hung.
    let said = stderr_tail(child.stderr.take());
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                // A child of the command may hold the pipe open: wait briefly.
                let said = said
                    .recv_timeout(Duration::from_secs(1))
                    .unwrap_or_default();
                return Err(format!("{program} exited with {status}{said}"));
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                reap(child, program);
                return Err(format!("{program} ran past {timeout:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("wait for {program}: {e}")),
        }
    }
}

/// How long a killed command may take to be gone before it is left to a
/// thread of its own: a reset stuck in the driver sleeps uninterruptibly, and
/// SIGKILL takes effect only when it leaves the kernel, which may be never.
const REAP_WAIT: Duration = Duration::from_secs(5);

fn reap(mut child: std::process::Child, program: &str) {
    let deadline = Instant::now() + REAP_WAIT;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::warn!(
        program,
        pid = child.id(),
        "killed command not gone: left to a reaper thread"
    );
    let _ = std::thread::Builder::new()
        .name("reap".into())
        .spawn(move || child.wait());
}

/// `: <last line of stderr>`, or nothing, once the stream ends; read on a
/// thread of its own, keeping only the last 4 KiB.
fn stderr_tail(stderr: Option<std::process::ChildStderr>) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let Some(mut stderr) = stderr else {
        let _ = tx.send(String::new());
        return rx;
    };
    let read = move || {
        let mut tail: Vec<u8> = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stderr.read(&mut buf) {
            tail.extend_from_slice(&buf[..n]);
            if tail.len() > 4096 {
                tail.drain(..tail.len() - 4096);
            }
        }
        let text = String::from_utf8_lossy(&tail);
        let line = match text.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => format!(": {}", line.trim()),
            None => String::new(),
        };
        let _ = tx.send(line);
    };
    if std::thread::Builder::new()
        .name("stderr".into())
        .spawn(read)
        .is_err()
    {
        // No thread: no line; the command's own pipe then bounds what it writes.
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = tx.send(String::new());
        return rx;
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_report_their_failure() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let secs = Duration::from_secs(5);
        run(&argv(&["true"]), secs).unwrap();
        let err = run(&argv(&["sh", "-c", "echo gpu busy >&2; exit 3"]), secs).unwrap_err();
        assert_eq!(err, "sh exited with exit status: 3: gpu busy");
        let err = run(&argv(&["sleep", "5"]), Duration::from_millis(50)).unwrap_err();
        assert_eq!(err, "sleep ran past 50ms");
        // More than a pipe holds on stderr: read as it comes, the last line kept.
        let noisy =
            "head -c 200000 /dev/zero | tr '\\0' x >&2; printf '\\nreset refused\\n' >&2; exit 3";
        let err = run(&argv(&["sh", "-c", noisy]), secs).unwrap_err();
        assert_eq!(err, "sh exited with exit status: 3: reset refused");
    }
}
