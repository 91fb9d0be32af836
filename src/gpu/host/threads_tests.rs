//! Threads' file tables told apart on this process, with the kernel's
//! `kcmp`, and read where it cannot tell them.

use std::path::Path;
use std::sync::mpsc;

use nix::sched::{unshare, CloneFlags};

use super::*;
use crate::gpu::host::Host;

/// A thread of this process, with a table of its own or not, holding
/// `/dev/full` open in its own, until `stop` is sent.
struct Thread {
    tid: u32,
    stop: mpsc::Sender<()>,
    handle: std::thread::JoinHandle<()>,
}

fn thread(own_table: bool) -> Thread {
    let (ready_tx, ready) = mpsc::channel();
    let (stop, stop_rx) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        if own_table {
            unshare(CloneFlags::CLONE_FILES).expect("unshare CLONE_FILES");
        }
        let file = own_table.then(|| std::fs::File::open("/dev/full").expect("open /dev/full"));
        ready_tx
            .send(nix::unistd::gettid().as_raw() as u32)
            .unwrap();
        let _ = stop_rx.recv();
        drop(file);
    });
    let tid = ready.recv().unwrap();
    Thread { tid, stop, handle }
}

impl Thread {
    fn end(self) {
        self.stop.send(()).unwrap();
        self.handle.join().unwrap();
    }
}

/// However many threads share a table, it is kept once, and the tables
/// kept stay in `kcmp`'s order, so each thread is placed by a search.
#[test]
fn each_table_is_kept_once_in_kcmp_order() {
    // Others look for /dev/full held by this process.
    let _serial = crate::gpu::tests::real_proc::SERIAL
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    assert!(kcmp_allowed(), "kcmp is refused to this process");
    let me = std::process::id();
    let shared: Vec<Thread> = (0..6).map(|_| thread(false)).collect();
    let own: Vec<Thread> = (0..3).map(|_| thread(true)).collect();
    let mut tables = Tables {
        compare: true,
        read: vec![me],
    };
    for t in shared.iter().chain(&own) {
        match tables.find(t.tid) {
            Place::Shared => {}
            Place::At(at) => tables.read.insert(at, t.tid),
            Place::Unknown => panic!("thread {} not compared", t.tid),
        }
    }
    assert_eq!(tables.read.len(), 4, "the main table and three own");
    for t in &own {
        assert!(tables.read.contains(&t.tid));
        assert!(matches!(tables.find(t.tid), Place::Shared));
    }
    for pair in tables.read.windows(2) {
        assert_eq!(kcmp_files(pair[0], pair[1]), Some(Ordering::Less));
    }
    // A kept thread that exited is dropped where the search meets it, and
    // the search still places the next one.
    let mut own = own.into_iter();
    let gone = own.next().unwrap();
    let gone_tid = gone.tid;
    gone.end();
    // The join returns before the kernel releases the task (the tid is
    // cleared at exit_mm, before exit_files and the release).
    let task = format!("/proc/self/task/{gone_tid}");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while Path::new(&task).exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let fresh = thread(true);
    assert!(matches!(tables.find(fresh.tid), Place::At(_)));
    let mut lone = Tables {
        compare: true,
        read: vec![gone_tid],
    };
    assert!(matches!(lone.find(fresh.tid), Place::At(0)));
    assert!(lone.read.is_empty(), "{:?}", lone.read);
    for t in shared.into_iter().chain(own).chain([fresh]) {
        t.end();
    }
}

/// Tables of many threads each listing the same devices: what is gathered
/// stays as many devices as differ, not one entry per thread's descriptor.
#[test]
fn devices_of_many_tables_are_gathered_without_repeats() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("9/fd")).unwrap();
    std::fs::create_dir_all(dir.path().join("9/task/9/fd")).unwrap();
    for tid in 10..400 {
        let fd = dir.path().join(format!("9/task/{tid}/fd"));
        std::fs::create_dir_all(&fd).unwrap();
        for n in 0..4 {
            let target = if n == 3 { "/dev/full" } else { "/dev/null" };
            std::os::unix::fs::symlink(target, fd.join(n.to_string())).unwrap();
        }
    }
    let host = ProcHost::new(dir.path());
    let mut devs = Vec::new();
    host.open_char_devices(9, None, &mut devs).unwrap();
    devs.sort_unstable();
    devs.dedup();
    assert_eq!(devs, [libc::makedev(1, 3), libc::makedev(1, 7)]);
    let mut all = Vec::new();
    host.open_char_devices(9, None, &mut all).unwrap();
    assert!(all.len() <= COMPACT_PAST + 4, "{} entries", all.len());
}

/// `kcmp` refused by a seccomp filter (EPERM, as container runtimes' default
/// filters answer it) tells nothing of access to the process: the thread's
/// own table is read. Taken for a refused process, it was skipped.
///
/// A filter binds its thread for good, so the check runs in a process of its
/// own: this test binary spawned again for this test alone. A child forked
/// from the multi-threaded harness could hang on a lock another thread held
/// at the fork as soon as it allocated.
#[test]
fn a_table_is_read_where_a_filter_refuses_kcmp() {
    if std::env::var_os(KCMP_REFUSED_CHILD).is_some() {
        assert!(refuse_kcmp(), "no seccomp filter installed");
        let me = std::process::id();
        assert!(kcmp_files(me, me).is_none(), "kcmp allowed");
        let t = thread(true);
        let mut devs = Vec::new();
        let read = ProcHost::new(Path::new("/proc")).open_char_devices(me, None, &mut devs);
        t.end();
        read.expect("scan");
        assert!(
            devs.contains(&libc::makedev(1, 7)),
            "the thread's device missed: {devs:?}"
        );
        return;
    }
    // The child holds /dev/full, which tests scanning the real /proc look for.
    let _serial = crate::gpu::tests::real_proc::SERIAL
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let name = module_path!()
        .split_once("::")
        .map(|(_, path)| format!("{path}::a_table_is_read_where_a_filter_refuses_kcmp"))
        .expect("module path");
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", &name, "--test-threads=1", "--nocapture"])
        .env(KCMP_REFUSED_CHILD, "1")
        .output()
        .expect("spawn the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Set in the process that [`a_table_is_read_where_a_filter_refuses_kcmp`]
/// spawns to run its check.
const KCMP_REFUSED_CHILD: &str = "DEVGATE_TEST_KCMP_REFUSED_CHILD";

/// Installs a seccomp filter on this thread (and threads it starts) that
/// answers kcmp with EPERM and allows every other call.
fn refuse_kcmp() -> bool {
    // linux/filter.h and linux/seccomp.h.
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const RET_ERRNO: u32 = 0x0005_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut prog = [
        op(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        op(JEQ_K, 0, 1, libc::SYS_kcmp as u32),
        op(RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32),
        op(RET_K, 0, 0, RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: prctl with a filter program that outlives the call (the
    // kernel copies it).
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &fprog as *const libc::sock_fprog,
            ) == 0
    }
}
