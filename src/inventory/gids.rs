//! One RDMA port's GID table, read slot by slot when the plan needs it.
//!
//! A RoCE port's table has 128 to 256 slots (`ports/<p>/gid_attrs/types/<i>` for
//! every one of them), most of them empty: the kernel fails the read of an empty
//! slot's type with EINVAL (drivers/infiniband/core/sysfs.c, `print_gid_type`).
//! The table's two directories are opened once, each by one walk from the host
//! root; its slots are listed and each read by name in its directory, the first
//! few kept open and read again from the start at the next plan.

use std::cell::Cell;
use std::path::{Path, PathBuf};

use super::hostdir::{DirStamp, HostDir};
use super::hostfs::HostFs;
use super::parse::{parse_decimal, plain_name};

/// The GID table of one port of one RDMA device on the host.
pub struct PortGids {
    types: HostDir,
    gids: HostDir,
    indices: Vec<u32>,
    /// The types directory as it was listed, and the GID directory as it was
    /// when its files were held.
    listed: Option<DirStamp>,
    gids_seen: Option<DirStamp>,
    /// Set once a listed slot is missing: the port's directories were removed
    /// (the device went away, or into another netns) after they were opened.
    gone: Cell<bool>,
}

impl PortGids {
    /// The table of port `port` of RDMA device `ibdev` below `host_root`; `None`
    /// when `ibdev` is not a plain device name or the port has no table.
    pub fn open(host_root: &Path, ibdev: &str, port: u32) -> Option<PortGids> {
        if !plain_name(ibdev, 64) {
            return None;
        }
        let fs = HostFs::new(host_root);
        let port = PathBuf::from(format!("sys/class/infiniband/{ibdev}/ports/{port}"));
        let types = fs.open_dir(port.join("gid_attrs/types")).ok()?;
        let gids = fs.open_dir(port.join("gids")).ok()?;
        let mut table = PortGids {
            types,
            gids,
            indices: Vec::new(),
            listed: None,
            gids_seen: None,
            gone: Cell::new(false),
        };
        table.list();
        Some(table)
    }

    /// Lists the slots again, in the directory held open, if entries came or
    /// went since the last listing. The kernel sizes a table when it registers
    /// the device, but a hand-made tree may add slots. No slot at all counts as
    /// gone: a port's table has at least its default GID, and a removed
    /// directory lists nothing.
    pub fn list(&mut self) {
        // Slot files kept open stand for what the directories held then.
        let gids = self.gids.stamp();
        if gids.is_none() || gids != self.gids_seen {
            self.gids.forget_held();
            self.gids_seen = gids;
        }
        let stamp = self.types.stamp();
        if stamp.is_some() && stamp == self.listed {
            return;
        }
        self.types.forget_held();
        let names = self.types.list().unwrap_or_default();
        self.indices = names.iter().filter_map(|n| parse_decimal(n)).collect();
        self.indices.sort_unstable();
        self.listed = stamp;
        self.gone.set(self.indices.is_empty());
    }

    /// The table's slots, in ascending order.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    /// The type of slot `index` (`RoCE v2`, `IB/RoCE v1`); `None` for an empty slot.
    pub fn gid_type(&self, index: u32) -> Option<String> {
        self.slot(&self.types, index)
    }

    /// The GID in slot `index`, as sysfs prints it.
    pub fn gid(&self, index: u32) -> Option<String> {
        self.slot(&self.gids, index)
    }

    /// Whether a listed slot was missing at a read: the table must be opened again.
    pub fn gone(&self) -> bool {
        self.gone.get()
    }

    fn slot(&self, dir: &HostDir, index: u32) -> Option<String> {
        match dir.reread(&index.to_string()) {
            Ok(text) => Some(text.trim().to_owned()),
            Err(e) => {
                if e.is_not_found() {
                    self.gone.set(true);
                }
                None
            }
        }
    }
}
