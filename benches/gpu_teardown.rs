//! GPU teardown with nothing to clean: a pod releasing all 8 GPUs of the fixture's
//! HGX-class node, with 2000 processes to look through. The processes are a proc tree
//! written under a temp dir (`<pid>/fd/<n>` links to /dev/null, /dev/zero, a regular
//! file, dangling `socket:[..]` and `pipe:[..]` targets), so the real procfs code runs:
//! one pass over the tree for all eight GPUs. Target: < 20 ms. Criterion reports the
//! mean; the percentiles are printed after it from 200 timed runs. A second group
//! scans this machine's own /proc with 2000 extra real processes, each holding eight
//! open files (forked children that wait in `pause`): the kernel's own procfs, whose
//! fd links resolve without a path walk, as on a node. A third scans /proc as it is.
//! After the first two, the same tree is walked by the bare syscalls on one thread
//! (`raw_pass`): the kernel's cost of any scan, which the teardown's pass splits
//! over the cores.
use std::hint::black_box;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use devgate::config::GpuConfig;
use devgate::fixture::HostRootBuilder;
use devgate::gpu::{ClaimView, GpuTeardown, Host, NoNvml, ProcHost};
use devgate::ledger::{Claim, DeviceId, PodRecord, PodRef, Share, Teardown};

const PROCESSES: u32 = 2000;

/// Every GPU is held by the releasing pod alone.
struct OnlyHolder;

impl ClaimView for OnlyHolder {
    fn holders(&self, _device: &DeviceId) -> Result<Vec<String>, String> {
        Ok(vec!["sb-bench".to_string()])
    }

    fn siblings(&self, _pod: &PodRef) -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }
}

fn write_proc(root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    let plain = root.join("plain-file");
    std::fs::write(&plain, "x").unwrap();
    for pid in 1..=PROCESSES {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        let targets = [
            Path::new("/dev/null"),
            Path::new("/dev/null"),
            Path::new("/dev/null"),
            plain.as_path(),
            Path::new("socket:[4242]"),
            Path::new("pipe:[4243]"),
            Path::new("/dev/zero"),
            Path::new("anon_inode:[eventpoll]"),
        ];
        for (n, target) in targets.iter().enumerate() {
            symlink(target, dir.join("fd").join(n.to_string())).unwrap();
        }
        std::fs::write(dir.join("cgroup"), "0::/system.slice/x.service\n").unwrap();
        let stat = format!("{pid} (bench) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {pid} 0 0\n");
        std::fs::write(dir.join("stat"), stat).unwrap();
    }
}

fn pod(inv: &devgate::inventory::Inventory) -> PodRecord {
    let claims = inv
        .gpus
        .iter()
        .map(|g| Claim {
            device: DeviceId::Gpu(g.uuid.clone()),
            share: Share::Exclusive,
            pf: None,
        })
        .collect();
    PodRecord {
        pod: PodRef {
            sandbox_id: "sb-bench".to_string(),
            namespace: "bench".to_string(),
            name: "bench".to_string(),
            uid: "6b2c1f0e-1a2b-4c3d-8e9f-001122334455".to_string(),
        },
        claims,
        claimed_unix: 0,
        containers: Default::default(),
        network_owner: None,
        admitted: 0,
    }
}

fn teardown(proc_root: &Path, state: &Path) -> (GpuTeardown, PodRecord) {
    let mut inv = HostRootBuilder::hgx().expected().unwrap();
    assert_eq!(inv.gpus.len(), 8);
    // On a GPU node the fixture's 195:N would be the node's own GPUs, whose
    // users are no part of a teardown with nothing to clean: a major no
    // driver registers (the char major's 12 bits end at 4095) costs the scan
    // the same.
    inv.nvidia_majors.nvidia = Some(4000);
    // NVML off (`[gpu] nvml = false`: clocks, modes and MIG left alone), so
    // that the bench also runs on a node with the NVIDIA driver loaded, where
    // NVML on but not loaded fails every release, as it must.
    let config = GpuConfig {
        health_dir: state.to_path_buf(),
        nvml: false,
        ..GpuConfig::default()
    };
    let record = pod(&inv);
    let t = GpuTeardown::new(
        inv,
        config,
        Arc::new(ProcHost::new(proc_root)),
        Arc::new(NoNvml),
        Arc::new(OnlyHolder),
    );
    (t, record)
}

/// CPU time of this process so far, all threads (the bench machine may be shared:
/// CPU time per teardown does not grow with other load, wall time does).
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut u = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn percentiles(name: &str, t: &GpuTeardown, record: &PodRecord) {
    let cpu = cpu_time();
    let mut samples: Vec<Duration> = (0..200)
        .map(|_| {
            let start = Instant::now();
            t.teardown(black_box(record)).unwrap();
            start.elapsed()
        })
        .collect();
    let cpu = (cpu_time() - cpu) / 200;
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!(
        "{name}: p50 {:?} p99 {:?} max {:?}, cpu {cpu:?} per teardown",
        at(0.5),
        at(0.99),
        at(1.0)
    );
}

/// The pass's syscalls alone on one thread, as a C loop makes them: open
/// `<pid>/fd` relative to the root, getdents64 until it returns nothing, fstatat
/// on every entry. This is what any scan of the tree costs this machine's kernel,
/// whatever program makes it; the teardown's pass is this split over the cores.
fn raw_pass(proc_root: &Path) -> usize {
    use std::ffi::CString;
    let root = CString::new(proc_root.as_os_str().as_encoded_bytes()).unwrap();
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: plain syscalls on descriptors opened here, into buffers owned here.
    unsafe {
        let rootfd = libc::open(root.as_ptr(), flags);
        assert!(rootfd >= 0, "open {}", proc_root.display());
        let pids: Vec<CString> = std::fs::read_dir(proc_root)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            .map(|n| CString::new(format!("{n}/fd")).unwrap())
            .collect();
        let mut chars = 0;
        let mut buf = vec![0u8; 8192];
        for fd_dir in &pids {
            let dir = libc::openat(rootfd, fd_dir.as_ptr(), flags);
            if dir < 0 {
                continue;
            }
            loop {
                let n = libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len());
                if n <= 0 {
                    break;
                }
                let mut off = 0usize;
                while off < n as usize {
                    let d = buf.as_ptr().add(off) as *const libc::dirent64;
                    off += (*d).d_reclen as usize;
                    let name = (*d).d_name.as_ptr();
                    if *name == b'.' as libc::c_char {
                        continue;
                    }
                    let mut st = std::mem::zeroed::<libc::stat>();
                    if libc::fstatat(dir, name, &mut st, 0) == 0
                        && st.st_mode & libc::S_IFMT == libc::S_IFCHR
                    {
                        chars += 1;
                    }
                }
            }
            libc::close(dir);
        }
        libc::close(rootfd);
        chars
    }
}

/// Median wall time of [`raw_pass`] over 50 runs, printed beside the teardown's.
fn floor(name: &str, proc_root: &Path) {
    let mut samples: Vec<Duration> = (0..50)
        .map(|_| {
            let start = Instant::now();
            black_box(raw_pass(proc_root));
            start.elapsed()
        })
        .collect();
    samples.sort();
    println!("{name}: syscall floor on one thread, p50 {:?}", samples[25]);
}

/// `n` forked children holding the same eight open files, killed and reaped on drop.
struct Children(Vec<libc::pid_t>);

impl Children {
    fn spawn(n: u32) -> Children {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain-file");
        std::fs::write(&plain, "x").unwrap();
        // Held open until the children are gone; they inherit them across fork.
        let (r, w) = nix::unistd::pipe().unwrap();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let files = [
            std::fs::File::open("/dev/null").unwrap(),
            std::fs::File::open("/dev/null").unwrap(),
            std::fs::File::open("/dev/zero").unwrap(),
            std::fs::File::open(&plain).unwrap(),
        ];
        let mut pids = Vec::with_capacity(n as usize);
        for _ in 0..n {
            // SAFETY: the child only calls pause(2) and _exit(2), both async-signal-safe.
            match unsafe { libc::fork() } {
                0 => loop {
                    unsafe { libc::pause() };
                },
                -1 => panic!("fork: {}", std::io::Error::last_os_error()),
                pid => pids.push(pid),
            }
        }
        drop((r, w, a, b, files));
        Children(pids)
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: plain syscalls on our own children.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for &pid in &self.0 {
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        }
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    write_proc(&proc_root);
    let (t, record) = teardown(&proc_root, &dir.path().join("state"));
    c.bench_function("gpu_teardown_8_gpus_2000_processes", |b| {
        b.iter(|| t.teardown(black_box(&record)).unwrap())
    });
    percentiles("gpu_teardown_8_gpus_2000_processes", &t, &record);
    floor("gpu_teardown_8_gpus_2000_processes", &proc_root);

    let children = Children::spawn(PROCESSES);
    let (t, record) = teardown(Path::new("/proc"), &dir.path().join("state"));
    c.bench_function("gpu_teardown_8_gpus_2000_real_processes", |b| {
        b.iter(|| t.teardown(black_box(&record)).unwrap())
    });
    percentiles("gpu_teardown_8_gpus_2000_real_processes", &t, &record);
    floor(
        "gpu_teardown_8_gpus_2000_real_processes",
        Path::new("/proc"),
    );
    drop(children);

    // The pids the scan itself lists.
    let pids = ProcHost::new(Path::new("/proc")).pids().unwrap().len();
    println!("gpu_teardown_8_gpus_host_proc: {pids} processes");
    c.bench_function("gpu_teardown_8_gpus_host_proc", |b| {
        b.iter(|| t.teardown(black_box(&record)).unwrap())
    });
    percentiles("gpu_teardown_8_gpus_host_proc", &t, &record);
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
