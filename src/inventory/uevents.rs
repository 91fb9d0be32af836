//! The kernel's word that the devices an inventory read may have changed.
//!
//! A cached inventory's numbers go stale without any device it names going
//! away: when a PF's VF count changes, or mlx5 recovers a function, or a
//! device moves to another netns in exclusive mode, the RDMA core registers
//! devices again and `uverbs`/`umad` take the lowest free minor (`ida_alloc_max`
//! in drivers/infiniband/core/uverbs_main.c and user_mad.c), so an unchanged
//! VF can come back as another VF's `uverbsN`; a reloaded `nvidia-uvm` can
//! get another major. A plan from such a cache would grant another pod's
//! device. Every such change sends a kernel uevent (`add`, `remove`, `move`
//! for a rename, `bind`, `unbind`) of the device's subsystem, so a generation
//! counted from them tells a reader that the host must be read again.
//!
//! Kernel uevents of devices that belong to no network namespace reach the
//! `NETLINK_KOBJECT_UEVENT` sockets of every network namespace the initial
//! user namespace owns (lib/kobject_uevent.c: `uevent_net_init` lists those,
//! `uevent_net_broadcast_untagged` sends to them; a netdev's go to its own
//! namespace only): the host's, where the plugin runs, among them.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// include/uapi/linux/netlink.h; group 1 holds the kernel's own messages
/// (udevd re-sends them to group 2, with its own header).
const NETLINK_KOBJECT_UEVENT: isize = 15;
const KERNEL_GROUP: u32 = 1;
/// `UEVENT_BUFFER_SIZE` (include/linux/kobject.h) is 2048 bytes of
/// environment, after the `action@devpath` header.
const DATAGRAM: usize = 8 * 1024;
/// Bursts (a PF's VFs made at once send hundreds) are taken in before the
/// settled callback runs.
const SETTLE: Duration = Duration::from_millis(200);
/// Receive buffer asked for (as root, beyond `rmem_max`): a lost message
/// counts as a change, but a burst should not lose them.
const RCVBUF: usize = 4 << 20;
/// Failed reads in a row (other than a lost message) after which the socket
/// is given up for polling: one that fails this often keeps failing, and
/// every failure counts as a change, which has each plan read the host.
const GIVE_UP_AFTER: u32 = 10;

/// The subsystems whose devices the inventory reads.
const SUBSYSTEMS: [&str; 5] = [
    "pci",
    "infiniband",
    "infiniband_verbs",
    "infiniband_mad",
    // A driver loaded or unloaded: nvidia-uvm's major, a NIC driver's devices.
    "module",
];
/// The actions that add, remove, rename or rebind a device; `change` (link or
/// port state, AER) leaves what the inventory reads as it was.
const ACTIONS: [&str; 5] = ["add", "remove", "move", "bind", "unbind"];

/// One kernel uevent: `action@devpath`, then `KEY=value` strings, each ended by NUL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uevent<'a> {
    pub action: &'a str,
    pub devpath: &'a str,
    pub subsystem: &'a str,
}

/// A kernel uevent's fields; `None` for anything else (udevd's messages
/// start with `libudev`).
pub fn parse(msg: &[u8]) -> Option<Uevent<'_>> {
    let mut fields = msg.split(|&b| b == 0).map(|f| std::str::from_utf8(f).ok());
    let (action, devpath) = fields.next()??.split_once('@')?;
    let subsystem = fields
        .flatten()
        .find_map(|f| f.strip_prefix("SUBSYSTEM="))
        .unwrap_or_default();
    Some(Uevent {
        action,
        devpath,
        subsystem,
    })
}

/// What a uevent says of what an inventory read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Nothing it reads.
    Nothing,
    /// Where a device's netdev is: it leaves the host's namespace
    /// (`remove` there, `dev_change_net_namespace` in net/core/dev.c) when a
    /// hook moves a VF into a pod and comes back (`add`) with its restore,
    /// and the inventory says whether each VF is home. Read again once the
    /// burst passes; the device numbers read stand, so a read it overtakes
    /// is no less current and no plan waits for it.
    Moved,
    /// A device added, removed, renamed or rebound: what was read may name
    /// other devices now.
    Changed,
}

/// What the event changes of what an inventory read. Virtual netdevs (a
/// pod's veth, under `/devices/virtual`) are nothing it reads; a device's
/// netdev is, wherever its bus sits (`/devices/pci0000:00/...`, or below a
/// platform's PCIe controller on a device-tree machine).
pub fn meaning(ev: &Uevent<'_>) -> Seen {
    if !ACTIONS.contains(&ev.action) {
        return Seen::Nothing;
    }
    if SUBSYSTEMS.contains(&ev.subsystem) {
        Seen::Changed
    } else if ev.subsystem == "net" && !ev.devpath.starts_with("/devices/virtual/") {
        Seen::Moved
    } else {
        Seen::Nothing
    }
}

/// A count of the host's device changes, as uevents report them.
#[derive(Debug, Default)]
pub struct HostChanges {
    generation: AtomicU64,
}

impl HostChanges {
    /// Read before a read of the host: a change during it leaves the count
    /// ahead of what the read is taken for.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts the kernel's device uevents on `sock` (those queued since it
    /// was opened first), on a thread of its own, which calls `settled` once
    /// a burst of them has passed, until `settled` says that no one reads
    /// the host any more. Where reads of the socket keep failing, the thread
    /// gives it up and counts the host as changed every `period` instead
    /// (see [`HostChanges::poll`]).
    pub fn watch(
        self: &Arc<Self>,
        sock: UeventSocket,
        period: Duration,
        settled: impl Fn() -> bool + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        self.watch_reads(move |wait| sock.next(wait), period, settled, SETTLE)
    }

    /// [`HostChanges::watch`] of what `next` reads ([`UeventSocket::next`]),
    /// pausing `pause` after a failed read.
    fn watch_reads(
        self: &Arc<Self>,
        mut next: impl FnMut(Option<Duration>) -> io::Result<Option<Seen>> + Send + 'static,
        period: Duration,
        settled: impl Fn() -> bool + Send + 'static,
        pause: Duration,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        let changes = Arc::clone(self);
        std::thread::Builder::new()
            .name("devgate-uevents".into())
            .spawn(move || {
                let end = changes.follow(&mut next, &settled, pause);
                // The socket is closed: nothing queues on it any more.
                drop(next);
                if let FollowEnd::Failed(e) = end {
                    tracing::warn!(error = %e, failures = GIVE_UP_AFTER, period_s = period.as_secs(), "kernel uevents: reads keep failing: the host's devices are read again each period instead");
                    changes.poll(period, &settled);
                }
            })
    }

    /// Counts what `next` reads until no one reads the host any more, or
    /// until reads fail [`GIVE_UP_AFTER`] times in a row. A lost message
    /// (`ENOBUFS`) is no failure of the socket: the kernel says it dropped
    /// one. `pause` is the wait after a failed read.
    fn follow(
        &self,
        next: &mut impl FnMut(Option<Duration>) -> io::Result<Option<Seen>>,
        settled: &impl Fn() -> bool,
        pause: Duration,
    ) -> FollowEnd {
        let mut pending = false;
        let mut failures = 0;
        // A burst settles SETTLE after its last change, however many
        // messages of no interest (a pod's veth, its queues) come between.
        let mut settle_by = Instant::now();
        loop {
            let wait = match pending {
                true => match settle_by.saturating_duration_since(Instant::now()) {
                    left if left.is_zero() => {
                        if !self.step(Ok(None), &mut pending, settled) {
                            return FollowEnd::Gone;
                        }
                        continue;
                    }
                    left => Some(left),
                },
                false => None,
            };
            let got = match next(wait) {
                Err(e) if e.raw_os_error() != Some(libc::ENOBUFS) => {
                    failures += 1;
                    // Once, not at every try: a socket that fails keeps failing.
                    if failures == 1 {
                        tracing::warn!(error = %e, "kernel uevents: read failed");
                    }
                    if failures >= GIVE_UP_AFTER {
                        // Counted as a change and read again now: what
                        // happened while the reads failed is not known.
                        self.bump();
                        return match settled() {
                            true => FollowEnd::Failed(e),
                            false => FollowEnd::Gone,
                        };
                    }
                    std::thread::sleep(pause);
                    Err(e)
                }
                got => {
                    failures = 0;
                    got
                }
            };
            if !matches!(got, Ok(Some(Seen::Nothing) | None)) {
                settle_by = Instant::now() + SETTLE;
            }
            if !self.step(got, &mut pending, settled) {
                return FollowEnd::Gone;
            }
        }
    }

    /// Where the kernel's uevents cannot be read: counts the host as changed
    /// every `period` and calls `settled`, as after a burst, until `settled`
    /// says that no one reads the host any more.
    pub fn poll(&self, period: Duration, settled: &impl Fn() -> bool) {
        loop {
            std::thread::sleep(period);
            self.bump();
            if !settled() {
                return;
            }
        }
    }

    /// What one read of the socket means: a change is counted and makes a
    /// burst pending, a netdev moved makes one pending only; a burst is
    /// settled once a wait passes quietly. False once `settled` says that
    /// no one reads the host any more.
    pub fn step(
        &self,
        got: io::Result<Option<Seen>>,
        pending: &mut bool,
        settled: &impl Fn() -> bool,
    ) -> bool {
        match got {
            Ok(Some(Seen::Changed)) => {
                self.bump();
                *pending = true;
            }
            Ok(Some(Seen::Moved)) => *pending = true,
            Ok(Some(Seen::Nothing)) => {}
            Ok(None) => {
                *pending = false;
                return settled();
            }
            // A message lost (ENOBUFS) may have been a change.
            Err(_) => {
                self.bump();
                *pending = true;
            }
        }
        true
    }
}

/// Why [`HostChanges::follow`] stopped.
enum FollowEnd {
    /// No one reads the host any more.
    Gone,
    /// Reads kept failing; the last failure.
    Failed(io::Error),
}

/// A socket on the kernel's uevent group.
pub struct UeventSocket {
    sock: netlink_sys::Socket,
}

impl UeventSocket {
    pub fn open() -> io::Result<UeventSocket> {
        let mut sock = netlink_sys::Socket::new(NETLINK_KOBJECT_UEVENT)?;
        sock.bind(&netlink_sys::SocketAddr::new(0, KERNEL_GROUP))?;
        let size = RCVBUF as libc::c_int;
        // SAFETY: a valid option value for this socket's descriptor.
        let forced = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if forced != 0 {
            sock.set_rx_buf_sz(RCVBUF)?;
        }
        Ok(UeventSocket { sock })
    }

    /// The next message: what it changes of an inventory; `None` when
    /// `wait` passed without one.
    pub fn next(&self, wait: Option<Duration>) -> io::Result<Option<Seen>> {
        Ok(self.message(wait)?.map(|m| match m {
            Message::Kernel(msg) => parse(&msg).map_or(Seen::Nothing, |ev| meaning(&ev)),
            Message::Truncated => Seen::Changed,
            Message::Other => Seen::Nothing,
        }))
    }

    /// The next message itself; `None` when `wait` passed without one.
    pub fn message(&self, wait: Option<Duration>) -> io::Result<Option<Message>> {
        if let Some(wait) = wait {
            let mut fd = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: one valid pollfd for the length given.
            match unsafe { libc::poll(&mut fd, 1, ms) } {
                0 => return Ok(None),
                n if n < 0 => return interrupted_or(io::Error::last_os_error()),
                _ => {}
            }
        }
        let mut buf: Vec<u8> = Vec::with_capacity(DATAGRAM);
        let (len, from) = match self.sock.recv_from(&mut buf, libc::MSG_TRUNC) {
            Ok(got) => got,
            Err(e) => return interrupted_or(e),
        };
        // Only the kernel's (port 0): others in this namespace could only
        // cause extra reads, but there is no need to take them.
        if from.port_number() != 0 {
            return Ok(Some(Message::Other));
        }
        if len > buf.len() {
            return Ok(Some(Message::Truncated));
        }
        Ok(Some(Message::Kernel(buf)))
    }
}

/// What the uevent socket received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A message of the kernel's.
    Kernel(Vec<u8>),
    /// One longer than the buffer: unknown, so taken as a change.
    Truncated,
    /// A message of some process's.
    Other,
}

/// A signal's interruption is no message to count; any other error is one.
fn interrupted_or(e: io::Error) -> io::Result<Option<Message>> {
    match e.kind() {
        io::ErrorKind::Interrupted => Ok(Some(Message::Other)),
        _ => Err(e),
    }
}

#[cfg(test)]
#[path = "uevents_tests.rs"]
mod tests;
