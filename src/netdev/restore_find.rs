//! Finding a VF to restore, and the names in its way: the record's netdev
//! wherever the kernel put it (its pod name, its host name, `dev<ifindex>`),
//! its altnames that are not the host's, and a host link that took its name.

use super::error::{At, Cause, VfError};
use super::rtnl::{Link, LinkRef, Rtnl};
use super::saved::SavedVf;

/// The VF's altnames that are not the host's: every one the record did not
/// save, and the saved name itself, which a device cannot be renamed to while
/// it holds it (a rename keeps the old name as an altname on some kernels; a
/// hook killed before it dropped it, or a pod, leaves it there). A record
/// from before altnames were saved drops only the latter.
pub(super) fn foreign_altnames<'l>(link: &'l Link, rec: &SavedVf) -> Vec<&'l str> {
    let saved = rec.host.altnames.as_deref();
    let foreign =
        |n: &&str| *n == rec.host.name || saved.is_some_and(|s| !s.iter().any(|k| k == n));
    link.altnames
        .iter()
        .map(String::as_str)
        .filter(foreign)
        .collect()
}

/// Whether `link` is this record's VF: by PCI parent when the kernel reports
/// one (rtnetlink, or ethtool before 5.16: `RtnlConn` fills it), else by MAC
/// (the saved one or the one attach set).
pub(crate) fn is_ours(link: &Link, rec: &SavedVf) -> bool {
    if let Some(parent) = &rec.host.parent {
        return link.parent.as_ref() == Some(parent);
    }
    let Some(mac) = &link.mac else {
        return false;
    };
    rec.host.mac.as_ref() == Some(mac) || rec.attach.settings.mac.as_ref() == Some(mac)
}

/// `dev%d`: the name the kernel gives a device it pulls out of a dying netns
/// when the device's own name is taken on the host (net/core/dev.c).
fn is_fallback_name(name: &str) -> bool {
    name.strip_prefix("dev")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The VF among the links of one namespace: under one of `names` first (one
/// request each), else by parent if known, or by MAC among the names the
/// kernel can have given it (one dump).
pub(super) fn locate(
    nl: &mut dyn Rtnl,
    rec: &SavedVf,
    names: &[&str],
) -> Result<Option<Link>, Cause> {
    for name in names {
        if let Some(l) = nl.link(LinkRef::Name(name))? {
            if l.name == *name && is_ours(&l, rec) {
                return Ok(Some(l));
            }
        }
    }
    let mut hits: Vec<Link> = nl
        .links()?
        .into_iter()
        .filter(|l| is_ours(l, rec))
        .filter(|l| {
            rec.host.parent.is_some()
                || names.contains(&l.name.as_str())
                || is_fallback_name(&l.name)
        })
        .collect();
    match hits.len() {
        0 | 1 => Ok(hits.pop()),
        _ => Err(Cause::Ambiguous {
            names: hits.into_iter().map(|l| l.name).collect(),
        }),
    }
}

/// Fails when another link on the host holds the VF's original name. The record
/// stays; the operator frees the name (or the VF is quarantined) and a later
/// detach finishes the job.
pub(super) fn host_name_free(
    at: &At<'_>,
    host: &mut dyn Rtnl,
    rec: &SavedVf,
    ours: Option<u32>,
) -> Result<(), VfError> {
    let holder = at.step("check host name", host.link(LinkRef::Name(&rec.host.name)))?;
    match holder {
        Some(l) if Some(l.index) != ours && !is_ours(&l, rec) => {
            Err((at.err("check host name"))(Cause::HostNameTaken {
                name: rec.host.name.clone(),
                index: l.index,
            }))
        }
        _ => Ok(()),
    }
}
