//! Attaching VFs to a pod namespace, as one transaction.
//!
//! Per VF (sriov-cni `cmdAdd` + rdma-cni `cmdAdd`, in that order):
//! 1. lock the VF and save its state (host link, PF admin view) before any change;
//! 2. apply the PF-side settings (VLAN, MAC, rate, spoofchk, trust, link state:
//!    sriov-cni `ApplyVFConfig` order);
//! 3. move the netdev into the pod netns and rename it in one RTM_SETLINK
//!    (`do_setlink` moves it under its host name, then renames it, so a rename
//!    that fails leaves the host name in the pod: the restore looks for both
//!    names); drop the old name if it stayed as an altname (sriov-cni #445);
//! 4. set MAC, MTU, bring it up;
//! 5. in exclusive RDMA mode, move the RDMA device too.
//!
//! The saved record is the undo log: any failure runs the detach path over it
//! (`restore`), which puts back whatever was changed. VFs already attached in
//! the same call are detached too, newest first.

use std::path::Path;
use std::time::Duration;

use super::error::{At, Cause, VfError};
use super::netns::Netns;
use super::nl::NlError;
use super::rdma::NetnsMode;
use super::restore::{is_ours, restore};
use super::rtnl::{LinkChange, LinkRef, Rtnl};
use super::saved::{SavedNetns, SavedStore, SavedVf};
use super::settings::{VfAttach, VfConfig};
use super::vf_prepare::prepare;
use super::vfinfo::VfField;
use super::NetEnv;
use crate::inventory::PciAddr;

/// i40e/iavf apply a VF MAC asynchronously through the PF, and the VF may
/// refuse one (EAGAIN, EBUSY) while it resets: sriov-cni retries 20×100 ms.
const MAC_TRIES: u32 = 20;
const MAC_RETRY: Duration = Duration::from_millis(100);

/// What attach and detach work with.
pub struct VfOps<'a> {
    pub env: &'a mut dyn NetEnv,
    pub store: &'a SavedStore,
    /// Called with the name of each attach stage once it is done ("save", "pf",
    /// "move", "configure", "rdma"); the hook's fault injection uses it.
    pub checkpoint: &'a dyn Fn(&'static str),
}

/// Attaches every VF of `actions` to `pod` for `container_id`, all or nothing.
/// `pod_path` is saved to find the namespace again at detach.
pub fn attach_all(
    ops: &mut VfOps<'_>,
    container_id: &str,
    pod: &Netns,
    pod_path: Option<&Path>,
    actions: &[VfAttach],
) -> Result<(), VfError> {
    check_batch(actions)?;
    check_own_netns(ops, pod, actions)?;
    check_rdma_mode(ops, actions)?;
    let mut done: Vec<PciAddr> = Vec::new();
    for action in actions {
        let at = At {
            vf: action.vf_bus_id,
            netdev: &action.host_netdev,
        };
        let saved_ns = SavedNetns {
            id: pod.id(),
            path: pod_path.map(Path::to_path_buf),
        };
        if let Err(e) = attach_one(ops, &at, container_id, pod, saved_ns, action) {
            let rollbacks = done
                .iter()
                .rev()
                .filter_map(|vf| {
                    super::restore::detach_vf(ops, *vf, &|r| Ok(r.container_id == container_id))
                        .err()
                })
                .collect();
            return Err(VfError::with(e, rollbacks));
        }
        done.push(action.vf_bus_id);
    }
    Ok(())
}

fn check_batch(actions: &[VfAttach]) -> Result<(), VfError> {
    let mut seen = std::collections::HashSet::new();
    for a in actions {
        let at = At {
            vf: a.vf_bus_id,
            netdev: &a.host_netdev,
        };
        at.step("validate", a.validate())?;
        for (what, value) in [
            ("vf", a.vf_bus_id.to_string()),
            ("host netdev", a.host_netdev.clone()),
            ("container interface", a.container_ifname.clone()),
        ] {
            if !seen.insert((what, value.clone())) {
                return Err((at.err("validate"))(Cause::Duplicate { what, value }));
            }
        }
    }
    Ok(())
}

/// In shared mode the kernel moves no RDMA device (ib_device_set_netns_put);
/// refused before any VF is touched, rather than after its netdev moved.
/// A pod in the host's namespace (hostNetwork) cannot take a VF: moving a
/// netdev to the namespace it is in is a no-op for the kernel
/// (`__dev_change_net_namespace` returns early on `net_eq`), so the rename and
/// settings that follow would land on the host, visible to every process there.
fn check_own_netns(ops: &mut VfOps<'_>, pod: &Netns, actions: &[VfAttach]) -> Result<(), VfError> {
    match actions.first() {
        Some(a) if pod.id() == ops.env.host_netns().id() => {
            let at = At {
                vf: a.vf_bus_id,
                netdev: &a.host_netdev,
            };
            Err((at.err("check pod netns"))(Cause::HostNetns))
        }
        _ => Ok(()),
    }
}

fn check_rdma_mode(ops: &mut VfOps<'_>, actions: &[VfAttach]) -> Result<(), VfError> {
    let Some(a) = actions.iter().find(|a| a.move_rdma) else {
        return Ok(());
    };
    let at = At {
        vf: a.vf_bus_id,
        netdev: &a.host_netdev,
    };
    let mut rdma = at.step("open rdma netlink", ops.env.rdma(None))?;
    if at.step("read rdma netns mode", rdma.netns_mode())? != NetnsMode::Exclusive {
        return Err((at.err("move rdma device"))(Cause::RdmaShared));
    }
    Ok(())
}

fn attach_one(
    ops: &mut VfOps<'_>,
    at: &At<'_>,
    container_id: &str,
    pod: &Netns,
    saved_ns: SavedNetns,
    a: &VfAttach,
) -> Result<(), VfError> {
    let _lock = at.step("lock", ops.store.lock(a.vf_bus_id))?;
    let mut host = at.step("open host netlink", ops.env.rtnl(None))?;
    let mut pod_nl = at.step("open pod netlink", ops.env.rtnl(Some(pod)))?;
    if let Some(rec) = at.step("read saved state", ops.store.load(a.vf_bus_id))? {
        let same_ns = rec.netns.id == pod.id();
        // Another container's record in this pod's namespace is an earlier
        // network owner of the pod whose restore did not finish: the plugin
        // made this container the owner, so it takes the VF over, restored
        // below, then attached again. (A dead namespace's identity can be
        // reused; such a record's pod is gone, and restoring it is what that
        // pod's release would do. The ledger's claims decide which VFs this
        // pod's actions name.) Anywhere else, the VF is another pod's.
        if rec.container_id != container_id && !same_ns {
            return Err((at.err("check holder"))(Cause::Held {
                holder: rec.container_id,
            }));
        }
        // A second stage (prestart and createRuntime) or a retry: done already?
        // Only a finished attach counts: one cut after the link came up and
        // before its mark is done again rather than marked from a look; and
        // never one whose restore began, which may have reset its PF
        // settings (the tenant VLAN) while a pod process raised it again.
        if rec.container_id == container_id
            && same_ns
            && !rec.cut()
            && rec.attach.saved_form() == a.saved_form()
            && attached(ops, pod, pod_nl.as_mut(), &rec, a)
        {
            tracing::debug!(vf = %a.vf_bus_id, container = container_id, "vf already attached");
            return Ok(());
        }
        // Half done (a crash), different, or an earlier owner's: put it back,
        // then start over.
        restore(ops, &rec, same_ns.then_some(pod))?;
    }
    let physfn = at.step("read vf's pf", ops.env.vf_physfn(a.vf_bus_id))?;
    let mut rec = prepare(
        at,
        host.as_mut(),
        pod_nl.as_mut(),
        container_id,
        saved_ns,
        a,
        physfn,
    )?;
    rec.rdma_index = super::chars::rdma_to_move(ops, at, a)?;
    at.step("save state", ops.store.save(&rec))?;
    (ops.checkpoint)("save");
    let applied = apply(ops, at, host.as_mut(), pod_nl.as_mut(), pod, &rec).and_then(|()| {
        let whole = SavedVf {
            attaching: false,
            ..rec.clone()
        };
        at.step("mark attached", ops.store.save(&whole))
    });
    let Err(failed) = applied else {
        tracing::info!(
            vf = %a.vf_bus_id,
            netdev = %a.host_netdev,
            ifname = %a.container_ifname,
            container = container_id,
            netns = %pod.id(),
            "vf attached"
        );
        return Ok(());
    };
    match restore(ops, &rec, Some(pod)) {
        Ok(()) => Err(failed),
        Err(rollback) => match failed {
            VfError::Step {
                vf,
                netdev,
                step,
                cause,
            } => Err(VfError::Rollback {
                vf,
                netdev,
                step,
                cause,
                rollback: Box::new(rollback),
            }),
            other => Err(VfError::with(other, vec![rollback])),
        },
    }
}

/// True when the VF is in the pod under its container name and up, and its
/// RDMA device, where it moves, is there too with the char devices the
/// container's nodes name (`a`'s, which records do not keep): the move
/// comes last, so a run cut short after the link came up has the netdev in
/// place without it.
fn attached(
    ops: &mut VfOps<'_>,
    pod: &Netns,
    pod_nl: &mut dyn Rtnl,
    rec: &SavedVf,
    a: &VfAttach,
) -> bool {
    let netdev = matches!(
        pod_nl.link(LinkRef::Name(&rec.attach.container_ifname)),
        Ok(Some(l)) if l.up && is_ours(&l, rec)
    );
    if !netdev || !rec.attach.move_rdma {
        return netdev;
    }
    // The connection keeps this thread in the pod's namespace: dropped
    // before the char devices are read.
    let found = ops
        .env
        .rdma(Some(pod))
        .ok()
        .and_then(|mut nl| super::restore::find_rdma(nl.as_mut(), rec).ok().flatten());
    found.is_some_and(|(_, now)| super::chars::chars_hold(ops, a, &now).unwrap_or(false))
}

/// The PF-side fields to send, in sriov-cni `ApplyVFConfig` order.
pub(crate) fn vf_fields(config: &VfConfig) -> Vec<VfField> {
    let mut out = Vec::new();
    out.extend(config.vlan.map(VfField::Vlan));
    out.extend(config.mac.clone().map(VfField::Mac));
    out.extend(config.rate.map(VfField::Rate));
    out.extend(config.spoofchk.map(VfField::SpoofChk));
    out.extend(config.trust.map(VfField::Trust));
    out.extend(config.link_state.map(VfField::LinkState));
    out
}

fn apply(
    ops: &mut VfOps<'_>,
    at: &At<'_>,
    host: &mut dyn Rtnl,
    pod_nl: &mut dyn Rtnl,
    pod: &Netns,
    rec: &SavedVf,
) -> Result<(), VfError> {
    let a = &rec.attach;
    if let Some(pf_index) = rec.pf_index {
        for field in vf_fields(&a.settings.pf_config()) {
            at.step(field.step(), host.set_vf(pf_index, a.vf_index, &field))?;
        }
    }
    (ops.checkpoint)("pf");
    let to_pod = LinkChange {
        netns: Some(pod),
        name: Some(&a.container_ifname),
        ..LinkChange::default()
    };
    at.step("move to pod netns", host.set_link(rec.host.index, &to_pod))?;
    (ops.checkpoint)("move");
    let link = at
        .step(
            "find moved netdev",
            pod_nl.link(LinkRef::Name(&a.container_ifname)),
        )?
        .ok_or_else(|| {
            (at.err("find moved netdev"))(Cause::NotFound {
                what: "pod netdev",
                name: a.container_ifname.clone(),
            })
        })?;
    if link.altnames.contains(&rec.host.name) {
        at.step(
            "delete altname",
            pod_nl.del_altname(link.index, &rec.host.name),
        )?;
    }
    // Before the MAC and the link go up: both send the gratuitous ARP.
    at.step(
        "set arp_notify",
        ops.env.set_arp_notify(pod, &a.container_ifname),
    )?;
    if let Some(mac) = &a.settings.mac {
        set_mac(at, pod_nl, link.index, mac)?;
    }
    if let Some(mtu) = a.settings.mtu {
        let change = LinkChange {
            mtu: Some(mtu),
            ..LinkChange::default()
        };
        at.step("set mtu", pod_nl.set_link(link.index, &change))?;
    }
    let up = LinkChange {
        up: Some(true),
        ..LinkChange::default()
    };
    at.step("bring up", pod_nl.set_link(link.index, &up))?;
    (ops.checkpoint)("configure");
    if a.move_rdma {
        super::chars::move_rdma(ops, at, pod, rec)?;
    }
    (ops.checkpoint)("rdma");
    Ok(())
}

fn set_mac(at: &At<'_>, nl: &mut dyn Rtnl, index: u32, mac: &super::HwAddr) -> Result<(), VfError> {
    let change = LinkChange {
        mac: Some(mac),
        ..LinkChange::default()
    };
    let mut got = String::new();
    for attempt in 0..MAC_TRIES {
        if attempt > 0 {
            std::thread::sleep(MAC_RETRY);
        }
        match nl.set_link(index, &change) {
            // A VF still resetting after its PF-side MAC was set (i40e,
            // ice) may refuse for a while, as its read-back may lag:
            // sriov-cni's retry covers both, and so does this one.
            Err(e) if transient(&e) && attempt + 1 < MAC_TRIES => continue,
            done => at.step("set mac", done)?,
        }
        let now = at.step("set mac", nl.link(LinkRef::Index(index)))?;
        match now.and_then(|l| l.mac) {
            Some(m) if m == *mac => return Ok(()),
            other => got = other.map(|m| m.to_string()).unwrap_or_default(),
        }
    }
    Err((at.err("set mac"))(Cause::MacNotApplied {
        want: mac.to_string(),
        got,
    }))
}

/// An answer a VF gives while its driver is busy resetting it.
fn transient(e: &NlError) -> bool {
    matches!(e.errno(), Some(libc::EAGAIN | libc::EBUSY))
}
