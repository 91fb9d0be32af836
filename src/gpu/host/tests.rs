//! The real host's procfs reading, on trees laid out as proc is and on
//! this process.

use super::*;

#[test]
fn stat_lines_parse() {
    let live = "42 (my (odd) comm) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 777 0 0";
    assert_eq!(parse_stat(live), Some(777));
    let zombie = "42 (sleep) Z 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 777 0 0";
    assert_eq!(parse_stat(zombie), None);
    // The main thread exited, two others are still in the driver.
    let stuck = "42 (cuda) Z 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 3 0 777 0 0";
    assert_eq!(parse_stat(stuck), Some(777));
    let dead = "42 (cuda) X 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 3 0 777 0 0";
    assert_eq!(parse_stat(dead), None);
    assert_eq!(parse_stat("garbage"), None);
}

#[test]
fn a_tree_of_links_reads_like_proc() {
    let dir = tempfile::tempdir().unwrap();
    let fd = dir.path().join("7/fd");
    std::fs::create_dir_all(&fd).unwrap();
    // 600 entries need several getdents64 calls of the 8 KiB buffer.
    for n in 0..600 {
        let target = if n % 3 == 0 {
            "/dev/full"
        } else {
            "socket:[1]"
        };
        std::os::unix::fs::symlink(target, fd.join(n.to_string())).unwrap();
    }
    let host = ProcHost::new(dir.path());
    assert_eq!(host.pids().unwrap(), vec![7]);
    let mut devs = Vec::new();
    host.open_char_devices(7, None, &mut devs).unwrap();
    assert_eq!(devs, vec![libc::makedev(1, 7); 200]);
    let err = host.open_char_devices(8, None, &mut devs).unwrap_err();
    assert!(gone(&err));
}

#[test]
fn this_process_holds_its_open_char_device() {
    let file = std::fs::File::open("/dev/full").unwrap();
    let host = ProcHost::new(Path::new("/proc"));
    let mut devs = Vec::new();
    host.open_char_devices(std::process::id(), None, &mut devs)
        .unwrap();
    assert!(devs.contains(&libc::makedev(1, 7)), "{devs:?}");
    assert!(host.start_time(std::process::id()).unwrap().is_some());
    drop(file);
}

/// A process whose `fd` lists nothing is looked at thread by thread only
/// when its `task` directory counts more than one thread (a link count of
/// 2 plus the threads, as on proc and on a tree of directories).
#[test]
fn the_threads_of_a_process_listing_no_fd_are_walked_only_when_it_has_several() {
    let dir = tempfile::tempdir().unwrap();
    let link = |path: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/dev/full", path).unwrap();
    };
    // Main thread gone, a second one holding the device.
    std::fs::create_dir_all(dir.path().join("9/fd")).unwrap();
    std::fs::create_dir_all(dir.path().join("9/task/9/fd")).unwrap();
    link("9/task/10/fd/0");
    // One thread: its `fd` is the only table, so `task` is never read (the
    // link below cannot exist on proc; it shows that the walk is skipped).
    std::fs::create_dir_all(dir.path().join("8/fd")).unwrap();
    link("8/task/8/fd/0");
    let host = ProcHost::new(dir.path());
    assert!(host.has_other_threads(9));
    assert!(!host.has_other_threads(8));
    let mut devs = Vec::new();
    host.open_char_devices(9, None, &mut devs).unwrap();
    assert_eq!(devs, vec![libc::makedev(1, 7)]);
    devs.clear();
    host.open_char_devices(8, None, &mut devs).unwrap();
    assert!(devs.is_empty(), "{devs:?}");
    // No `task` to count: looked at, as before.
    assert!(host.has_other_threads(7));
}

#[test]
fn this_process_counts_its_threads() {
    let host = ProcHost::new(Path::new("/proc"));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || rx.recv());
    assert!(host.has_other_threads(std::process::id()));
    drop(tx);
    other.join().unwrap().unwrap_err();
}

/// Runs `f` in a forked child whose effective capabilities are dropped (root
/// without CAP_SYS_PTRACE nor CAP_DAC_OVERRIDE), and returns its exit code:
/// 2 and 3 when the capabilities could not be changed.
fn without_capabilities(f: impl FnOnce() -> i32) -> i32 {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    // SAFETY: the child makes raw syscalls and the caller's checks, and
    // leaves with _exit, never returning into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let mut header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        // SAFETY: a header and the two data words capget/capset take; _exit
        // ends the child without unwinding or atexit handlers.
        unsafe {
            if libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) != 0 {
                libc::_exit(2);
            }
            data.iter_mut().for_each(|d| d.effective = 0);
            if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
                libc::_exit(3);
            }
            libc::_exit(f());
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "status {status}");
    libc::WEXITSTATUS(status)
}

/// Without ptrace read access to a process (its effective capabilities
/// dropped, root no longer holds the target's), its `fd` directory lists but
/// no descriptor can be followed: the listing stops at the first refusal
/// instead of asking each of the others.
#[test]
fn a_process_whose_descriptors_cannot_be_followed_is_left_after_one_refusal() {
    // Descriptors enough that a full listing is told from a stopped one.
    let held: Vec<std::fs::File> = (0..4)
        .map(|_| std::fs::File::open("/dev/zero").unwrap())
        .collect();
    let parent = std::process::id();
    let code = without_capabilities(|| {
        let Ok(dir) = open_dir(None, format!("/proc/{parent}/fd").as_str()) else {
            return 4;
        };
        let mut devs = Vec::new();
        match char_devices_in(dir.as_fd(), None, &mut devs) {
            Ok(Listing {
                entries: 1,
                refused: true,
            }) if devs.is_empty() => 0,
            Ok(n) => 10 + n.entries.min(100) as i32,
            Err(_) => 5,
        }
    });
    drop(held);
    assert_eq!(code, 0, "4: open, 5: listing, 10+n: n descriptors listed");
}

/// A follow refused for the file itself (here: a directory on its path that
/// the process may not search) is that descriptor's alone: the next one is
/// still followed, since its link can be read.
#[test]
fn a_file_refused_alone_does_not_end_its_process_listing() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let closed = dir.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::write(closed.join("file"), "x").unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&closed, Some(65534), Some(65534)).unwrap();
    let fd = dir.path().join("7/fd");
    std::fs::create_dir_all(&fd).unwrap();
    std::os::unix::fs::symlink(closed.join("file"), fd.join("0")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", fd.join("1")).unwrap();
    let code = without_capabilities(|| {
        let Ok(dir) = open_dir(None, fd.as_path()) else {
            return 4;
        };
        let mut devs = Vec::new();
        match char_devices_in(dir.as_fd(), None, &mut devs) {
            Ok(Listing {
                entries: 2,
                refused: false,
            }) if devs == [libc::makedev(1, 5)] => 0,
            Ok(n) => 10 + n.entries.min(100) as i32,
            Err(_) => 5,
        }
    });
    assert_eq!(code, 0, "4: open, 5: listing, 10+n: n descriptors listed");
}

/// Whether this kernel gives `/proc/<pid>/fd` the count of descriptors as its
/// size: Linux 6.2 and later.
fn kernel_counts_fds() -> bool {
    let release = nix::sys::utsname::uname().unwrap();
    let release = release.release().to_string_lossy().into_owned();
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 2)
}

/// Where the kernel counts a process's descriptors, one that holds none is
/// known so without a listing; and one that holds some is listed as before.
#[test]
fn the_kernel_counts_descriptors_where_it_can_and_a_process_holding_none_is_seen_so() {
    // SAFETY: the child closes its descriptors and waits for its end; it
    // never returns into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
            loop {
                libc::pause();
            }
        }
    }
    let host = ProcHost::new(Path::new("/proc"));
    let counts = kernel_counts_fds();
    assert_eq!(host.sizes_fd_dirs(), counts);
    // The child may not have closed them yet.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut none_held = false;
    while !none_held && std::time::Instant::now() < deadline {
        none_held = std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|d| d.count() == 0);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let count = host.fd_count(pid as u32);
    let mut devs = Vec::new();
    let listed = host.open_char_devices(pid as u32, None, &mut devs);
    let mine = host.fd_count(std::process::id()).unwrap();
    // SAFETY: the child forked above.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    assert!(none_held, "the child closed its descriptors");
    assert!(listed.is_ok() && devs.is_empty(), "{listed:?} {devs:?}");
    if counts {
        assert_eq!(count.unwrap(), Some(0));
        assert!(mine.is_some_and(|n| n > 0), "{mine:?}");
    } else {
        assert_eq!(count.unwrap(), None);
    }
    // A tree without `self` says nothing of its sizes: every process is listed.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("7/fd")).unwrap();
    let tree = ProcHost::new(dir.path());
    assert!(!tree.sizes_fd_dirs());
    assert_eq!(tree.fd_count(7).unwrap(), None);
}

/// The real host signals a process only while its pid still names the one
/// that started at the time given.
#[test]
fn a_signal_reaches_only_the_process_that_started_then() {
    use std::os::unix::process::ExitStatusExt;
    let host = ProcHost::new(Path::new("/proc"));
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = child.id();
    let start = host.start_time(pid).unwrap().expect("a live process");
    // Another start time: a process that took the pid since.
    assert_eq!(
        host.signal(pid, start + 1, Signal::Kill).unwrap(),
        Sent::Gone
    );
    assert_eq!(child.try_wait().unwrap(), None, "not signalled");
    assert_eq!(host.signal(pid, start, Signal::Term).unwrap(), Sent::Sent);
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
    // Reaped: gone, not an error.
    assert_eq!(host.signal(pid, start, Signal::Term).unwrap(), Sent::Gone);
}

/// A process whose command name is not UTF-8 (the kernel cuts a name at 15
/// bytes, perhaps inside a character, and a process may name itself any
/// bytes) is identified by its start time like any other, on the real
/// procfs: one that could not be would be neither ended as the pod's nor
/// counted among its survivors. A thread of this test names itself (the
/// kernel lets only a thread group rename its own), and `/proc/<tid>` reads
/// as a process.
#[test]
fn a_process_whose_name_is_not_utf8_has_a_start_time() {
    let (named, tid) = std::sync::mpsc::channel();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        std::fs::write("/proc/thread-self/comm", b"a\xe6\x95").unwrap();
        // SAFETY: gettid has no preconditions.
        named.send(unsafe { libc::gettid() } as u32).unwrap();
        wait.recv().ok();
    });
    let tid = tid.recv().unwrap();
    let stat = std::fs::read(format!("/proc/{tid}/stat")).unwrap();
    assert!(String::from_utf8(stat).is_err(), "the name is not UTF-8");
    let start = ProcHost::new(Path::new("/proc")).start_time(tid);
    done.send(()).unwrap();
    thread.join().unwrap();
    assert!(start.unwrap().is_some());
}

/// A child that closed every descriptor it inherited and opened `/dev/full`
/// (1:7) with `flags`, waiting for its end; its pid once the open is seen.
fn child_holding_full(flags: libc::c_int) -> libc::pid_t {
    const FULL: &CStr = c"/dev/full";
    // SAFETY: the child calls only async-signal-safe functions and never
    // returns into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            // Without close_range (before Linux 5.9, or a seccomp filter),
            // the open would not be descriptor 0: the child ends at once.
            if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0
                || libc::open(FULL.as_ptr(), flags) != 0
            {
                libc::_exit(1);
            }
            loop {
                libc::pause();
            }
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if std::fs::read_link(format!("/proc/{pid}/fd/0"))
            .is_ok_and(|l| l == Path::new("/dev/full"))
        {
            return pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // SAFETY: the child forked above, not left behind by a failed test.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    panic!("the child did not open /dev/full as its descriptor 0");
}

/// A descriptor opened with `O_PATH` names the device without opening it:
/// it is no use of the device, and is not listed; a real open is, wanted
/// or among every device.
#[test]
fn a_device_node_held_with_o_path_is_not_an_open_device() {
    let full = libc::makedev(1, 7);
    let host = ProcHost::new(Path::new("/proc"));
    let mut seen = Vec::new();
    for flags in [libc::O_PATH, libc::O_RDONLY] {
        let pid = child_holding_full(flags | libc::O_CLOEXEC);
        let (mut wanted, mut all, mut other) = (Vec::new(), Vec::new(), Vec::new());
        let reads = [
            host.open_char_devices(pid as u32, Some(&[full]), &mut wanted),
            host.open_char_devices(pid as u32, None, &mut all),
            host.open_char_devices(pid as u32, Some(&[libc::makedev(1, 3)]), &mut other),
        ];
        // SAFETY: the child forked above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(reads.iter().all(Result::is_ok), "{reads:?}");
        assert!(other.is_empty(), "{other:?}");
        seen.push((wanted, all));
    }
    assert_eq!(seen[0], (vec![], vec![]), "held with O_PATH");
    assert_eq!(seen[1], (vec![full], vec![full]), "opened");
}
