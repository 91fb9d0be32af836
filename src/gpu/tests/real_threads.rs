//! A GPU held only in a thread's own file table. Any process may give a
//! thread a table of its own (`unshare(CLONE_FILES)`) and keep there a
//! descriptor another pod's process passed it over a socket: the main
//! thread's `<pid>/fd` does not show it, and a teardown that read only that
//! would reset and hand on a GPU still open. `/dev/full` (1:7) stands in
//! for the GPU, as in `real_proc`.

use std::path::Path;
use std::sync::mpsc;

use nix::sched::{unshare, CloneFlags};

use super::real_proc::SERIAL;
use crate::gpu::host::{Host, ProcHost};

#[test]
fn a_device_open_only_in_a_threads_own_table_is_found() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let host = ProcHost::new(Path::new("/proc"));
    let me = std::process::id();
    let full = libc::makedev(1, 7);
    let holds = || {
        let mut out = Vec::new();
        host.open_char_devices(me, None, &mut out).unwrap();
        out.contains(&full)
    };
    assert!(!holds(), "the test process holds /dev/full already");

    let (opened_tx, opened) = mpsc::channel();
    let (done, done_rx) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        unshare(CloneFlags::CLONE_FILES).expect("unshare CLONE_FILES");
        let file = std::fs::File::open("/dev/full").expect("open /dev/full");
        opened_tx.send(()).unwrap();
        let _ = done_rx.recv();
        drop(file);
    });
    opened.recv().unwrap();
    let seen = holds();
    // Other threads sharing the main table are told apart and not read
    // again: the thread's own table is what is found.
    done.send(()).unwrap();
    thread.join().unwrap();
    assert!(
        seen,
        "a device open in a thread's own file table was missed"
    );
    assert!(!holds(), "closed with the thread's table");
}
