//! Putting a VF's RDMA device back (exclusive netns mode): out of the pod's
//! namespace, under the name it had on the host.
//!
//! The device is found by the index its record saved at the attach, which
//! the kernel keeps for the device's life (`assign_name`: `xa_alloc_cyclic`).
//! A pod with CAP_NET_ADMIN may rename the device in its namespace, and a
//! device of another's making may take the old name meanwhile: found by
//! name, the first would stay in the pod (and the VF quarantined for good)
//! and the second would be taken for the VF's. Records from before the index
//! was saved find it by name, as they did. A device made anew while away
//! (a new index) is found as its function's.

use super::error::{At, Cause, VfError};
use super::netns::Netns;
use super::nl::NlError;
use super::rdma::{NetnsMode, RdmaNl};
use super::saved::SavedVf;
use super::vf::VfOps;

/// The record's RDMA device as `rdma` sees it: `(index, name now)`.
pub(crate) fn find_rdma(
    rdma: &mut dyn RdmaNl,
    rec: &SavedVf,
) -> Result<Option<(u32, String)>, NlError> {
    match rec.rdma_index {
        Some(index) => Ok(rdma.dev_name(index)?.map(|name| (index, name))),
        None => {
            let name = rec.attach.rdma_device.as_deref().unwrap_or_default();
            Ok(rdma.dev_index(name)?.map(|index| (index, name.to_string())))
        }
    }
}

pub(super) fn restore_rdma(
    ops: &mut VfOps<'_>,
    at: &At<'_>,
    rec: &SavedVf,
    pod: Option<&Netns>,
) -> Result<(), VfError> {
    let name = rec.attach.rdma_device.as_deref().unwrap_or_default();
    // Without RDMA netlink there is no RDMA core, so nothing was moved (an
    // attach that failed opening it is being rolled back).
    let unsupported = |c: &Cause| matches!(c, Cause::Netlink(e) if e.is_unsupported());
    if let Some(pod) = pod {
        // Exclusive mode hides the device from other namespaces: ask inside the pod's.
        let mut rdma = match ops.env.rdma(Some(pod)) {
            Err(c) if unsupported(&c) => return Ok(()),
            other => at.step("open pod rdma netlink", other)?,
        };
        // Shared mode: the device never left the host, and the kernel refuses
        // to move it (ib_device_set_netns_put); the mode cannot change while
        // a namespace other than the host's exists (rdma_compatdev_set).
        if at.step("read rdma netns mode", rdma.netns_mode())? == NetnsMode::Shared {
            return Ok(());
        }
        if let Some((index, _)) = at.step("find rdma device", find_rdma(rdma.as_mut(), rec))? {
            let host = ops.env.host_netns();
            at.step("return rdma device", rdma.set_netns(index, host))?;
        }
    }
    // Returned above, or gone with its netns: rdma_dev_exit_net returns it
    // to init_net under the name it has.
    let mut rdma = match ops.env.rdma(None) {
        Err(c) if unsupported(&c) => return Ok(()),
        other => at.step("open host rdma netlink", other)?,
    };
    let found = match at.step("find rdma device", find_rdma(rdma.as_mut(), rec))? {
        Some(found) => Some(found),
        None => remade(ops, at, rdma.as_mut(), rec)?,
    };
    match found {
        Some((_, now)) if now == name => Ok(()),
        Some((index, now)) => rename_back(at, rdma.as_mut(), rec, index, &now),
        // An attach that never finished and whose device is nowhere never
        // moved it: the move looks the device up on the host first, and a
        // name gone from the host (renamed or removed since the inventory
        // was read) fails it there. Kept as an error, such a record would
        // hold the VF down and quarantined for good. After a finished attach
        // the device went into the pod, and missing now it may be hidden in
        // a namespace of the pod's making: the record stays.
        None if rec.attaching => {
            tracing::warn!(vf = %rec.attach.vf_bus_id, rdma = name, "rdma device found nowhere: the unfinished attach never moved it");
            Ok(())
        }
        None => Err((at.err("find rdma device"))(Cause::NotFound {
            what: "rdma device",
            name: name.to_string(),
        })),
    }
}

/// The VF's RDMA device made anew while the pod ran (a driver rebind, a
/// devlink reload, the driver's recovery from a firmware fault): the saved
/// index names nothing, and the device is registered in the host's
/// namespace under a new index, the VF's function its parent. One device of
/// the function is taken for it; none or several, no guess.
fn remade(
    ops: &mut VfOps<'_>,
    at: &At<'_>,
    rdma: &mut dyn RdmaNl,
    rec: &SavedVf,
) -> Result<Option<(u32, String)>, VfError> {
    let names = at.step(
        "read vf's rdma devices",
        ops.env.vf_rdma(rec.attach.vf_bus_id),
    )?;
    let [now] = names.as_slice() else {
        return Ok(None);
    };
    let Some(index) = at.step("find rdma device", rdma.dev_index(now))? else {
        return Ok(None);
    };
    tracing::info!(vf = %rec.attach.vf_bus_id, rdma = now.as_str(), index, "the vf's rdma device was made anew while away");
    Ok(Some((index, now.clone())))
}

/// Renamed while away: the host's name put back, since the inventory names
/// devices by it. A name that a device in another namespace holds (one of
/// the pod's making) is refused (EEXIST, `ib_device_rename`) until that
/// namespace goes, and the record stays for a later try. A name a device on
/// the host took meanwhile is never freed: the device stays under the name
/// it has, which the inventory reads next time.
fn rename_back(
    at: &At<'_>,
    rdma: &mut dyn RdmaNl,
    rec: &SavedVf,
    index: u32,
    now: &str,
) -> Result<(), VfError> {
    let name = rec.attach.rdma_device.as_deref().unwrap_or_default();
    tracing::info!(vf = %rec.attach.vf_bus_id, rdma = name, renamed = now, "rdma device renamed while away: its name put back");
    match rdma.rename(index, name) {
        Err(e) if e.errno() == Some(libc::EEXIST) && host_holds(rdma, name) => {
            tracing::warn!(vf = %rec.attach.vf_bus_id, rdma = name, kept = now, "a host rdma device took the name: the vf's keeps the name it has");
            Ok(())
        }
        other => at.step("rename rdma device", other),
    }
}

fn host_holds(rdma: &mut dyn RdmaNl, name: &str) -> bool {
    matches!(rdma.dev_index(name), Ok(Some(_)))
}
