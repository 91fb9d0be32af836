//! Finding, at restore, the PF whose VF attach configured.

use super::error::{At, Cause, VfError};
use super::rtnl::{Link, LinkRef, Rtnl};
use super::saved::SavedVf;

/// The PF attach configured. By the ifindex it had then, which a rename
/// keeps: by name, PFs whose names swapped since (`net.ifnames=0` and a
/// driver reload) would have another tenant's VF reset. Where that index is
/// gone (the kernel does not hand an index out again soon: `dev_new_index`,
/// `dev_index_reserve` from 6.6, count upwards), the PF re-probed under a new
/// one: by the PCI address saved with it, then by name. A link whose device is
/// known to be another than the saved one is never taken.
pub(super) fn find_pf(
    at: &At<'_>,
    host: &mut dyn Rtnl,
    pf_index: u32,
    rec: &SavedVf,
) -> Result<Link, VfError> {
    let pf_name = &rec.attach.pf_netdev;
    let other = |l: &Link| match (&rec.pf_parent, &l.parent) {
        (Some(saved), Some(now)) if saved != now => Some((saved.clone(), now.clone())),
        _ => None,
    };
    let by_index = at.step("find pf", host.link(LinkRef::Index(pf_index)))?;
    if let Some(l) = by_index.filter(|l| other(l).is_none()) {
        if l.name != *pf_name {
            tracing::warn!(pf = %pf_name, now = %l.name, "the pf was renamed since the attach: restored by its ifindex");
        }
        return Ok(l);
    }
    if let Some(parent) = &rec.pf_parent {
        if let Some(l) = by_pci_address(at, host, parent, rec)? {
            tracing::warn!(pf = %pf_name, now = %l.name, index = l.index, device = %parent, "the pf has another ifindex than at the attach: restored by its pci address");
            return Ok(l);
        }
    }
    let l = at
        .step("find pf", host.link(LinkRef::Name(pf_name)))?
        .ok_or_else(|| {
            (at.err("find pf"))(Cause::NotFound {
                what: "pf",
                name: pf_name.clone(),
            })
        })?;
    match other(&l) {
        Some((saved, parent)) => Err((at.err("find pf"))(Cause::OtherPf {
            name: l.name,
            devices: Box::new((parent, saved)),
        })),
        None => Ok(l),
    }
}

/// The link of PCI function `parent` that reports the VF. One function may
/// carry several netdevs (switchdev representors, which report no VFs; a
/// second port): of those that report it, the one named as at attach, and
/// none where that leaves more than one. A link that cannot be asked (gone
/// since the listing) reports nothing.
fn by_pci_address(
    at: &At<'_>,
    host: &mut dyn Rtnl,
    parent: &str,
    rec: &SavedVf,
) -> Result<Option<Link>, VfError> {
    let links = at.step("list host links", host.links())?;
    let mut on_it: Vec<Link> = links
        .into_iter()
        .filter(|l| l.parent.as_deref() == Some(parent))
        .filter(|l| {
            host.vf_state(l.index, rec.attach.vf_index)
                .is_ok_and(|vf| vf.is_some())
        })
        .collect();
    if on_it.len() > 1 {
        match on_it.iter().position(|l| l.name == rec.attach.pf_netdev) {
            Some(i) => return Ok(Some(on_it.swap_remove(i))),
            None => {
                return Err((at.err("find pf"))(Cause::AmbiguousPf {
                    names: on_it.into_iter().map(|l| l.name).collect(),
                }))
            }
        }
    }
    Ok(on_it.pop())
}
