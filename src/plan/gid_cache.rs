//! GID tables held open from one plan to the next.
//!
//! Opening a port's table walks from the host root to two directories deep in
//! sysfs (`class/infiniband/<ibdev>` is a link into `devices/`), which costs more
//! than reading its few populated slots. The plugin keeps each table it opened
//! until its inventory is read again (names may then stand for other devices),
//! reads its slots afresh at each use, lists them again when the directory's
//! entries changed, and opens a table again when it lists no slot or a slot it
//! listed is missing: the device went away, or into another netns, and the
//! kernel removed the directories held.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::comm_env::{roce_v2_index, GidSource};
use crate::config::GidFamily;
use crate::inventory::PortGids;

/// Each table holds two directories open: far more ports than a node has
/// RDMA ports in use at once, and far fewer descriptors than the process may hold.
const MAX_PORTS: usize = 64;

/// GID tables of the host whose `sys/` is below `root`, kept open.
pub struct GidCache {
    root: PathBuf,
    ports: Mutex<HashMap<(String, u32), PortGids>>,
}

impl GidCache {
    pub fn new(root: &Path) -> GidCache {
        GidCache {
            root: root.to_path_buf(),
            ports: Mutex::default(),
        }
    }

    /// Closes every table: the inventory was read again.
    pub fn clear(&self) {
        self.ports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// How many tables are open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.ports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl GidSource for GidCache {
    fn roce_v2_index(&self, ibdev: &str, port: u32, family: GidFamily) -> Option<u32> {
        let mut ports = self.ports.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (ibdev.to_owned(), port);
        // A table found gone is opened once more, as the device now is.
        for _ in 0..2 {
            let kept = ports.contains_key(&key);
            if !kept {
                let table = PortGids::open(&self.root, ibdev, port)?;
                if ports.len() >= MAX_PORTS {
                    ports.clear();
                }
                ports.insert(key.clone(), table);
            }
            let table = ports.get_mut(&key)?;
            // A table just opened was listed by its opening.
            if kept {
                table.list();
            }
            let found = roce_v2_index(table, family);
            if !table.gone() {
                return found;
            }
            ports.remove(&key);
        }
        None
    }
}

#[cfg(test)]
#[path = "gid_cache_tests.rs"]
mod tests;
