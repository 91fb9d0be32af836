//! One RDMA port's GID table, read entry by entry when the plan needs it.
//!
//! A RoCE port's table has 128 to 256 slots (`ports/<p>/gid_attrs/types/<i>` for
//! every one of them), most of them empty: the kernel fails the read of an empty
//! slot's type with EINVAL (drivers/infiniband/core/sysfs.c, `print_gid_type`).
//! Readers ask for the slots in index order and stop at the entry they look for,
//! and each file is opened by name in its directory, held open, rather than by a
//! walk from the host root.

use std::path::PathBuf;

use super::hostfs::{HostDir, HostFs};
use super::parse::parse_decimal;

/// The GID table of one port of one RDMA device on the host.
pub struct PortGids {
    fs: HostFs,
    port: PathBuf,
    types: HostDir,
    /// `ports/<p>/gids`, opened at the first GID asked for.
    gids: std::cell::OnceCell<Option<HostDir>>,
}

impl PortGids {
    /// The table of port `port` of RDMA device `ibdev` below `host_root`; `None`
    /// when `ibdev` is not a plain device name or the port has no table.
    pub fn open(host_root: &std::path::Path, ibdev: &str, port: u32) -> Option<PortGids> {
        if !plain_name(ibdev) {
            return None;
        }
        let fs = HostFs::new(host_root);
        let port = PathBuf::from(format!("sys/class/infiniband/{ibdev}/ports/{port}"));
        let types = fs.open_dir(port.join("gid_attrs/types")).ok()?;
        Some(PortGids {
            fs,
            port,
            types,
            gids: std::cell::OnceCell::new(),
        })
    }

    /// The table's slots, in ascending order; empty when the table is unreadable.
    pub fn indices(&mut self) -> Vec<u32> {
        let names = self.types.list().unwrap_or_default();
        let mut indices: Vec<u32> = names.iter().filter_map(|n| parse_decimal(n)).collect();
        indices.sort_unstable();
        indices
    }

    /// The type of slot `index` (`RoCE v2`, `IB/RoCE v1`); `None` for an empty slot.
    pub fn gid_type(&self, index: u32) -> Option<String> {
        trimmed(self.types.read(&index.to_string()).ok()?)
    }

    /// The GID in slot `index`, as sysfs prints it.
    pub fn gid(&self, index: u32) -> Option<String> {
        let gids = self
            .gids
            .get_or_init(|| self.fs.open_dir(self.port.join("gids")).ok());
        trimmed(gids.as_ref()?.read(&index.to_string()).ok()?)
    }
}

fn trimmed(text: String) -> Option<String> {
    Some(text.trim().to_owned())
}

/// An ibdev name as the kernel gives them: no path separators or dot names.
fn plain_name(ibdev: &str) -> bool {
    !ibdev.is_empty()
        && ibdev.len() <= 64
        && ibdev
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        && ibdev != "."
        && ibdev != ".."
}
