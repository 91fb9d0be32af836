//! The plugin's copy of the node inventory: read at start, read again when
//! the kernel reports a device change (see [`crate::inventory::uevents`]), or
//! every [`POLL_PERIOD`] where its uevents cannot be read (the socket cannot
//! be opened, or its reads keep failing), or when a plan names a device it
//! does not know.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use super::{link_dev_char, Devices};
use crate::inventory::uevents::{HostChanges, UeventSocket};
use crate::inventory::Inventory;

/// Reads of the host a change overtook before one is kept anyway.
const READ_TRIES: u32 = 3;
/// The pause before a read again.
const READ_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);
/// How often the host counts as changed where the kernel's uevents cannot be
/// read (a seccomp or LSM policy that denies `NETLINK_KOBJECT_UEVENT`, or a
/// socket whose reads keep failing): a
/// device the kernel numbers anew is then planned from the old read for at
/// most this long, as long as a host read takes on the inventory thread.
pub const POLL_PERIOD: std::time::Duration = std::time::Duration::from_secs(30);

/// An inventory and whether it can be trusted whole: an `Overtaken` one was
/// read while the kernel reported changes, each of the times it was read.
#[derive(Clone)]
pub(super) enum Read {
    Settled(Arc<Inventory>),
    Overtaken(Arc<Inventory>),
}

impl Read {
    pub(super) fn inventory(&self) -> &Arc<Inventory> {
        match self {
            Read::Settled(inv) | Read::Overtaken(inv) => inv,
        }
    }
}

impl Devices {
    pub fn inventory(&self) -> Arc<Inventory> {
        self.inventory
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts a runtime-sent `[gpu] nvml` setting in force for the next read
    /// of the host.
    pub fn set_nvml(&self, nvml: Option<crate::config::NvmlLibraries>) {
        self.gpu_facts.set_nvml(nvml);
    }

    /// The kernel's device changes this cache follows.
    pub fn host_changes(&self) -> &Arc<HostChanges> {
        &self.changes
    }

    /// Follows the kernel's device changes on `sock`, opened before the
    /// first read of the host so that what changed since is queued there,
    /// reading the host again once each burst of them has passed (so that a
    /// plan seldom has to first).
    ///
    /// The reads run on a thread of their own, so that the uevent thread
    /// keeps counting changes during them: a read a change overtook is then
    /// known as such (see [`Devices::read_host`]) instead of being taken as
    /// current until the uevent thread gets to the queued change.
    pub fn watch_host(self: &Arc<Self>, sock: UeventSocket) -> std::io::Result<()> {
        let settled = self.start_reader()?;
        self.changes.watch(sock, POLL_PERIOD, settled).map(drop)
    }

    /// Where the kernel's uevents cannot be read: counts the host as changed
    /// every `period` and reads it again, as after a burst of uevents, until
    /// a period after the cache is dropped.
    pub fn poll_host(self: &Arc<Self>, period: std::time::Duration) -> std::io::Result<()> {
        let settled = self.start_reader()?;
        let changes = Arc::clone(&self.changes);
        std::thread::Builder::new()
            .name("devgate-host-poll".into())
            .spawn(move || changes.poll(period, &settled))
            .map(drop)
    }

    /// Starts the thread that reads the host when the returned callback asks,
    /// while the cache lives; the callback returns false once it is gone.
    fn start_reader(self: &Arc<Self>) -> std::io::Result<impl Fn() -> bool + Send + 'static> {
        // One read asked for at most: a burst settling during a read asks
        // for one more, not one each.
        let (ask, asked) = std::sync::mpsc::sync_channel::<()>(1);
        let devices = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("devgate-inventory".into())
            .spawn(move || {
                for () in asked {
                    match devices.upgrade() {
                        Some(d) => drop(d.refresh()),
                        None => return,
                    }
                }
            })?;
        Ok(move || {
            // Full: a read is asked for already. Disconnected: the reader
            // found the cache gone and ended.
            !matches!(
                ask.try_send(()),
                Err(std::sync::mpsc::TrySendError::Disconnected(()))
            )
        })
    }

    /// The cached inventory, read again first when the kernel reported a
    /// device change since it was read (see [`crate::inventory::uevents`]):
    /// what a plan is built from. A read already under way (the uevent
    /// thread's, once a burst has passed) is waited for rather than repeated.
    pub fn fresh_inventory(&self) -> Arc<Inventory> {
        self.fresh_inventory_settled().inventory().clone()
    }

    /// [`Devices::fresh_inventory`], and whether it is settled (see
    /// `read_host`).
    pub(super) fn fresh_inventory_settled(&self) -> Read {
        // Current, and the one taken still the one kept: a read stored
        // between the two looks (overtaken or settled) is not vouched for.
        let inv = self.inventory();
        if self.is_current() && Arc::ptr_eq(&inv, &self.inventory()) {
            return Read::Settled(inv);
        }
        let _one = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        let inv = self.inventory();
        if self.is_current() {
            return Read::Settled(inv);
        }
        self.read_host()
    }

    /// Re-reads the host: devices come and go (VFs created, drivers rebound).
    pub fn refresh(&self) -> Arc<Inventory> {
        self.refresh_settled().inventory().clone()
    }

    /// [`Devices::refresh`], and whether the read is settled.
    pub(super) fn refresh_settled(&self) -> Read {
        let _one = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        self.read_host()
    }

    pub(super) fn is_current(&self) -> bool {
        self.changes.generation() == self.read_at.load(Ordering::Acquire)
    }

    /// The read itself, under `reading`: reads never overlap, so each one
    /// kept is newer than the one before, with its GID cache and `/dev/char`
    /// links. A read during which the kernel reported a change may hold a
    /// device half-changed (a VF's netdev beside another VF's `uverbsN`): it
    /// is read again, [`READ_PAUSE`] later, up to [`READ_TRIES`] times; the
    /// last is kept, but not taken as current, so the next plan reads the
    /// host again, and it is said to be overtaken.
    fn read_host(&self) -> Read {
        let mut tries = 0;
        let (generation, inv) = loop {
            let generation = self.changes.generation();
            let inv = Arc::new(self.gpu_facts.discover(&self.host_root));
            #[cfg(test)]
            if let Some(hook) = &*self.after_read.lock().unwrap() {
                hook();
            }
            tries += 1;
            if self.changes.generation() == generation {
                break (Some(generation), inv);
            }
            if tries == READ_TRIES {
                tracing::info!(tries, "the host's devices changed during each read: plans with rdma devices are refused until they settle");
                break (None, inv);
            }
            // A burst (a pod's RDMA device moved, VFs made) passes in less.
            std::thread::sleep(READ_PAUSE);
        };
        // The new inventory's names may stand for other devices.
        self.gids.clear();
        self.dev_char.forget();
        link_dev_char(&self.dev_char, &inv);
        *self
            .inventory
            .write()
            .unwrap_or_else(PoisonError::into_inner) = inv.clone();
        match generation {
            Some(generation) => {
                self.read_at.store(generation, Ordering::Release);
                Read::Settled(inv)
            }
            None => Read::Overtaken(inv),
        }
    }
}
