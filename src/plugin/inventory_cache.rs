//! The plugin's copy of the node inventory: read at start, read again when
//! the kernel reports a device change (see [`crate::inventory::uevents`]) or a
//! plan names a device it does not know.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use super::{link_dev_char, Devices};
use crate::inventory::uevents::{HostChanges, UeventSocket};
use crate::inventory::Inventory;

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
        self.gpu_facts.set_nvml(&self.host_root, nvml);
    }

    /// The kernel's device changes this cache follows.
    pub fn host_changes(&self) -> &Arc<HostChanges> {
        &self.changes
    }

    /// Follows the kernel's device changes on `sock`, opened before the
    /// first read of the host so that what changed since is queued there,
    /// reading the host again once each burst of them has passed (so that a
    /// plan seldom has to first).
    pub fn watch_host(self: &Arc<Self>, sock: UeventSocket) -> std::io::Result<()> {
        let devices = Arc::downgrade(self);
        let settled = move || {
            if let Some(d) = devices.upgrade() {
                drop(d.refresh());
            }
        };
        self.changes.watch(sock, settled).map(drop)
    }

    /// The cached inventory, read again first when the kernel reported a
    /// device change since it was read (see [`crate::inventory::uevents`]):
    /// what a plan is built from. A read already under way (the uevent
    /// thread's, once a burst has passed) is waited for rather than repeated.
    pub fn fresh_inventory(&self) -> Arc<Inventory> {
        if self.is_current() {
            return self.inventory();
        }
        let _one = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        if self.is_current() {
            return self.inventory();
        }
        self.read_host()
    }

    /// Re-reads the host: devices come and go (VFs created, drivers rebound).
    pub fn refresh(&self) -> Arc<Inventory> {
        let _one = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        self.read_host()
    }

    fn is_current(&self) -> bool {
        self.changes.generation() == self.read_at.load(Ordering::Acquire)
    }

    /// The read itself, under `reading`: reads never overlap, so each one
    /// kept is newer than the one before, with its GID cache and `/dev/char`
    /// links.
    fn read_host(&self) -> Arc<Inventory> {
        let generation = self.changes.generation();
        let inv = Arc::new(self.gpu_facts.discover(&self.host_root));
        // The new inventory's names may stand for other devices.
        self.gids.clear();
        self.dev_char.forget();
        link_dev_char(&self.dev_char, &inv);
        *self
            .inventory
            .write()
            .unwrap_or_else(PoisonError::into_inner) = inv.clone();
        self.read_at.store(generation, Ordering::Release);
        inv
    }
}
