//! `devgate-hook` exec time and memory, as runc sees it: fork, exec, state on
//! stdin, wait. Needs root (veth stand-ins for 4 VFs, a process in a fresh netns).
//!
//! - createRuntime attaching 4 VFs: target median < 5 ms;
//! - poststop with nothing to do: target median < 1 ms;
//! - poststop detaching the 4 VFs (reported, no target);
//! - peak RSS of the hook: target < 4 MiB. A child's `ru_maxrss` starts at its
//!   parent's RSS when it execs (fs/exec.c `exec_mmap` keeps the old mm's high
//!   water mark, and posix_spawn's old mm is the parent's), so it is read from
//!   `/usr/bin/time -f %M` (GNU time: wait4 rusage of a child forked from a
//!   ~1 MiB parent). Without GNU time the figure from this harness is printed
//!   as an upper bound.
//!
//! For scale it also reports the exec of `/bin/true` through the same harness
//! and the kernel's own time for the netns moves (move in and back through the
//! library's rtnetlink code, in process), which no hook can go below. The state
//! directory is a tmpfs, as `/run` is on a systemd host.
//!
//! `cargo bench --bench hook_exec` runs 200 rounds and prints percentiles
//! (`-- --quick`: 20); without `--bench` (`cargo test --benches`) it is a
//! 3-round smoke run. It measures the hook cargo built for it (dynamically
//! linked), or the one `DEVGATE_HOOK_BIN` names: what nodes run is
//! `install/build.sh`'s static build, `target/dist/devgate-hook`.
#[path = "../tests/hook_netns/net.rs"]
mod net;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use net::{action, link, require_root, state, vouch, In, Sleeper, Veth};

const VFS: usize = 4;

struct Run {
    wall: Duration,
    /// User + system CPU time of the child.
    cpu: Duration,
    max_rss_kib: i64,
}

fn tv(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
}

/// A tmpfs mounted on a temp dir for the run.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn new() -> Tmpfs {
        let dir = tempfile::tempdir().expect("tempdir");
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=16m,mode=0700"),
        )
        .expect("mount tmpfs");
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount(self.0.path());
    }
}

/// The hook under measurement.
fn hook_bin() -> String {
    std::env::var("DEVGATE_HOOK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_devgate-hook").into())
}

/// Runs the hook once and reads its own rusage (not the harness's other children).
fn exec(stage: &str, input: &str, state_dir: &Path) -> Run {
    exec_program(&hook_bin(), stage, input, state_dir)
}

// The child is reaped by wait4, which std's `Child::wait` cannot replace: it
// drops the rusage.
#[allow(clippy::zombie_processes)]
fn exec_program(program: &str, stage: &str, input: &str, state_dir: &Path) -> Run {
    let start = Instant::now();
    let mut child = Command::new(program)
        .arg(stage)
        .arg("--state-dir")
        .arg(state_dir)
        .env("DEVGATE_CONFIG", "/nonexistent/devgate.toml")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn devgate-hook");
    let _ = child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes());
    let mut status = 0;
    // SAFETY: plain out-parameters; the pid is our unreaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    assert_eq!(got, pid, "wait4");
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let log = std::fs::read_to_string(state_dir.join("hook.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        panic!("{program} {stage} failed (status {status:#x}); log: {tail:#?}");
    }
    Run {
        wall,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss,
    }
}

fn report(name: &str, runs: &[Run], target: Option<Duration>) {
    let mut t: Vec<Duration> = runs.iter().map(|r| r.wall).collect();
    t.sort();
    let pct = |p: usize| t[(t.len() - 1) * p / 100];
    let rss = runs.iter().map(|r| r.max_rss_kib).max().unwrap_or(0);
    let mut cpu: Vec<Duration> = runs.iter().map(|r| r.cpu).collect();
    cpu.sort();
    let verdict = match target {
        Some(limit) if pct(50) <= limit => format!("(target {limit:?}: met)"),
        Some(limit) => format!("(target {limit:?}: MISSED)"),
        None => String::new(),
    };
    println!(
        "{name:<28} n={:<4} median {:>9.3?}  p90 {:>9.3?}  max {:>9.3?}  cpu median {:>9.3?}  max rss {rss} KiB {verdict}",
        t.len(),
        pct(50),
        pct(90),
        pct(100),
        cpu[cpu.len() / 2]
    );
}

fn main() {
    require_root();
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let rounds = match (has("--bench"), has("--quick")) {
        (true, false) => 200,
        (true, true) => 20,
        _ => 3,
    };
    let hook = hook_bin();
    match devgate::elf::linking(Path::new(&hook)) {
        Ok(how) => println!("devgate-hook: {hook} ({how:?})"),
        Err(e) => panic!("devgate-hook: {e}"),
    }
    let pod = Sleeper::new();
    let veths: Vec<Veth> = (0..VFS)
        .map(|i| {
            Veth::new(
                &format!("dgb{i}v"),
                &format!("dgb{i}p"),
                &format!("02:00:00:0c:00:0{i}"),
            )
        })
        .collect();
    let nets: Vec<_> = veths
        .iter()
        .enumerate()
        .map(|(i, v)| {
            action(
                v,
                &format!("0000:ed:00.{i}"),
                &format!("net{}", i + 1),
                &format!("02:00:00:0d:00:0{i}"),
                9000,
            )
        })
        .collect();
    let tmpfs = Tmpfs::new();
    let dir = &tmpfs.0;
    let attach = state("bench", "creating", Some(pod.pid()), &nets);
    let detach = state("bench", "stopped", None, &[]);
    let idle = state("bench-idle", "stopped", None, &[]);
    let (mut attaches, mut detaches, mut idles) = (Vec::new(), Vec::new(), Vec::new());
    let mut truths = Vec::new();
    let mut moves = Vec::new();
    for round in 0..rounds + 2 {
        // What the plugin records at each creation: the hook acts only on a
        // vouched annotation, and poststop gives the pod's network up.
        vouch(&attach, dir.path());
        let a = exec("createRuntime", &attach, dir.path());
        assert!(
            link(In::Pid(pod.pid()), "net4").is_some(),
            "net4 missing after attach"
        );
        let d = exec("poststop", &detach, dir.path());
        let n = exec("poststop", &idle, dir.path());
        let t = exec_program("/bin/true", "poststop", &idle, dir.path());
        let m = kernel_moves(&veths, pod.pid());
        // The first two rounds warm the page cache and the kernel's slabs.
        if round >= 2 {
            attaches.push(a);
            detaches.push(d);
            idles.push(n);
            truths.push(t);
            moves.push(m);
        }
    }
    for v in &veths {
        assert!(link(In::Host, &v.name).is_some(), "{} not restored", v.name);
    }
    report(
        "createRuntime, 4 vfs",
        &attaches,
        Some(Duration::from_millis(5)),
    );
    report(
        "poststop, nothing to do",
        &idles,
        Some(Duration::from_millis(1)),
    );
    report("poststop, 4 vfs", &detaches, None);
    report("exec /bin/true (floor)", &truths, None);
    report("kernel: 4 moves in + out", &moves, None);
    let bound = [&attaches, &detaches, &idles]
        .iter()
        .flat_map(|r| r.iter())
        .map(|r| r.max_rss_kib)
        .max()
        .unwrap_or(0);
    let (rss, how) = match gnu_time_rss(&attach, &detach, &idle, dir.path()) {
        Some(kib) => (kib, "GNU time"),
        None => (bound, "upper bound: includes this harness's rss"),
    };
    let verdict = if rss < 4096 { "met" } else { "MISSED" };
    println!("peak rss {rss} KiB, {how} (target < 4096 KiB: {verdict})");
}

/// The kernel's part: each stand-in into the pod netns (renamed) and back,
/// through the same rtnetlink code the hook uses, without exec or bookkeeping.
fn kernel_moves(veths: &[Veth], pid: u32) -> Run {
    use devgate::netdev::{LinkChange, LinkRef, Netns, Rtnl, RtnlConn};
    let host = Netns::current().expect("host netns");
    let pod = Netns::of_pid(Path::new("/proc"), pid).expect("pod netns");
    let start = Instant::now();
    let mut h = RtnlConn::open().expect("host socket");
    let mut p = {
        let _in_pod = pod.enter().expect("enter pod");
        RtnlConn::open().expect("pod socket")
    };
    for (i, v) in veths.iter().enumerate() {
        let name = format!("k{i}");
        let index = h
            .link(LinkRef::Name(&v.name))
            .unwrap()
            .expect("stand-in")
            .index;
        let to_pod = LinkChange {
            netns: Some(&pod),
            name: Some(&name),
            ..LinkChange::default()
        };
        h.set_link(index, &to_pod).expect("move in");
        let index = p.link(LinkRef::Name(&name)).unwrap().expect("moved").index;
        let home = LinkChange {
            netns: Some(&host),
            name: Some(&v.name),
            ..LinkChange::default()
        };
        p.set_link(index, &home).expect("move back");
    }
    Run {
        wall: start.elapsed(),
        cpu: Duration::ZERO,
        max_rss_kib: 0,
    }
}

/// Peak RSS over an attach, a detach and an idle poststop, each run under GNU
/// time; `None` when /usr/bin/time is not GNU time.
fn gnu_time_rss(attach: &str, detach: &str, idle: &str, state_dir: &Path) -> Option<i64> {
    let out = state_dir.join("time.out");
    let mut peak = 0;
    for (stage, input) in [
        ("createRuntime", attach),
        ("poststop", detach),
        ("poststop", idle),
    ] {
        if stage == "createRuntime" {
            vouch(attach, state_dir);
        }
        let mut child = Command::new("/usr/bin/time")
            .arg("-f")
            .arg("%M")
            .arg("-o")
            .arg(&out)
            .arg(hook_bin())
            .arg(stage)
            .arg("--state-dir")
            .arg(state_dir)
            .env("DEVGATE_CONFIG", "/nonexistent/devgate.toml")
            .stdin(Stdio::piped())
            .spawn()
            .ok()?;
        let _ = child.stdin.take()?.write_all(input.as_bytes());
        if !child.wait().ok()?.success() {
            return None;
        }
        let kib: i64 = std::fs::read_to_string(&out).ok()?.trim().parse().ok()?;
        peak = peak.max(kib);
    }
    Some(peak)
}
