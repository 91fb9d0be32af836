//! The devgate plugins running on the node, found by their command lines in
//! `<proc>/<pid>/cmdline`: listed once per doctor run for every check that
//! looks at them.
use std::io::Read;
use std::path::{Path, PathBuf};

use super::host::Roots;

/// The socket `devgate nri` dials when not told otherwise.
const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// Longest command line read per process.
const MAX_CMDLINE_BYTES: u64 = 64 * 1024;

/// Whether two socket paths name one socket, taking `/var/run` for `/run`:
/// a symlink to it on every systemd host (FHS 3.0, 5.13), and containerd's
/// default NRI socket and devgate's are spelled one each way. Lexical: the
/// paths may lie under a root other than this host's.
pub(super) fn same_socket(a: &Path, b: &Path) -> bool {
    fn under_run(p: &Path) -> PathBuf {
        match p.strip_prefix("/var/run") {
            Ok(rest) => Path::new("/run").join(rest),
            Err(_) => p.to_path_buf(),
        }
    }
    a == b || under_run(a) == under_run(b)
}

/// The pid of the plugin the checks are about: `devgate nri` on the socket
/// checked, else a pre-installed one (which the runtime connects itself).
pub(super) fn on_socket(roots: &Roots, running: &[Running]) -> Option<u32> {
    running.iter().find_map(|r| match r {
        Running::Socket { pid, socket, .. } if same_socket(socket, &roots.nri_socket) => Some(*pid),
        Running::Preinstalled { pid } => Some(*pid),
        Running::Socket { .. } => None,
    })
}

/// How a running devgate plugin was found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Running {
    /// `devgate nri` dialing a socket, with its `--config` if given.
    Socket {
        pid: u32,
        socket: PathBuf,
        config: Option<PathBuf>,
    },
    /// Started by the runtime from its plugin directory (`NN-devgate`).
    Preinstalled { pid: u32 },
}

fn classify(pid: u32, cmdline: &[u8]) -> Option<Running> {
    let args: Vec<&str> = cmdline
        .split(|b| *b == 0)
        .filter_map(|a| std::str::from_utf8(a).ok())
        .collect();
    let base = Path::new(args.first()?).file_name()?.to_str()?;
    let preinstalled = base.len() == 10
        && base.as_bytes()[..2].iter().all(u8::is_ascii_digit)
        && base.ends_with("-devgate");
    if preinstalled {
        return Some(Running::Preinstalled { pid });
    }
    if base != "devgate" || args.get(1) != Some(&"nri") {
        return None;
    }
    let flag = |name: &str| {
        let joined = format!("{name}=");
        args.iter()
            .enumerate()
            .rev()
            .find_map(|(i, a)| match a.strip_prefix(&joined) {
                Some(v) => Some(v.to_string()),
                None => (*a == name).then(|| args.get(i + 1).unwrap_or(&"").to_string()),
            })
    };
    Some(Running::Socket {
        pid,
        socket: flag("--socket")
            .unwrap_or_else(|| DEFAULT_SOCKET.to_string())
            .into(),
        config: flag("--config").map(PathBuf::from),
    })
}

pub(super) fn running_plugins(proc_dir: &Path) -> Vec<Running> {
    let Ok(entries) = std::fs::read_dir(proc_dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let mut cmdline = Vec::new();
        let read = std::fs::File::open(entry.path().join("cmdline"))
            .and_then(|f| f.take(MAX_CMDLINE_BYTES).read_to_end(&mut cmdline));
        if read.is_ok() {
            found.extend(classify(pid, &cmdline));
        }
    }
    found.sort_by_key(|r| match r {
        Running::Socket { pid, .. } | Running::Preinstalled { pid } => *pid,
    });
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_command_lines() {
        let table: [(&[u8], Option<Running>); 7] = [
            (
                b"/usr/local/bin/devgate\0nri\0--socket\0/x.sock\0",
                Some(Running::Socket {
                    pid: 7,
                    socket: "/x.sock".into(),
                    config: None,
                }),
            ),
            (
                b"devgate\0nri\0--socket=/y.sock\0--config=/etc/devgate/config.toml\0",
                Some(Running::Socket {
                    pid: 7,
                    socket: "/y.sock".into(),
                    config: Some("/etc/devgate/config.toml".into()),
                }),
            ),
            (
                b"devgate\0nri\0--config\0/a.toml\0--config\0/b.toml\0",
                Some(Running::Socket {
                    pid: 7,
                    socket: DEFAULT_SOCKET.into(),
                    config: Some("/b.toml".into()),
                }),
            ),
            (
                b"devgate\0nri\0",
                Some(Running::Socket {
                    pid: 7,
                    socket: DEFAULT_SOCKET.into(),
                    config: None,
                }),
            ),
            (
                b"/opt/nri/plugins/10-devgate\0",
                Some(Running::Preinstalled { pid: 7 }),
            ),
            (b"devgate\0status\0", None),
            (b"\xff\xfe\0", None),
        ];
        for (cmdline, want) in table {
            assert_eq!(classify(7, cmdline), want, "{cmdline:?}");
        }
    }
}
