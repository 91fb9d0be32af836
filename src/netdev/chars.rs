//! An RDMA device's char devices as the host's sysfs lists them now.
//!
//! Moving an RDMA device to another netns in exclusive mode unregisters and
//! registers its clients again (`rdma_dev_change_netns`: `disable_device`,
//! then `enable_device_and_get`, drivers/infiniband/core/device.c), and uverbs
//! and umad take the lowest free minor then (`ida_alloc_max`), which need not
//! be the one the device had: a hole left by another device, or two pods'
//! devices moving at once, renumber it. The container's nodes and cgroup rules
//! were made from the numbers before, so they are checked again after the move.

use std::io;
use std::path::Path;

use super::error::At;
use super::rdma::RdmaNl;
use super::saved::SavedVf;
use super::settings::{CharNum, VfAttach};
use super::vf::VfOps;
use super::{Cause, Netns, VfError};
use crate::inventory::{parse_dev_num, parse_rdma_char_name, PciAddr};

/// The char device classes (not netns-tagged: `ib_class` is, these are not).
const CLASSES: [&str; 2] = ["class/infiniband_verbs", "class/infiniband_mad"];
/// Entries read per class at most (the kernel allows 1024 uverbs devices).
const MAX_ENTRIES: usize = 8192;
/// `ibdev` and `dev` are one short line each.
const MAX_LINE: u64 = 256;

/// The char devices whose `ibdev` is `ibdev`, sorted by name.
pub(super) fn rdma_chars(sys_root: &Path, ibdev: &str) -> Result<Vec<CharNum>, Cause> {
    let mut out = Vec::new();
    for class in CLASSES {
        let dir = sys_root.join(class);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(Cause::Sysfs { path: dir, source }),
        };
        for entry in entries.take(MAX_ENTRIES) {
            let entry = entry.map_err(|source| Cause::Sysfs {
                path: dir.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if parse_rdma_char_name(&name).is_none() {
                continue; // `abi_version`
            }
            // A device unregistered meanwhile is no longer this device's.
            let Some(owner) = line(&entry.path().join("ibdev"))? else {
                continue;
            };
            if owner != ibdev {
                continue;
            }
            let Some(dev) = line(&entry.path().join("dev"))? else {
                continue;
            };
            let num = parse_dev_num(&dev).ok_or_else(|| Cause::Sysfs {
                path: entry.path().join("dev"),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{dev:?} is no device number"),
                ),
            })?;
            out.push(CharNum {
                name,
                major: num.major,
                minor: num.minor,
            });
        }
    }
    out.sort();
    Ok(out)
}

/// RDMA devices one PCI function has at most: a port each (mlx4's two ports
/// share one device), and a soft device or two on its netdev.
const MAX_FUNCTION_DEVICES: usize = 64;

/// The RDMA devices of the PCI function `pci` in the reader's namespace:
/// the entries of `bus/pci/devices/<pci>/infiniband/`, sorted.
pub(super) fn function_rdma(sys_root: &Path, pci: PciAddr) -> Result<Vec<String>, Cause> {
    let dir = sys_root
        .join("bus/pci/devices")
        .join(pci.to_string())
        .join("infiniband");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(Cause::Sysfs { path: dir, source }),
    };
    let mut names = Vec::new();
    for entry in entries.take(MAX_FUNCTION_DEVICES) {
        let entry = entry.map_err(|source| Cause::Sysfs {
            path: dir.clone(),
            source,
        })?;
        names.extend(entry.file_name().to_str().map(str::to_string));
    }
    names.sort();
    Ok(names)
}

/// One trimmed line, `None` when the file is gone.
fn line(path: &Path) -> Result<Option<String>, Cause> {
    match crate::fsutil::read_file_bounded(path, MAX_LINE) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).trim().to_string())),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(Cause::Sysfs {
            path: path.to_path_buf(),
            source: e.into(),
        }),
    }
}

/// The index of the RDMA device an attach moves, found on the host by the
/// name the plan gives it, before the VF is touched: a device gone or
/// renamed since the inventory refuses the VF with nothing changed. `None`
/// when the attach moves none.
pub(super) fn rdma_to_move(
    ops: &mut VfOps<'_>,
    at: &At<'_>,
    a: &VfAttach,
) -> Result<Option<u32>, VfError> {
    if !a.move_rdma {
        return Ok(None);
    }
    let mut rdma = at.step("open rdma netlink", ops.env.rdma(None))?;
    host_index(at, rdma.as_mut(), a).map(Some)
}

fn host_index(at: &At<'_>, rdma: &mut dyn RdmaNl, a: &VfAttach) -> Result<u32, VfError> {
    let name = a.rdma_device.as_deref().unwrap_or_default();
    at.step("find rdma device", rdma.dev_index(name))?
        .ok_or_else(|| {
            (at.err("find rdma device"))(Cause::NotFound {
                what: "rdma device",
                name: name.to_string(),
            })
        })
}

/// Moves the VF's RDMA device into the pod (exclusive mode), the device
/// `rec` saved the index of, then checks its char devices against the
/// container's nodes.
pub(super) fn move_rdma(
    ops: &mut VfOps<'_>,
    at: &At<'_>,
    pod: &Netns,
    rec: &SavedVf,
) -> Result<(), VfError> {
    let a = &rec.attach;
    let name = a.rdma_device.as_deref().unwrap_or_default();
    // The netns mode was checked for the whole batch (`check_rdma_mode`), and
    // cannot change while the pod's namespace exists (rdma_compatdev_set).
    let mut rdma = at.step("open rdma netlink", ops.env.rdma(None))?;
    let index = match rec.rdma_index {
        Some(index) => index,
        None => host_index(at, rdma.as_mut(), a)?,
    };
    at.step("move rdma device", rdma.set_netns(index, pod))?;
    if a.rdma_chars.is_empty() {
        return Ok(());
    }
    let now = at.step("read rdma char devices", ops.env.rdma_chars(name))?;
    let mut want = a.rdma_chars.clone();
    want.sort();
    if !nodes_hold(&want, &now) {
        return Err((at.err("check rdma char devices"))(Cause::RdmaRenumbered(
            Box::new(super::error::Renumbered {
                device: name.to_string(),
                want,
                got: now,
            }),
        )));
    }
    Ok(())
}

/// Every node the container has must still name the device by the same
/// numbers; a char device it was not given (issm unless allowed) is no
/// concern here.
fn nodes_hold(want: &[CharNum], now: &[CharNum]) -> bool {
    want.iter().all(|c| now.contains(c))
}

/// Whether the moved RDMA device's char devices are still those the
/// container's nodes name: a second stage after a crash between the move and
/// its check must not take the VF as attached without it. `now` is the
/// device's name in the pod, which the pod may have changed: the char
/// devices' `ibdev` says the name the device has.
pub(super) fn chars_hold(ops: &mut VfOps<'_>, a: &VfAttach, now: &str) -> Result<bool, Cause> {
    if a.rdma_chars.is_empty() || !a.move_rdma {
        return Ok(true);
    }
    Ok(nodes_hold(&a.rdma_chars, &ops.env.rdma_chars(now)?))
}
