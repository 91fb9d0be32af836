//! What `devgate doctor` touches on a node, behind roots and one narrow trait so
//! that every check runs on a fake tree in tests and on the node for real.
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Largest file a check reads (configs, hooks.d files, sysfs attributes).
pub const MAX_READ_BYTES: u64 = 1024 * 1024;
/// Largest `containerd --version` output kept.
const MAX_VERSION_BYTES: u64 = 4096;

/// The directories and sockets the checks look at, as parameters.
#[derive(Debug, Clone)]
pub struct Roots {
    /// Holds the host's `sys/`, `proc/` (driver files), `dev/` and `usr/`.
    pub host_root: PathBuf,
    /// The host's `/etc` (containerd, containers/oci/hooks.d, modprobe.d).
    pub etc_root: PathBuf,
    /// Process directories (`<pid>/cmdline`): `/proc`, or a fake tree.
    pub proc_dir: PathBuf,
    /// containerd's config file.
    pub containerd_config: PathBuf,
    /// devgate's config file as given; `None`: the running plugin's, else
    /// the default path.
    pub config: Option<PathBuf>,
    /// Claims and saved device state (`devgate nri --state-dir`).
    pub state_dir: PathBuf,
    /// The runtime's NRI socket.
    pub nri_socket: PathBuf,
}

impl Roots {
    /// The root directory of process `pid` (`<proc>/<pid>/root`): the files
    /// as that process, a plugin in a container perhaps, sees them.
    pub fn process_root(&self, pid: u32) -> PathBuf {
        self.proc_dir.join(pid.to_string()).join("root")
    }

    /// `host_path` (absolute, as the node sees it) below the host root, or below
    /// the /etc root for paths under /etc.
    pub fn host_path(&self, host_path: &Path) -> PathBuf {
        let rel = host_path.strip_prefix("/").unwrap_or(host_path);
        match rel.strip_prefix("etc") {
            Ok(under_etc) => self.etc_root.join(under_etc),
            Err(_) => self.host_root.join(rel),
        }
    }
}

/// The OS touches that a directory tree cannot stand in for.
pub trait Host {
    /// The first line `containerd --version` prints.
    fn containerd_version(&self) -> Result<String, String>;
    /// Connects to a unix socket and closes the connection.
    fn connect(&self, socket: &Path) -> std::io::Result<()>;
    /// `(major, minor)` when `path` is a char device, `None` for anything else.
    fn char_device(&self, path: &Path) -> std::io::Result<Option<(u32, u32)>>;
    /// The unit of proc(5) process start times (`sysconf(_SC_CLK_TCK)`).
    fn clock_ticks_per_sec(&self) -> u64;
    /// A variable of doctor's own environment.
    fn env(&self, key: &str) -> Option<String>;
    /// Doctor's own service account directory (where doctor runs in a pod).
    fn service_account_dir(&self) -> PathBuf;
}

/// The node itself.
pub struct RealHost {
    /// The containerd binary, found through PATH when not absolute.
    containerd: PathBuf,
    /// `containerd --version`, run once per doctor run: several checks ask.
    version: std::cell::OnceCell<Result<String, String>>,
}

impl RealHost {
    pub fn new(containerd: PathBuf) -> RealHost {
        RealHost {
            containerd,
            version: std::cell::OnceCell::new(),
        }
    }

    fn run_containerd_version(&self) -> Result<String, String> {
        let child = Command::new(&self.containerd)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("run {} --version: {e}", self.containerd.display()))?;
        let output = child
            .wait_with_output()
            .map_err(|e| format!("run {} --version: {e}", self.containerd.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{} --version exited with {}",
                self.containerd.display(),
                output.status
            ));
        }
        let mut text = String::new();
        let _ = output
            .stdout
            .take(MAX_VERSION_BYTES)
            .read_to_string(&mut text);
        Ok(text.lines().next().unwrap_or_default().to_string())
    }
}

impl Host for RealHost {
    fn containerd_version(&self) -> Result<String, String> {
        self.version
            .get_or_init(|| self.run_containerd_version())
            .clone()
    }

    fn connect(&self, socket: &Path) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::connect(socket).map(drop)
    }

    fn env(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }

    fn service_account_dir(&self) -> PathBuf {
        PathBuf::from(crate::grant::SERVICE_ACCOUNT_DIR)
    }

    fn char_device(&self, path: &Path) -> std::io::Result<Option<(u32, u32)>> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path)?;
        if !meta.file_type().is_char_device() {
            return Ok(None);
        }
        let rdev = meta.rdev();
        Ok(Some((libc::major(rdev), libc::minor(rdev))))
    }

    fn clock_ticks_per_sec(&self) -> u64 {
        // SAFETY: sysconf reads a constant and touches no memory of ours.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        // USER_HZ is 100 on every Linux architecture; sysconf fails only when
        // the name is unknown.
        u64::try_from(hz).ok().filter(|&v| v > 0).unwrap_or(100)
    }
}

/// Whether `path` is a regular file some execute bit allows running.
pub fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Reads at most [`MAX_READ_BYTES`] of a text file; longer files are an error.
pub fn read_bounded(path: &Path) -> std::io::Result<String> {
    crate::fsutil::read_text_bounded(path, MAX_READ_BYTES).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_host_touches() {
        let dir = tempfile::tempdir().unwrap();
        let containerd = dir.path().join("containerd");
        let host = RealHost::new(containerd.clone());
        assert_eq!(
            host.char_device(Path::new("/dev/null")).unwrap(),
            Some((1, 3))
        );
        assert_eq!(host.char_device(dir.path()).unwrap(), None);

        let sock = dir.path().join("s.sock");
        assert!(host.connect(&sock).is_err());
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        host.connect(&sock).unwrap();

        assert!(host.containerd_version().is_err());
        // Each run counts itself in a file beside the binary.
        let script = "#!/bin/sh\necho x >> \"$0.runs\"\necho 'containerd github.com/containerd/containerd 1.7.24~ds1 x'\n";
        std::fs::write(&containerd, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&containerd, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The failure is kept for the run: a binary installed meanwhile is not asked.
        assert!(host.containerd_version().is_err());
        let host = RealHost::new(containerd.clone());
        for _ in 0..3 {
            assert_eq!(
                host.containerd_version().unwrap(),
                "containerd github.com/containerd/containerd 1.7.24~ds1 x"
            );
        }
        let runs = std::fs::read_to_string(dir.path().join("containerd.runs")).unwrap();
        assert_eq!(runs.lines().count(), 1, "run once per doctor run");
    }

    #[test]
    fn host_paths_map_under_their_roots() {
        let roots = Roots {
            host_root: "/h".into(),
            etc_root: "/e".into(),
            proc_dir: "/proc".into(),
            containerd_config: "/e/containerd/config.toml".into(),
            config: Some("/e/devgate/config.toml".into()),
            state_dir: "/run/devgate".into(),
            nri_socket: "/var/run/nri/nri.sock".into(),
        };
        assert_eq!(
            roots.host_path(Path::new("/usr/bin/x")),
            Path::new("/h/usr/bin/x")
        );
        assert_eq!(roots.host_path(Path::new("/etc/a/b")), Path::new("/e/a/b"));
        assert_eq!(roots.host_path(Path::new("/etcx")), Path::new("/h/etcx"));
    }

    #[test]
    fn bounded_reads_refuse_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'a'; MAX_READ_BYTES as usize + 1]).unwrap();
        assert!(read_bounded(&big).is_err());
    }
}
