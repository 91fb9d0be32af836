//! Attach step 1: everything a VF's saved record needs, read before any change
//! (see [`super::vf`]).

use super::error::{At, Cause, VfError};
use super::rtnl::{LinkRef, Rtnl};
use super::saved::{SavedLink, SavedNetns, SavedVf, SAVED_VERSION};
use super::settings::VfAttach;

/// The VF's netdev on the host. The name is the inventory's, read before:
/// a netdev that took it since (another VF come home from a pod that is gone,
/// not yet restored) must not go into this pod. Its parent device
/// (IFLA_PARENT_DEV_NAME, Linux 5.16; ethtool's bus_info before, see
/// `ethtool`) names the PCI function it is on, and where the name is gone or
/// another's, the VF's own netdev is found by it: renamed since (udev naming
/// VFs seconds after they appear, an operator). A driver that reports no
/// parent leaves only the name and the MAC to go by.
fn host_netdev(at: &At<'_>, host: &mut dyn Rtnl, a: &VfAttach) -> Result<super::Link, VfError> {
    let vf_bus = a.vf_bus_id.to_string();
    let named = at
        .step("find host netdev", host.link(LinkRef::Name(&a.host_netdev)))?
        .filter(|l| l.name == a.host_netdev);
    let named = match named {
        Some(link) if link.parent.as_ref().is_none_or(|p| *p == vf_bus) => return Ok(link),
        other => other,
    };
    let mut own: Vec<super::Link> = at
        .step("list host netdevs", host.links())?
        .into_iter()
        .filter(|l| l.parent.as_ref() == Some(&vf_bus))
        .collect();
    if own.len() == 1 {
        let link = own.remove(0);
        tracing::info!(vf = %vf_bus, planned = %a.host_netdev, netdev = %link.name, "vf netdev renamed since the plan: found by its pci function");
        return Ok(link);
    }
    Err((at.err("find host netdev"))(match named {
        Some(link) => Cause::OtherDevice {
            name: link.name,
            parent: link.parent.unwrap_or_default(),
        },
        None => Cause::NotFound {
            what: "host netdev",
            name: a.host_netdev.clone(),
        },
    }))
}

/// The PF link named in the plan, refused where its device is known to be
/// another than the VF's PF (`physfn`): PF names can swap between the plan
/// and the hook (`net.ifnames=0` and a driver reload), and the VF settings
/// would then go to another PF's VF of the same number, perhaps another
/// tenant's, while this VF went into the pod without them.
fn check_pf(
    at: &At<'_>,
    pf: &super::Link,
    physfn: Option<crate::inventory::PciAddr>,
    a: &VfAttach,
) -> Result<(), VfError> {
    match (&pf.parent, physfn) {
        (Some(device), Some(its)) if *device != its.to_string() => {
            Err((at.err("check pf"))(Cause::NotItsPf {
                pf: pf.name.clone(),
                vf: a.vf_bus_id.to_string(),
                devices: Box::new((device.clone(), its.to_string())),
            }))
        }
        _ => Ok(()),
    }
}

/// Reads everything the record needs; changes nothing. `physfn`: the VF's
/// PF as sysfs names it, where it does.
pub(super) fn prepare(
    at: &At<'_>,
    host: &mut dyn Rtnl,
    pod_nl: &mut dyn Rtnl,
    container_id: &str,
    netns: SavedNetns,
    a: &VfAttach,
    physfn: Option<crate::inventory::PciAddr>,
) -> Result<SavedVf, VfError> {
    let link = host_netdev(at, host, a)?;
    let taken = at.step(
        "check container name",
        pod_nl.link(LinkRef::Name(&a.container_ifname)),
    )?;
    if taken.is_some() {
        return Err((at.err("check container name"))(Cause::NameTaken {
            name: a.container_ifname.clone(),
        }));
    }
    let pf_link = match a.pf_netdev.as_str() {
        "" => None,
        pf => at.step("find pf", host.link(LinkRef::Name(pf)))?,
    };
    let (pf, pf_index, pf_parent) = match &pf_link {
        Some(l) => {
            check_pf(at, l, physfn, a)?;
            let state = at.step("read pf vf state", host.vf_state(l.index, a.vf_index))?;
            let state = state.ok_or_else(|| {
                (at.err("read pf vf state"))(Cause::NoVf {
                    pf: a.pf_netdev.clone(),
                    index: a.vf_index,
                })
            })?;
            (Some(state), Some(l.index), l.parent.clone())
        }
        None => {
            // Without a PF only the netdev MAC can be set; anything else would be silently lost.
            if !a.pf_netdev.is_empty() {
                tracing::warn!(
                    pf = %a.pf_netdev, vf = %a.vf_bus_id,
                    "pf netdev not on the host: no pf-side vf settings, the mac is set on the vf netdev only"
                );
            }
            let mut config = a.settings.pf_config();
            config.mac = None;
            if !config.is_empty() {
                return Err((at.err("find pf"))(Cause::NoPf {
                    pf: a.pf_netdev.clone(),
                }));
            }
            (None, None, None)
        }
    };
    Ok(SavedVf {
        version: SAVED_VERSION,
        container_id: container_id.to_string(),
        attach: a.clone(),
        netns,
        host: SavedLink {
            name: link.name,
            index: link.index,
            mac: link.mac,
            mtu: link.mtu,
            up: link.up,
            parent: link.parent,
            altnames: Some(link.altnames),
        },
        pf,
        pf_index,
        pf_parent,
        // Read with the RDMA netlink, by the attach (`chars::rdma_to_move`).
        rdma_index: None,
        saved_unix: crate::ledger::now_unix(),
        restoring: false,
        attaching: true,
    })
}
