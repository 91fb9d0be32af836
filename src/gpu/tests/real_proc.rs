//! Teardown against real processes and a real cgroup. The fixture's host root declares
//! `nvidia` as major 1 and the GPU as minor 7, so `/dev/full` (1:7) stands in for
//! `/dev/nvidia7`: openable without a driver, and unlike `/dev/null` (1:3) held by no
//! daemon. These tests need root (cgroup creation) and fail without it.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::GpuConfig;
use crate::fixture::HostRootBuilder;
use crate::gpu::host::{Host, ProcHost};
use crate::gpu::nvml::fake::FakeNvml;
use crate::gpu::GpuTeardown;
use crate::inventory::Inventory;
use crate::ledger::{Claim, DeviceId, Ledger, PodRef, Share};

/// The tests share /dev/full: one at a time.
pub(in crate::gpu) static SERIAL: Mutex<()> = Mutex::new(());
const FULL: (u32, u32) = (1, 7);

pub(super) fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it creates a cgroup and moves processes into it"
    );
}

/// A scratch cgroup, removed with whatever is left in it. cgroup v2 where mounted
/// (pure or the hybrid `unified` mount), else the v1 pids controller.
pub(super) struct TestCgroup {
    dir: PathBuf,
    /// The path as `/proc/<pid>/cgroup` shows it.
    pub path: String,
}

impl TestCgroup {
    pub fn create() -> TestCgroup {
        let root = Path::new("/sys/fs/cgroup");
        let base = if root.join("cgroup.controllers").exists() {
            root.to_path_buf()
        } else if root.join("unified/cgroup.procs").exists() {
            root.join("unified")
        } else {
            root.join("pids")
        };
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("devgate-test-{}-{nanos}", std::process::id());
        let dir = base.join(&name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        TestCgroup {
            dir,
            path: format!("/{name}"),
        }
    }

    pub fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// A cgroup below this one; drop it before its parent.
    pub fn child(&self, name: &str) -> TestCgroup {
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        TestCgroup {
            dir,
            path: format!("{}/{name}", self.path),
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A child holding the stand-in GPU open on fd 3, killed when dropped.
pub(super) struct Holder(Child);

impl Holder {
    pub fn spawn(ignore_term: bool) -> Holder {
        let trap = if ignore_term { "trap '' TERM; " } else { "" };
        Holder::run(&format!("{trap}exec 3</dev/full; exec sleep 600"))
    }

    /// `sh -c script`, which opens the stand-in GPU on fd 3 itself.
    pub fn run(script: &str) -> Holder {
        let child = Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Holder(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Waits until the fd is open (the trap, if any, is set before it).
    pub fn wait_open(&self) {
        let host = ProcHost::new(Path::new("/proc"));
        let want = libc::makedev(FULL.0, FULL.1);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let mut devs = Vec::new();
            if host.open_char_devices(self.pid(), None, &mut devs).is_ok() && devs.contains(&want) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("pid {} never opened /dev/full", self.pid());
    }

    pub fn signal_that_ended_it(&mut self) -> Option<i32> {
        self.0.try_wait().unwrap().and_then(|s| s.signal())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The fixture's one GPU at 1:7, discovered from the written host root.
fn inventory(dir: &Path) -> Inventory {
    let fixture = HostRootBuilder::hgx()
        .gpus(1)
        .nics(0)
        .intel_rdma(false)
        .gpu_minors(vec![FULL.1])
        .nvidia_major(FULL.0)
        .build(&dir.join("host"))
        .unwrap();
    let inv = crate::inventory::discover(fixture.root());
    assert_eq!(inv.nvidia_majors.nvidia, Some(FULL.0), "{:?}", inv.warnings);
    assert_eq!(inv.gpus.len(), 1);
    assert_eq!(inv.gpus[0].minor, FULL.1);
    inv
}

pub(super) struct Setup {
    dir: tempfile::TempDir,
    pub ledger: Ledger,
    pub nvml: Arc<FakeNvml>,
    pub teardown: GpuTeardown,
    pub uuid: String,
}

/// The ledger and teardown over the fixture's GPU, nothing claimed.
pub(super) fn unclaimed() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let inv = inventory(dir.path());
    let uuid = inv.gpus[0].uuid.clone();
    let ledger = Ledger::open(&dir.path().join("ledger")).unwrap();
    let config = GpuConfig {
        health_dir: dir.path().join("health"),
        kill_grace_ms: 300,
        kill_wait_ms: 2000,
        ..GpuConfig::default()
    };
    let nvml = Arc::new(FakeNvml::default());
    let host = Arc::new(ProcHost::new(Path::new("/proc")));
    let teardown = GpuTeardown::new(inv, config, host, nvml.clone(), Arc::new(ledger.clone()));
    Setup {
        dir,
        ledger,
        nvml,
        teardown,
        uuid,
    }
}

/// Pod `sb-real` holds the GPU whole, its processes in `cgroup`.
pub(super) fn setup(cgroup: &TestCgroup) -> Setup {
    let s = unclaimed();
    let pod = PodRef {
        sandbox_id: "sb-real".into(),
        namespace: "ns".into(),
        name: "real".into(),
        uid: String::new(),
    };
    let claim = Claim {
        device: DeviceId::Gpu(s.uuid.clone()),
        share: Share::Exclusive,
        pf: None,
    };
    s.ledger.claim(&pod, &[claim]).unwrap();
    s.teardown
        .set_pod_cgroups("sb-real", &[cgroup.path.as_str()]);
    s
}

#[test]
fn real_pod_processes_end_and_an_outsider_quarantines_the_gpu() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create();
    let s = setup(&cgroup);
    let mut polite = Holder::spawn(false);
    let mut stubborn = Holder::spawn(true);
    let mut outsider = Holder::spawn(false);
    cgroup.add(polite.pid());
    cgroup.add(stubborn.pid());
    for h in [&polite, &stubborn, &outsider] {
        h.wait_open();
    }

    let started = Instant::now();
    let out = s.ledger.release_pod("sb-real", &s.teardown).unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "grace period honoured"
    );
    assert_eq!(polite.signal_that_ended_it(), Some(libc::SIGTERM));
    assert_eq!(stubborn.signal_that_ended_it(), Some(libc::SIGKILL));
    assert_eq!(
        outsider.signal_that_ended_it(),
        None,
        "outsiders are never killed"
    );
    let reason = &out.failed[0].reason;
    let want = format!("gpu {} is still open in pids [{}]", s.uuid, outsider.pid());
    assert!(reason.contains(&want), "{reason}");
    assert!(s.nvml.calls().is_empty(), "a gpu in use is not reset");

    // Quarantine survives a restart: a new ledger on the same directory still has it.
    let reopened = Ledger::open(&s.dir.path().join("ledger")).unwrap();
    let device = format!("gpu {}", s.uuid);
    assert!(reopened.snapshot().unwrap().devices[&device]
        .quarantine
        .is_some());

    drop(outsider);
    let gone = s.ledger.stale_pods(&Default::default()).unwrap();
    let out = s.ledger.release_pods(&gone, &s.teardown).unwrap();
    assert_eq!(
        (out.pods.len(), out.failed.len()),
        (1, 0),
        "{:?}",
        out.failed
    );
    assert_eq!(
        s.teardown.retry_quarantined(&reopened).unwrap(),
        vec![s.uuid.clone()]
    );
    assert!(reopened.snapshot().unwrap().devices.is_empty());
}

#[test]
fn real_pod_processes_end_and_the_gpu_is_reset() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create();
    let s = setup(&cgroup);
    let mut holders: Vec<Holder> = (0..3).map(|_| Holder::spawn(false)).collect();
    for h in &holders {
        cgroup.add(h.pid());
        h.wait_open();
    }
    let out = s.ledger.release_pod("sb-real", &s.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    for h in &mut holders {
        assert_eq!(h.signal_that_ended_it(), Some(libc::SIGTERM));
    }
    assert!(!s.nvml.calls().is_empty(), "the released gpu is reset");
    assert!(s.ledger.snapshot().unwrap().devices.is_empty());
}

/// A process whose main thread exited while another thread holds the GPU
/// open: `/proc/<pid>/fd` lists nothing then (the leader has no file table),
/// so the scan reads the live threads' `task/<tid>/fd`.
#[test]
fn a_holder_whose_main_thread_exited_is_still_seen() {
    extern "C" fn hold(_: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: plain syscalls in the child's only other thread.
        unsafe {
            libc::open(c"/dev/full".as_ptr(), libc::O_RDONLY);
            loop {
                libc::pause();
            }
        }
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: the child only calls pthread_create and exit(2), and never
    // returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            // Nothing of the other tests' (locks, pipes) stays open in here.
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            let mut t: libc::pthread_t = 0;
            if libc::pthread_create(&mut t, std::ptr::null(), hold, std::ptr::null_mut()) != 0 {
                libc::_exit(1);
            }
            // exit(2), not exit_group(2) nor pthread_exit (which unwinds
            // through the harness's frames): this thread alone ends.
            libc::syscall(libc::SYS_exit, 0);
        }
    }
    let pid = pid as u32;
    let host = ProcHost::new(Path::new("/proc"));
    let want = libc::makedev(FULL.0, FULL.1);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = false;
    while Instant::now() < deadline && !seen {
        let leader_gone = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        });
        let mut devs = Vec::new();
        seen = leader_gone
            && host.open_char_devices(pid, None, &mut devs).is_ok()
            && devs.contains(&want);
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: the child forked above.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
        libc::waitpid(pid as i32, std::ptr::null_mut(), 0);
    }
    assert!(seen, "the fd held by a thread of pid {pid} was not seen");
}

/// A forked copy of this process, killed when dropped.
struct Copy(nix::unistd::Pid);

impl Drop for Copy {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(self.0, None);
    }
}

/// Another devgate process (here a forked copy of this one: the same
/// executable) holding the GPU outside the pod, as a hook's NVML or a
/// `devgate status` does, is no user of it; a shell holding it is.
#[test]
fn another_process_of_this_program_is_no_user() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cgroup = TestCgroup::create();
    let s = setup(&cgroup);
    let full = std::fs::File::open("/dev/full").unwrap();
    // SAFETY: the child calls only pause(2), async-signal-safe, until killed.
    let copy = match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => loop {
            unsafe { libc::pause() };
        },
        nix::unistd::ForkResult::Parent { child } => Copy(child),
    };
    drop(full);
    let shell = Holder::spawn(false);
    shell.wait_open();
    let host = ProcHost::new(Path::new("/proc"));
    assert!(host.runs_this_program(copy.0.as_raw() as u32));
    assert!(!host.runs_this_program(shell.pid()));
    drop(shell);
    let out = s.ledger.release_pod("sb-real", &s.teardown).unwrap();
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    let mut devs = Vec::new();
    host.open_char_devices(copy.0.as_raw() as u32, None, &mut devs)
        .unwrap();
    assert!(devs.contains(&libc::makedev(FULL.0, FULL.1)), "still held");
}
