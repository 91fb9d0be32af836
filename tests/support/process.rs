//! Child processes and host leftovers: signals, waits, and the sweep that
//! removes what a crashed runtime leaves behind (shims, runc state, mounts).
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Sends `signal` to `child` and reaps it, escalating to SIGKILL after `grace`.
/// Returns the exit status when the child ended before that (by itself or on
/// `signal`), `None` when it took the SIGKILL.
pub fn stop_child(
    child: &mut Child,
    signal: Signal,
    grace: Duration,
) -> Option<std::process::ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, signal);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = kill(pid, Signal::SIGKILL);
    let _ = child.wait();
    None
}

/// Runs a command to completion; returns its stdout, or the failure text.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("spawn {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// PIDs of the processes whose command line contains `needle`.
pub fn pids_matching(needle: &str) -> Vec<i32> {
    // An unreadable /proc must not read as "no such process": the callers
    // wait for processes to be gone.
    let entries = std::fs::read_dir("/proc").expect("read /proc");
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(needle)
                .then_some(pid)
        })
        .collect()
}

/// Kills every process whose command line contains `needle` (a path private to
/// one test instance, so no other process can match).
pub fn kill_matching(needle: &str) {
    for pid in pids_matching(needle) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Force-deletes the runc containers kept under `runc_root` (one directory per
/// containerd namespace), killing their processes.
pub fn delete_runc_containers(runc_root: &Path) {
    let Ok(namespaces) = std::fs::read_dir(runc_root) else {
        return;
    };
    for ns in namespaces.flatten() {
        let root = ns.path();
        let root = root.to_string_lossy();
        let Ok(ids) = run("runc", &["--root", &root, "list", "-q"]) else {
            continue;
        };
        for id in ids.lines().filter(|l| !l.is_empty()) {
            let _ = run("runc", &["--root", &root, "delete", "--force", id]);
        }
    }
}

/// Detaches every mount at or below `dir`, deepest first, so that the directory
/// can be removed even when a runtime died holding rootfs, shm or netns mounts.
pub fn unmount_below(dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = nix::mount::umount2(point.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal `\NNN`.
fn unescape_mount_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok());
        match (bytes[i], octal.and_then(|d| u8::from_str_radix(d, 8).ok())) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
