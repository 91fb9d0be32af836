//! Device inventory read from a host root.
//!
//! [`discover`] reads a host's `sys/` and `proc/` below a given root exactly as Linux lays them
//! out, resolving every symlink inside that root, and returns a typed [`Inventory`]:
//!
//! - NVIDIA GPUs: the BDF links in `sys/bus/pci/drivers/nvidia/`, each described by
//!   `proc/driver/nvidia/gpus/<bdf>/information`; majors from `proc/devices`.
//! - RDMA devices of any vendor: `sys/class/infiniband/<ibdev>` (`device`, `node_guid`,
//!   `ports/`), their char devices from `sys/class/infiniband_verbs` and
//!   `sys/class/infiniband_mad`, and `sys/class/misc/rdma_cm`. A device moved into a
//!   pod's netns in exclusive mode is gone from `class/infiniband` (netns-tagged) but
//!   not from the char device classes: it is found through them, its ports' state
//!   unknown (`IN_OTHER_NETNS`).
//! - SR-IOV: a PF's `sriov_totalvfs` and `virtfnN` links (never `sriov_numvfs`, read under
//!   the lock its write holds while VFs are created); a VF's `physfn`,
//!   driver, netdev and RDMA device.
//! - Topology: NUMA node, root complex and switch from the resolved sysfs path
//!   ([`topology`]).
//!
//! Nothing here fails: what cannot be read becomes one line in `Inventory.warnings`.

mod error;
mod gids;
mod gpu;
mod hostdir;
mod hostfs;
mod nic;
mod parse;
mod pci;
mod rdma;

pub mod device_cr;
pub mod model;
pub mod topology;
pub mod uevents;
pub mod view;

use std::path::Path;

pub use error::InventoryError;
pub use gids::PortGids;
pub use gpu::{GpuFacts, GpuLibrary, NoGpuLibrary};
pub use model::*;
pub use nic::port_health;
pub(crate) use parse::{counts_as_gpu, parse_class, parse_dev_num, parse_rdma_char_name};
pub use parse::{mlx_minor, plain_name};
pub use rdma::{parse_netns_mode, NETNS_MODE_PARAM};
pub use topology::{relation, PcieRelation};

use hostfs::HostFs;

/// Reads the inventory of the host whose `sys/` and `proc/` are below `host_root`, without a
/// GPU library: GPU indices are PCI bus order.
pub fn discover(host_root: &Path) -> Inventory {
    discover_with(host_root, &NoGpuLibrary)
}

/// Like [`discover`], asking `gpu_library` (NVML) for GPU indices, memory and health.
pub fn discover_with(host_root: &Path, gpu_library: &dyn GpuLibrary) -> Inventory {
    discover_in(HostFs::new(host_root), gpu_library)
}

/// Discovery resolving every symlink without `openat2`, as on kernels before 5.6.
#[cfg(test)]
fn discover_without_openat2(host_root: &Path) -> Inventory {
    discover_in(HostFs::new(host_root).without_openat2(), &NoGpuLibrary)
}

fn discover_in(fs: HostFs, gpu_library: &dyn GpuLibrary) -> Inventory {
    let mut scan = Scan {
        fs,
        gpu_library,
        warnings: Vec::new(),
    };
    let gpus = scan.gpus();
    let nvidia_majors = scan.nvidia_majors(!gpus.is_empty());
    let rdma = scan.rdma_nics();
    let rdma_cm = scan.rdma_cm(!rdma.is_empty());
    let rdma_netns_mode = if rdma.is_empty() {
        None
    } else {
        scan.netns_mode()
    };
    Inventory {
        gpus,
        nvidia_majors,
        rdma,
        rdma_cm,
        rdma_netns_mode,
        warnings: scan.warnings,
    }
}

/// Whether the PCI function `addr` has a netdev in the host's namespace now,
/// read as discovery reads them: a netdev moved into a pod's namespace is
/// not listed (sysfs tags netdevs by namespace, lib/kobject_ns.c). False
/// when the function cannot be read.
pub fn has_netdev(host_root: &Path, addr: PciAddr) -> bool {
    let mut scan = Scan {
        fs: HostFs::new(host_root),
        gpu_library: &NoGpuLibrary,
        warnings: Vec::new(),
    };
    let rel = Path::new("sys/bus/pci/devices").join(addr.to_string());
    scan.pci_function(&rel)
        .is_ok_and(|f| !scan.netdevs(&f).is_empty())
}

/// The node's host name from `proc/sys/kernel/hostname` below `host_root`.
pub fn host_name(host_root: &Path) -> Result<String, InventoryError> {
    let path = "proc/sys/kernel/hostname";
    let text = HostFs::new(host_root).read(path)?;
    let name = text.trim();
    if name.is_empty() {
        return Err(InventoryError::malformed(path, &text));
    }
    Ok(name.to_owned())
}

/// One discovery pass: the host root, the GPU library and the warnings so far.
struct Scan<'a> {
    fs: HostFs,
    gpu_library: &'a dyn GpuLibrary,
    warnings: Vec<String>,
}

impl Scan<'_> {
    fn warn(&mut self, err: InventoryError) {
        self.warnings.push(err.to_warning());
    }

    /// The value of `result`, or `None` after recording its error as a warning.
    fn ok<T>(&mut self, result: Result<T, InventoryError>) -> Option<T> {
        result.map_err(|e| self.warn(e)).ok()
    }

    /// `text` as `parse` reads it, or a warning naming `path`.
    fn parsed<T>(
        &mut self,
        path: &Path,
        text: &str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Option<T> {
        let value = parse(text);
        if value.is_none() {
            self.warn(InventoryError::malformed(path, text));
        }
        value
    }

    /// Like `ok`, but a missing file is normal and not worth a warning.
    fn optional<T>(&mut self, result: Result<T, InventoryError>) -> Option<T> {
        match result {
            Err(e) if e.is_not_found() => None,
            other => self.ok(other),
        }
    }
}

#[cfg(test)]
mod discover_tests;
#[cfg(test)]
mod layout_tests;
#[cfg(test)]
mod library_tests;
#[cfg(test)]
mod malformed_tests;
