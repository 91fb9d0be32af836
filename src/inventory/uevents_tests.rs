//! Kernel uevents: which ones change what an inventory reads, how a burst is
//! counted and settled, and the real kernel's socket.
use std::cell::Cell;
use std::time::{Duration, Instant};

use super::*;

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it asks the kernel for a uevent through sysfs"
    );
}

fn message(fields: &[&str]) -> Vec<u8> {
    fields.iter().flat_map(|f| f.bytes().chain([0])).collect()
}

#[test]
fn kernel_messages_are_parsed_and_others_are_not() {
    let vf = message(&[
        "add@/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2",
        "ACTION=add",
        "DEVPATH=/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2",
        "SUBSYSTEM=pci",
        "SEQNUM=4242",
    ]);
    assert_eq!(
        parse(&vf),
        Some(Uevent {
            action: "add",
            devpath: "/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2",
            subsystem: "pci",
        })
    );
    // udevd's own messages (group 2) start with its header; junk is nothing.
    assert_eq!(parse(&message(&["libudev", "SUBSYSTEM=pci"])), None);
    assert_eq!(parse(b""), None);
    assert_eq!(parse(&[0xff, b'@', 0]), None);
    // No SUBSYSTEM: a message, of no subsystem the inventory reads.
    let bare = message(&["remove@/devices/x"]);
    let bare = parse(&bare).unwrap();
    assert_eq!(bare.subsystem, "");
    assert_eq!(meaning(&bare), Seen::Nothing);
}

#[test]
fn device_changes_of_the_inventorys_subsystems_count() {
    let cases = [
        ("add", "pci", true),
        ("remove", "pci", true),
        ("bind", "pci", true),
        ("unbind", "pci", true),
        ("change", "pci", false),
        ("move", "infiniband", true),
        ("add", "infiniband_verbs", true),
        ("remove", "infiniband_mad", true),
        ("add", "module", true),
        ("add", "net", false),
        ("move", "net", false),
        ("add", "block", false),
    ];
    for (action, subsystem, counts) in cases {
        let ev = Uevent {
            action,
            devpath: "/devices/x",
            subsystem,
        };
        assert_eq!(
            meaning(&ev) == Seen::Changed,
            counts,
            "{action} {subsystem}"
        );
    }
}

/// A PCI function's netdev leaving the host's namespace for a pod's, or
/// coming back, or renamed, is a move the inventory reads again for (see
/// `a_burst_is_counted_then_settled_once`): it says where each VF's netdev
/// is. A veth made for a pod is nothing.
#[test]
fn a_pci_netdev_moving_is_read_again_and_a_veth_is_nothing() {
    let vf = "/devices/pci0000:3a/0000:3a:00.0/0000:3b:02.3/net/ens1f0v3";
    let veth = "/devices/virtual/net/veth1a2b3c";
    let dt = "/devices/platform/soc/3c0000.pcie/pci0000:00/0000:00:00.0/0000:01:00.2/net/eth2";
    let cases = [
        ("remove", vf, Seen::Moved),
        ("add", dt, Seen::Moved),
        ("add", vf, Seen::Moved),
        ("move", vf, Seen::Moved),
        ("change", vf, Seen::Nothing),
        ("add", veth, Seen::Nothing),
        ("remove", veth, Seen::Nothing),
    ];
    for (action, devpath, seen) in cases {
        let ev = Uevent {
            action,
            devpath,
            subsystem: "net",
        };
        assert_eq!(meaning(&ev), seen, "{action} {devpath}");
    }
}

#[test]
fn a_burst_is_counted_then_settled_once() {
    let changes = HostChanges::default();
    let settles = Cell::new(0);
    let settled = || {
        settles.set(settles.get() + 1);
        true
    };
    let mut pending = false;
    for got in [
        Ok(Some(Seen::Nothing)),
        Ok(Some(Seen::Changed)),
        Ok(Some(Seen::Changed)),
        Ok(Some(Seen::Nothing)),
    ] {
        changes.step(got, &mut pending, &settled);
    }
    assert_eq!((changes.generation(), pending, settles.get()), (2, true, 0));
    changes.step(Ok(None), &mut pending, &settled);
    assert_eq!(
        (changes.generation(), pending, settles.get()),
        (2, false, 1)
    );
    // A burst of netdev moves asks for one read once it passes, and leaves
    // the count of changes, so no read it overtakes is taken as stale.
    for _ in 0..4 {
        changes.step(Ok(Some(Seen::Moved)), &mut pending, &settled);
    }
    assert_eq!((changes.generation(), pending, settles.get()), (2, true, 1));
    changes.step(Ok(None), &mut pending, &settled);
    assert_eq!(
        (changes.generation(), pending, settles.get()),
        (2, false, 2)
    );
    // A lost message may have been a change.
    let lost = io::Error::from_raw_os_error(libc::ENOBUFS);
    changes.step(Err(lost), &mut pending, &settled);
    assert_eq!((changes.generation(), pending), (3, true));
}

fn failed() -> io::Result<Option<Seen>> {
    Err(io::Error::from_raw_os_error(libc::EIO))
}

/// Reads that fail ten times in a row give the socket up, with the last
/// failure, the host counted as changed and a read asked for; a read that
/// works, or a lost message (the socket works, the kernel dropped one),
/// starts the count again.
#[test]
fn reads_failing_in_a_row_give_the_socket_up() {
    let lost = || Err(io::Error::from_raw_os_error(libc::ENOBUFS));
    let mut script: Vec<io::Result<Option<Seen>>> = Vec::new();
    script.extend((0..GIVE_UP_AFTER - 1).map(|_| failed()));
    script.push(Ok(Some(Seen::Nothing)));
    script.extend((0..GIVE_UP_AFTER - 1).map(|_| failed()));
    script.push(lost());
    script.extend((0..GIVE_UP_AFTER - 1).map(|_| failed()));
    script.push(Err(io::Error::from_raw_os_error(libc::EBADF)));
    script.push(Ok(Some(Seen::Changed)));
    let total = script.len();
    let mut script = script.into_iter();
    let reads = Cell::new(0);
    let mut next = |_| {
        reads.set(reads.get() + 1);
        script.next().expect("read past the script")
    };
    let changes = HostChanges::default();
    let settles = Cell::new(0);
    let settled = || {
        settles.set(settles.get() + 1);
        true
    };
    let end = changes.follow(&mut next, &settled, Duration::ZERO);
    assert!(
        matches!(&end, FollowEnd::Failed(e) if e.raw_os_error() == Some(libc::EBADF)),
        "gave up with the last failure"
    );
    assert_eq!(
        reads.get(),
        total - 1,
        "stopped at the tenth failure in a row"
    );
    // Each failure counts as a change (the lost message too); the give-up
    // asks for a read.
    assert_eq!(changes.generation(), u64::from(3 * (GIVE_UP_AFTER - 1) + 2));
    assert_eq!(settles.get(), 1);
}

/// A watch whose reads keep failing turns to polling: the host counts as
/// changed each period and a read is asked for, until no one reads the host.
#[test]
fn a_watch_whose_reads_keep_failing_polls_instead() {
    let changes = Arc::new(HostChanges::default());
    let settles = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&settles);
    let reads = Arc::new(AtomicU64::new(0));
    let tries = Arc::clone(&reads);
    let watch = changes
        .watch_reads(
            move |_| {
                tries.fetch_add(1, Ordering::SeqCst);
                failed()
            },
            Duration::from_millis(20),
            // The give-up's read and four polls; then the reader is gone.
            move || counter.fetch_add(1, Ordering::SeqCst) < 4,
            Duration::ZERO,
        )
        .expect("watch");
    watch
        .join()
        .expect("the watch thread ends once no one reads");
    assert_eq!(reads.load(Ordering::SeqCst), u64::from(GIVE_UP_AFTER));
    assert_eq!(settles.load(Ordering::SeqCst), 5);
    // A change for each failure (the last one's at the give-up), then one
    // for each of the four polls.
    assert_eq!(changes.generation(), u64::from(GIVE_UP_AFTER) + 4);
}

/// A watch whose socket works ends once no one reads the host: the settle
/// after a burst finds the reader gone, and nothing turns to polling.
#[test]
fn a_watch_ends_once_no_one_reads_the_host() {
    let changes = Arc::new(HostChanges::default());
    let mut script = vec![
        Ok(Some(Seen::Changed)),
        Ok(None),
        Ok(Some(Seen::Changed)),
        Ok(None),
    ]
    .into_iter();
    let reads = Arc::new(AtomicU64::new(0));
    let tries = Arc::clone(&reads);
    let settles = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&settles);
    let watch = changes
        .watch_reads(
            move |_| {
                tries.fetch_add(1, Ordering::SeqCst);
                script.next().expect("read past the script")
            },
            Duration::from_millis(1),
            // The first burst's read is taken; at the second the reader is gone.
            move || counter.fetch_add(1, Ordering::SeqCst) < 1,
            Duration::ZERO,
        )
        .expect("watch");
    watch.join().expect("the watch thread ends");
    assert_eq!(reads.load(Ordering::SeqCst), 4);
    assert_eq!(settles.load(Ordering::SeqCst), 2, "no poll after the end");
    assert_eq!(changes.generation(), 2);
}

/// The real kernel's socket receives a uevent asked for through sysfs (a
/// `change` of `/dev/null`'s device, which udev answers at most by setting
/// its mode again): that message, which changes no inventory.
#[test]
fn the_real_socket_receives_the_kernels_uevents() {
    require_root();
    let sock = UeventSocket::open().expect("uevent socket");
    std::fs::write("/sys/devices/virtual/mem/null/uevent", "change").expect("ask for a uevent");
    // Other tests ask for uevents too: this one is found by its device.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut found = None;
    while found.is_none() && Instant::now() < deadline {
        if let Some(Message::Kernel(msg)) = sock
            .message(Some(Duration::from_millis(100)))
            .expect("read")
        {
            let ev = parse(&msg).map(|e| {
                (
                    e.action.to_string(),
                    e.devpath.to_string(),
                    e.subsystem.to_string(),
                )
            });
            if ev
                .as_ref()
                .is_some_and(|(_, path, _)| path == "/devices/virtual/mem/null")
            {
                found = ev;
            }
        }
    }
    let (action, _, subsystem) = found.expect("the uevent asked for");
    assert_eq!((action.as_str(), subsystem.as_str()), ("change", "mem"));
    let ev = Uevent {
        action: &action,
        devpath: "",
        subsystem: &subsystem,
    };
    assert_eq!(meaning(&ev), Seen::Nothing);
}

/// The watch end to end on the real kernel: a PCI device's `move` is
/// counted, and the burst is settled once it has passed. (A synthetic `move`
/// renames nothing; udev's rules for PCI devices match `add`, `bind` or
/// `change`, which this test leaves alone.)
#[test]
fn the_watch_counts_a_real_pci_uevent_and_settles() {
    require_root();
    let pci = std::fs::read_dir("/sys/bus/pci/devices")
        .expect("this machine's pci devices")
        .flatten()
        .next()
        .expect("a pci device to ask a uevent of")
        .path();
    let changes = Arc::new(HostChanges::default());
    let settles = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&settles);
    changes
        .watch(
            UeventSocket::open().expect("uevent socket"),
            Duration::from_secs(3600),
            move || {
                counter.fetch_add(1, Ordering::SeqCst);
                true
            },
        )
        .expect("watch");
    std::fs::write(pci.join("uevent"), "move").expect("ask for a uevent");
    let deadline = Instant::now() + Duration::from_secs(5);
    while settles.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(changes.generation() >= 1, "{pci:?}: no change counted");
    assert!(settles.load(Ordering::SeqCst) >= 1, "never settled");
}

/// A burst settles SETTLE after its last change, however many messages of
/// no interest (a pod's veth and queues) keep coming: each wait is what is
/// left of it, not a fresh SETTLE, so the read is asked for while they go on.
#[test]
fn messages_of_no_interest_do_not_hold_a_burst_open() {
    let reads = Cell::new(0);
    let waits = std::cell::RefCell::new(Vec::new());
    let mut next = |wait: Option<Duration>| {
        reads.set(reads.get() + 1);
        waits.borrow_mut().push(wait);
        match reads.get() {
            1 => Ok(Some(Seen::Changed)),
            // Each a quarter of SETTLE apart (a sleep is never shorter).
            2..=40 => {
                std::thread::sleep(SETTLE / 4);
                Ok(Some(Seen::Nothing))
            }
            _ => Ok(None),
        }
    };
    let changes = HostChanges::default();
    let settled_at = Cell::new(None);
    let settled = || {
        settled_at.set(Some(reads.get()));
        false
    };
    let end = changes.follow(&mut next, &settled, Duration::ZERO);
    assert!(matches!(end, FollowEnd::Gone));
    let at = settled_at.get().expect("settled");
    assert!(
        at <= 6,
        "read asked for after {at} reads, not once SETTLE passed"
    );
    let waits = waits.borrow();
    assert_eq!(waits[0], None, "nothing pending before the change");
    assert!(
        waits[2..].iter().all(|w| w.is_some_and(|w| w < SETTLE)),
        "{waits:?}"
    );
}
