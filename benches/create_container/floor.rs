//! The floor processes: what waking another process, receiving a message and
//! answering it cost on this machine, next to the plugin's figures.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use crate::proc::{cpu_ns, ms_each};

/// Set in the environment of the floor processes this bench starts: `-` for a
/// bare echo, else the directory of the ledger-like file it replaces.
pub const ECHO_ENV: &str = "DEVGATE_BENCH_ECHO";

/// A process (this bench binary again) that answers every message with 24 bytes,
/// after replacing a file under a lock when given a directory, and does nothing
/// else: the cost, on this machine, of waking another process, receiving and
/// sending (and committing). Another process, as the plugin is: waking a thread
/// of the pinging process itself would skip the address-space switch.
pub struct Echo {
    stream: UnixStream,
    child: std::process::Child,
    /// About the size containerd 1.7 sends for the benchmark pod's CreateContainer.
    pub request: Vec<u8>,
    pub cpu_ns: u64,
    pub pings: u64,
}

impl Echo {
    pub fn start(commit_in: Option<&std::path::Path>) -> Echo {
        let (stream, peer) = UnixStream::pair().expect("socketpair");
        let mode = commit_in.map_or("-".into(), |d| d.display().to_string());
        let child = std::process::Command::new(std::env::current_exe().expect("bench binary"))
            .env(ECHO_ENV, mode)
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(peer)))
            .spawn()
            .expect("spawn the floor process");
        Echo {
            stream,
            child,
            request: vec![0x5a; 2700],
            cpu_ns: 0,
            pings: 0,
        }
    }

    pub fn ping(&mut self) {
        let before = cpu_ns(self.child.id());
        let mut reply = [0u8; 24];
        self.stream.write_all(&self.request).expect("echo send");
        self.stream.read_exact(&mut reply).expect("echo reply");
        self.cpu_ns += cpu_ns(self.child.id()) - before;
        self.pings += 1;
    }

    /// Where the figures stand now, for [`Echo::since`].
    pub fn mark(&self) -> (u64, u64) {
        (self.cpu_ns, self.pings)
    }

    /// CPU per ping since `mark`, in ms.
    pub fn since(&self, (cpu_ns, pings): (u64, u64)) -> f64 {
        ms_each(self.cpu_ns - cpu_ns, (self.pings - pings).max(1) as usize)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The floor process: serves its stdin (a socket) until it closes.
pub fn serve_echo(mode: &str) -> ! {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: the parent made descriptor 0 a socket for this process alone.
    let mut peer = unsafe { UnixStream::from_raw_fd(0) };
    let commit = (mode != "-").then(|| {
        let dir = std::path::PathBuf::from(mode);
        let lock = std::fs::File::create(dir.join("lock")).expect("lock file");
        let dir_file = std::fs::File::open(&dir).expect("open dir");
        let durability = devgate::fsutil::Durability::of_dir(&dir_file);
        (dir, dir_file, lock, durability)
    });
    let document = vec![b'x'; 3 << 10];
    let mut buf = vec![0u8; 64 << 10];
    while matches!(peer.read(&mut buf), Ok(n) if n > 0) {
        if let Some((path, dir, lock, durability)) = &commit {
            // SAFETY: flock on a descriptor this process owns.
            unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
            devgate::fsutil::replace_in(dir, path, "ledger.json", &document, *durability)
                .expect("replace");
            // SAFETY: as above.
            unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_UN) };
        }
        if peer.write_all(&[0u8; 24]).is_err() {
            break;
        }
    }
    std::process::exit(0)
}

/// The three floor processes of a run.
pub struct Floors {
    /// Pinged after each creation: receives and answers.
    pub echo: Echo,
    /// Pinged after each creation: also replaces a ledger-like file on tmpfs.
    pub committer: Echo,
    /// Pinged right before each creation, in the sets without the plugin.
    pub at_request: Echo,
    _tmpfs: tempfile::TempDir,
}

impl Floors {
    pub fn start() -> Floors {
        let tmpfs = tempfile::tempdir_in("/dev/shm").expect("tmpfs dir");
        Floors {
            echo: Echo::start(None),
            committer: Echo::start(Some(tmpfs.path())),
            at_request: Echo::start(None),
            _tmpfs: tmpfs,
        }
    }

    pub fn print(&self) {
        let floor = |e: &Echo| ms_each(e.cpu_ns, e.pings.max(1) as usize);
        println!(
            "floor: {:.3} ms per message for a process that only receives {} bytes and answers; \
             {:.3} ms with one crash-safe 3 KiB ledger write (pinged after each creation)",
            floor(&self.echo),
            self.echo.request.len(),
            floor(&self.committer),
        );
        // Where the runtime would wake the plugin: with a pod per creation,
        // right after the sandbox's start.
        println!(
            "floor at the request: {:.3} ms for the same process pinged just before each \
             CreateContainer, in the sets without the plugin",
            floor(&self.at_request),
        );
    }
}
