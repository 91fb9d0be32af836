//! Putting a VF back from its saved record: detach at poststop and pod removal,
//! and the rollback of a failed attach. Every step compares with the saved state
//! and only changes what differs, so it is idempotent: a second run, a run after
//! a failed attach, or a run with no record changes nothing.
//!
//! Order: a VF still in its live pod is brought down there first, so that no
//! traffic leaves the pod once its tenant VLAN and spoof check are gone (other
//! containers of the pod may still run in the netns); then the RDMA device
//! (dranet #177 / PR #180: from a socket inside the pod netns); then the
//! netdev moves home, down, before anything of the PF side changes: a move
//! the kernel refuses (a name the pod gave it, taken on the host) leaves it
//! whole in its pod, tenant VLAN and spoof check kept, never in the pod
//! without them; then the PF-side settings (sriov-cni resets the VF config
//! before the netdev's own settings: some drivers refuse a MAC change while
//! the admin MAC pins it), then the netdev's name, MAC, MTU and link state
//! on the host. The netdev is found wherever it is: in the
//! pod netns under its container name; or, when the netns is gone, on the host
//! where the kernel put it back (`default_device_exit_net`: its pod name, or
//! `dev<ifindex>` when that is taken). Each stage runs even if an earlier one
//! failed; any failure keeps the record so the VF can be quarantined and retried.
//! A VF found neither in its pod nor on the host changes nothing: it may be up
//! wherever it is.

use std::time::Duration;

use super::error::{At, Cause, VfError};
use super::netns::Netns;
pub(crate) use super::restore_find::is_ours;
use super::restore_find::{foreign_altnames, host_name_free, locate};
pub(crate) use super::restore_rdma::find_rdma;
use super::restore_rdma::restore_rdma;
use super::rtnl::{Link, LinkChange, LinkRef, Rtnl};
use super::saved::SavedVf;
use super::vf::{vf_fields, VfOps};
use crate::inventory::PciAddr;

/// Detaches the VFs `vfs` found in the records of `container_id`
/// ([`super::SavedStore::vfs_of`], or a caller's own scan, so that they are
/// listed once): each record is read again under its VF's lock and restored
/// only while still the container's. Returns how many were restored.
pub fn detach_listed(
    ops: &mut VfOps<'_>,
    container_id: &str,
    vfs: &[PciAddr],
) -> Result<usize, VfError> {
    let mut restored = 0;
    let mut errors = Vec::new();
    for &vf in vfs {
        match detach_vf(ops, vf, &|r| Ok(r.container_id == container_id)) {
            Ok(true) => restored += 1,
            Ok(false) => {}
            Err(e) => errors.push(e),
        }
    }
    match VfError::all(errors) {
        None => Ok(restored),
        Some(e) => Err(e),
    }
}

/// Detaches one VF if it has a record `ours` accepts (asked under the VF's
/// lock, once the record is read). Returns whether there was
/// anything to restore.
pub fn detach_vf(
    ops: &mut VfOps<'_>,
    vf: PciAddr,
    ours: &dyn Fn(&SavedVf) -> Result<bool, Cause>,
) -> Result<bool, VfError> {
    let at = At { vf, netdev: "" };
    let _lock = at.step("lock", ops.store.lock(vf))?;
    let Some(rec) = at.step("read saved state", ops.store.load(vf))? else {
        return Ok(false);
    };
    if !at.step("check the record's container", ours(&rec))? {
        return Ok(false);
    }
    restore(ops, &rec, None)?;
    Ok(true)
}

/// Restores `rec` and drops it. `pod` is the pod netns when the caller holds it;
/// otherwise it is looked up from the record.
pub(crate) fn restore(
    ops: &mut VfOps<'_>,
    rec: &SavedVf,
    pod: Option<&Netns>,
) -> Result<(), VfError> {
    let at = At {
        vf: rec.vf(),
        netdev: &rec.host.name,
    };
    let found;
    let pod = match pod {
        Some(p) => Some(p),
        None => {
            found = ops.env.find_netns(&rec.netns);
            found.as_ref()
        }
    };
    let mut host = at.step("open host netlink", ops.env.rtnl(None))?;
    // What only reads comes before the mark: a VF still in its pod whose
    // host name is taken (or whose pod netlink fails) was not touched, and
    // stays whole there for the pod's next container (README: an owner whose
    // restore failed before it touched them keeps the network).
    let found = match pod {
        Some(pod) => find_in_pod(ops, &at, host.as_mut(), rec, pod)?,
        // A record marked restoring was looked for already, right after
        // its namespace went.
        None if !rec.restoring => {
            wait_home(ops, host.as_mut(), rec);
            None
        }
        None => None,
    };
    if !rec.restoring {
        let marked = SavedVf {
            restoring: true,
            ..rec.clone()
        };
        at.step("mark restoring", ops.store.save(&marked))?;
    }
    let in_pod = found.is_some();
    match found {
        Some((mut pod_nl, link)) if link.up => {
            at.step("bring down", pod_nl.set_link(link.index, &down()))?;
        }
        Some(_) => {}
        // Not in its pod: in neither place, it stays marked (cut), since
        // the pod no longer has it whole.
        None => found_on_host(&at, host.as_mut(), rec)?,
    }
    let mut errors = Vec::new();
    if rec.attach.move_rdma {
        errors.extend(restore_rdma(ops, &at, rec, pod).err());
    }
    if let (true, Some(pod)) = (in_pod, pod) {
        if let Err(e) = bring_home(ops, &at, host.as_mut(), rec, pod) {
            // Nothing of the PF side changed: the VF stays whole in its pod.
            errors.push(e);
            let first = errors.remove(0);
            return Err(VfError::with(first, errors));
        }
    }
    errors.extend(restore_pf(&at, host.as_mut(), rec).err());
    // A VF whose RDMA device or PF settings (the tenant's VLAN, MAC, trust)
    // could not be put back comes home but stays down until a later detach
    // restores it whole: up on the host, it would carry the tenant's traffic.
    let whole = errors.is_empty();
    errors.extend(restore_netdev(&at, host.as_mut(), rec, whole).err());
    if let Some(e) = VfError::all(errors) {
        return Err(e);
    }
    at.step("drop saved state", ops.store.remove(rec.vf()))?;
    tracing::info!(
        vf = %rec.vf(),
        netdev = %rec.host.name,
        container = %rec.container_id,
        netns_alive = pod.is_some(),
        "vf restored"
    );
    Ok(())
}

/// A VF neither in its live pod nor on the host is somewhere else, perhaps
/// up: in a namespace a container with NET_ADMIN made, or in a pod's netns
/// that outlived its pinned path. Its PF settings (the tenant VLAN, spoof
/// check) and RDMA device stay as they are, and so does the record, until a
/// later try finds it: resetting them would leave it up without them.
fn found_on_host(at: &At<'_>, host: &mut dyn Rtnl, rec: &SavedVf) -> Result<(), VfError> {
    match at.step("find netdev on host", locate(host, rec, &home_names(rec)))? {
        Some(_) => Ok(()),
        None => Err((at.err("find netdev"))(Cause::Lost {
            name: rec.host.name.clone(),
        })),
    }
}

/// The names a VF comes home under: its own, or the one it had in its pod
/// (a namespace's cleanup keeps that one where the host has it free).
fn home_names(rec: &SavedVf) -> [&str; 2] {
    [rec.host.name.as_str(), &rec.attach.container_ifname]
}

/// How long the VFs of one restore, whose namespace is gone, are looked for
/// on the host in all before they count as lost, and how often.
pub(crate) const HOME_WAIT: Duration = Duration::from_secs(1);
const HOME_STEP: Duration = Duration::from_millis(20);

/// A VF whose pod namespace can no longer be found comes home when the
/// kernel's namespace cleanup gets to it: a workqueue run after the last
/// reference drops (`cleanup_net`, net/core/net_namespace.c, after
/// `synchronize_rcu`; `default_device_exit_net` moves it). podman runs
/// poststop hooks right after tearing its container's network down
/// (`--rm`), so the hook may look in between. It is looked for before
/// anything is marked, up to [`HOME_WAIT`] for all of one restore's VFs, a
/// record not yet marked only; [`found_on_host`] judges it after.
fn wait_home(ops: &mut VfOps<'_>, host: &mut dyn Rtnl, rec: &SavedVf) {
    while ops.env.paused() < HOME_WAIT {
        // A lookup that fails is left to `found_on_host`, after the mark.
        if !matches!(locate(host, rec, &home_names(rec)), Ok(None)) {
            break;
        }
        ops.env.pause(HOME_STEP);
    }
}

/// A VF found in its pod: the pod's netlink, and the link there.
type InPod = (Box<dyn Rtnl>, Link);

/// A VF still in its live pod comes home only under its saved name. When that
/// name is taken on the host, nothing is touched: the VF stays whole in the
/// pod (its PF settings such as the tenant VLAN, its RDMA device) and the
/// record stays, unmarked, for a later try, rather than a netdev left up in
/// the pod without its isolation. Otherwise the caller brings it down in the
/// pod before anything else changes. The pod's netlink and the link, when
/// it is there.
fn find_in_pod(
    ops: &mut VfOps<'_>,
    at: &At<'_>,
    host: &mut dyn Rtnl,
    rec: &SavedVf,
    pod: &Netns,
) -> Result<Option<InPod>, VfError> {
    let (pod_nl, in_pod) = in_pod(ops, at, rec, pod)?;
    let Some(link) = in_pod else {
        return Ok(None);
    };
    host_name_free(at, host, rec, None)?;
    Ok(Some((pod_nl, link)))
}

/// Moves a VF found in its live pod home under its saved name, before its
/// PF settings are reset. A name it holds that the host has would fail the
/// move (`__dev_change_net_namespace` checks altnames too, net/core/dev.c):
/// the names the pod gave it go, and so does a saved altname another host
/// link took meanwhile, as the kernel drops one when a dying netns hands a
/// device back (`default_device_exit_net`). Read again here, not at
/// [`find_in_pod`]: the pod's containers may have named it since. The
/// kernel closes a device it moves (`dev_close`), so it arrives down
/// whatever the pod did since it was brought down.
fn bring_home(
    ops: &mut VfOps<'_>,
    at: &At<'_>,
    host: &mut dyn Rtnl,
    rec: &SavedVf,
    pod: &Netns,
) -> Result<(), VfError> {
    let (mut pod_nl, in_pod) = in_pod(ops, at, rec, pod)?;
    let Some(link) = in_pod else {
        // Gone from the pod since it was brought down there: a container
        // with NET_ADMIN moved it into a namespace of its own, or renamed it
        // past finding. Its PF settings are reset only once it is on the
        // host; anywhere else it may be up, and keeps them.
        return found_on_host(at, host, rec);
    };
    let mut dropped = foreign_altnames(&link, rec);
    for name in &link.altnames {
        if !dropped.contains(&name.as_str())
            && at
                .step("check host altname", host.link(LinkRef::Name(name)))?
                .is_some()
        {
            dropped.push(name);
        }
    }
    for name in dropped {
        at.step("delete altname", pod_nl.del_altname(link.index, name))?;
    }
    let home = LinkChange {
        netns: Some(ops.env.host_netns()),
        name: Some(&rec.host.name),
        ..LinkChange::default()
    };
    at.step("move to host netns", pod_nl.set_link(link.index, &home))
}

/// Netlink in the pod's netns, and the VF there under its pod or host name.
fn in_pod(
    ops: &mut VfOps<'_>,
    at: &At<'_>,
    rec: &SavedVf,
    pod: &Netns,
) -> Result<(Box<dyn Rtnl>, Option<Link>), VfError> {
    let names = [rec.attach.container_ifname.as_str(), &rec.host.name];
    let mut pod_nl = at.step("open pod netlink", ops.env.rtnl(Some(pod)))?;
    let link = at.step("find netdev in pod", locate(pod_nl.as_mut(), rec, &names))?;
    Ok((pod_nl, link))
}

fn restore_pf(at: &At<'_>, host: &mut dyn Rtnl, rec: &SavedVf) -> Result<(), VfError> {
    let (Some(state), Some(pf_index)) = (&rec.pf, rec.pf_index) else {
        return Ok(());
    };
    let pf = super::find_pf::find_pf(at, host, pf_index, rec)?;
    let now = at.step(
        "read pf vf state",
        host.vf_state(pf.index, rec.attach.vf_index),
    )?;
    let restore = state.restore_config(&rec.attach.settings.pf_config());
    for field in vf_fields(&restore) {
        if now.as_ref().is_some_and(|n| same(n, &field)) {
            continue;
        }
        match host.set_vf(pf.index, rec.attach.vf_index, &field) {
            // do_setvfinfo: EOPNOTSUPP where the driver has no setter. A
            // setting it neither reported before the pod nor reports now, nor
            // sets, was not the pod's to change either (its attach failed
            // there): nothing to restore.
            Err(e)
                if e.errno() == Some(libc::EOPNOTSUPP)
                    && unreported(state, now.as_ref(), &field) =>
            {
                tracing::debug!(step = field.step(), "not supported by the driver: left");
            }
            other => at.step(field.step(), other)?,
        }
    }
    Ok(())
}

/// Whether the PF left `field`'s setting unreported, both before the pod
/// (`saved`) and now (spoof checking and trust only).
fn unreported(
    saved: &super::vfinfo::VfState,
    now: Option<&super::vfinfo::VfState>,
    field: &super::VfField,
) -> bool {
    use super::VfField as F;
    let both = |flag: fn(&super::vfinfo::VfState) -> Option<bool>| {
        flag(saved).is_none() && now.is_some_and(|n| flag(n).is_none())
    };
    match field {
        F::SpoofChk(_) => both(|s| s.spoofchk),
        F::Trust(_) => both(|s| s.trust),
        _ => false,
    }
}

/// Whether the PF already reports `field`'s value.
fn same(now: &super::vfinfo::VfState, field: &super::VfField) -> bool {
    use super::VfField as F;
    match field {
        F::Mac(m) => now.mac == *m,
        F::Vlan(v) => now.vlan == *v,
        F::Rate(r) => now.rate == *r,
        F::SpoofChk(s) => now.spoofchk == Some(*s),
        F::Trust(t) => now.trust == Some(*t),
        F::LinkState(l) => now.link_state == *l,
    }
}

/// The VF's netdev on the host (brought home, or handed back by the kernel
/// with its netns) gets its saved name, MAC, MTU and link state.
fn restore_netdev(
    at: &At<'_>,
    host: &mut dyn Rtnl,
    rec: &SavedVf,
    whole: bool,
) -> Result<(), VfError> {
    let saved = &rec.host;
    let ifname = rec.attach.container_ifname.as_str();
    let found = at.step(
        "find netdev on host",
        locate(host, rec, &[&saved.name, ifname]),
    )?;
    let mut link = found.ok_or_else(|| {
        (at.err("find netdev"))(Cause::NotFound {
            what: "vf netdev",
            name: saved.name.clone(),
        })
    })?;
    if link.name != saved.name {
        host_name_free(at, host, rec, Some(link.index))?;
        if link.up {
            at.step("bring down", host.set_link(link.index, &down()))?;
        }
        // The saved name among them would fail the rename.
        for name in foreign_altnames(&link, rec) {
            at.step("delete altname", host.del_altname(link.index, name))?;
        }
        let rename = LinkChange {
            name: Some(&saved.name),
            ..LinkChange::default()
        };
        at.step("restore name", host.set_link(link.index, &rename))?;
        link = at
            .step("restore name", host.link(LinkRef::Index(link.index)))?
            .ok_or_else(|| {
                (at.err("restore name"))(Cause::NotFound {
                    what: "vf netdev",
                    name: saved.name.clone(),
                })
            })?;
    }
    // Names the pod gave it that came home with it (its netns was gone, under
    // whatever name it then had), and the pod name a rename home may leave.
    let mut dropped = foreign_altnames(&link, rec);
    if link.altnames.iter().any(|n| n == ifname) && !dropped.contains(&ifname) {
        dropped.push(ifname);
    }
    for name in dropped {
        at.step("delete altname", host.del_altname(link.index, name))?;
    }
    // Host altnames (udev's predictable names) the pod deleted in its netns,
    // where they moved with the device, or the kernel dropped when a dying
    // netns handed it back beside a link holding one: put back, unless
    // another host link holds one now. A name is cosmetic beside the VF's
    // isolation: one that cannot be added is warned of, and the restore goes
    // on. (None of them is among `dropped`, whose names the record did not
    // save, and the pod name, which attach could not give a VF holding it.)
    let lacking = saved.altnames.iter().flatten();
    for name in lacking.filter(|n| **n != saved.name && !link.altnames.contains(n)) {
        match host.add_altname(link.index, name) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(vf = %rec.vf(), altname = %name, "the vf's saved altname is taken on the host: not restored")
            }
            Err(e) => {
                tracing::warn!(vf = %rec.vf(), altname = %name, error = %e, "the vf's saved altname could not be restored")
            }
        }
    }
    if saved.mac.is_some() && link.mac != saved.mac {
        let change = LinkChange {
            mac: saved.mac.as_ref(),
            ..LinkChange::default()
        };
        at.step("restore mac", host.set_link(link.index, &change))?;
    }
    if link.mtu != saved.mtu {
        let change = LinkChange {
            mtu: Some(saved.mtu),
            ..LinkChange::default()
        };
        at.step("restore mtu", host.set_link(link.index, &change))?;
    }
    let up = saved.up && whole;
    if link.up != up {
        let change = LinkChange {
            up: Some(up),
            ..LinkChange::default()
        };
        at.step("restore link state", host.set_link(link.index, &change))?;
    }
    Ok(())
}

fn down() -> LinkChange<'static> {
    LinkChange {
        up: Some(false),
        ..LinkChange::default()
    }
}
