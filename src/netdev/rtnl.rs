//! rtnetlink: the few link operations VF attach and detach need, encoded with
//! netlink-packet-route. Attribute numbers are include/uapi/linux/if_link.h;
//! the kernel side is net/core/rtnetlink.c (`rtnl_getlink`, `do_setlink`,
//! `do_setvfinfo`, `rtnl_linkprop`).

use std::os::fd::AsRawFd;

use netlink_packet_core::{Emitable, Parseable};
use netlink_packet_route::link::{LinkAttribute, LinkExtentMask, LinkFlags, LinkMessage, Prop};

use super::ethtool;
use super::linkwatch::Changed;
use super::netns::Netns;
use super::nl::{Conn, Kind, NlError, NlSocket, Transport};
use super::settings::HwAddr;
use super::vfinfo::{set_vf_request, vf_state_from, VfField, VfState};

// include/uapi/linux/rtnetlink.h
pub const RTM_NEWLINK: u16 = 16;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_SETLINK: u16 = 19;
pub const RTM_NEWLINKPROP: u16 = 108;
pub const RTM_DELLINKPROP: u16 = 109;

/// Lookups of one link, in all, while notices keep overtaking the ethtool
/// answer: a pod renaming links in a loop gets no more of the plugin's time.
const PARENT_TRIES: u32 = 3;

/// A netdev as rtnetlink reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `IFLA_ADDRESS`.
    pub mac: Option<HwAddr>,
    pub mtu: u32,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFLA_PROP_LIST > IFLA_ALT_IFNAME`.
    pub altnames: Vec<String>,
    /// `IFLA_PARENT_DEV_NAME`: the PCI address of a VF netdev (absent on virtual links).
    pub parent: Option<String>,
    /// The name's bytes where they are not UTF-8 (a pod's rename), which
    /// `name` holds read lossily: what the kernel knows the link by.
    pub raw_name: Option<Vec<u8>>,
}

impl Link {
    /// The name as the kernel holds it.
    pub fn name_bytes(&self) -> &[u8] {
        self.raw_name.as_deref().unwrap_or(self.name.as_bytes())
    }
}

/// Which link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkRef<'a> {
    Name(&'a str),
    Index(u32),
}

/// One RTM_SETLINK. `do_setlink` applies the namespace move first, then the
/// address, MTU, name and flags, so a move and a rename are one request: the
/// device arrives under its host name and is renamed at once (a rename that
/// fails leaves the host name there), and if that name is taken there the
/// kernel uses the new name for the move itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinkChange<'a> {
    pub netns: Option<&'a Netns>,
    pub name: Option<&'a str>,
    pub mac: Option<&'a HwAddr>,
    pub mtu: Option<u32>,
    pub up: Option<bool>,
}

/// The link operations, in one namespace.
pub trait Rtnl {
    /// `None` when there is no such link (ENODEV).
    fn link(&mut self, by: LinkRef<'_>) -> Result<Option<Link>, NlError>;
    fn links(&mut self) -> Result<Vec<Link>, NlError>;
    fn set_link(&mut self, index: u32, change: &LinkChange<'_>) -> Result<(), NlError>;
    /// False when the link has no such altname.
    fn del_altname(&mut self, index: u32, name: &str) -> Result<bool, NlError>;
    /// False when the name is taken in the namespace (by this link or another).
    fn add_altname(&mut self, index: u32, name: &str) -> Result<bool, NlError>;
    /// The PF's view of VF `vf`, `None` when the PF reports no such VF.
    fn vf_state(&mut self, pf_index: u32, vf: u32) -> Result<Option<VfState>, NlError>;
    fn set_vf(&mut self, pf_index: u32, vf: u32, field: &VfField) -> Result<(), NlError>;
}

/// rtnetlink over a transport; `RtnlConn<NlSocket>` is the real one.
pub struct RtnlConn<T> {
    conn: Conn<T>,
    /// Fill [`Link::parent`] from ethtool's `bus_info` where rtnetlink leaves
    /// it out: on kernels before 5.16, which never send it (see [`ethtool`]).
    parent_by_ethtool: bool,
    /// Links renamed or deleted since the current listing began.
    changed: Changed,
}

impl RtnlConn<NlSocket> {
    /// A socket in the calling thread's namespace.
    pub fn open() -> Result<Self, NlError> {
        // The kernel does not change under a process: asked once.
        static OLD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let old =
            *OLD.get_or_init(|| ethtool::release_lacks_parent_attr(&ethtool::kernel_release()));
        let mut sock = NlSocket::open(netlink_sys::constants::NETLINK_ROUTE)?;
        if old {
            sock = sock.with_link_watch()?;
        }
        Ok(RtnlConn::new(sock).with_parent_by_ethtool(old))
    }
}

pub(super) fn emit(msg: &LinkMessage) -> Vec<u8> {
    let mut buf = vec![0; msg.buffer_len()];
    msg.emit(&mut buf);
    buf
}

pub(super) fn link_msg(index: u32, attributes: Vec<LinkAttribute>) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.attributes = attributes;
    msg
}

/// IFLA_ALT_IFNAME (include/uapi/linux/if_link.h).
const IFLA_ALT_IFNAME: u16 = 53;
/// IFNAMSIZ: a name this long or longer can only be an altname.
const IFNAMSIZ: usize = 16;

/// RTM_GETLINK by index or name, with `mask` as IFLA_EXT_MASK. A name finds
/// an altname too (`__dev_get_by_name` looks both up); one too long for
/// IFLA_IFNAME, whose policy takes at most 15 bytes (rtnetlink.c
/// `ifla_policy`), goes as IFLA_ALT_IFNAME, which `rtnl_dev_get` takes since
/// Linux 5.5.
pub fn getlink_request(by: LinkRef<'_>, mask: Vec<LinkExtentMask>) -> Vec<u8> {
    let mut attrs = Vec::new();
    let index = match by {
        LinkRef::Index(i) => i,
        LinkRef::Name(n) if n.len() >= IFNAMSIZ => {
            let mut name = n.as_bytes().to_vec();
            name.push(0);
            let nla = netlink_packet_core::DefaultNla::new(IFLA_ALT_IFNAME, name);
            attrs.push(LinkAttribute::Other(nla));
            0
        }
        LinkRef::Name(n) => {
            attrs.push(LinkAttribute::IfName(n.to_string()));
            0
        }
    };
    attrs.push(LinkAttribute::ExtMask(mask));
    emit(&link_msg(index, attrs))
}

pub fn setlink_request(index: u32, change: &LinkChange<'_>) -> Vec<u8> {
    let mut msg = link_msg(index, Vec::new());
    if let Some(up) = change.up {
        msg.header.change_mask = LinkFlags::Up;
        if up {
            msg.header.flags = LinkFlags::Up;
        }
    }
    if let Some(ns) = change.netns {
        msg.attributes.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
    }
    if let Some(name) = change.name {
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
    }
    if let Some(mac) = change.mac {
        msg.attributes
            .push(LinkAttribute::Address(mac.as_bytes().to_vec()));
    }
    if let Some(mtu) = change.mtu {
        msg.attributes.push(LinkAttribute::Mtu(mtu));
    }
    emit(&msg)
}

/// The body of RTM_NEWLINKPROP and RTM_DELLINKPROP for one altname.
pub fn altname_request(index: u32, name: &str) -> Vec<u8> {
    let prop = vec![Prop::AltIfName(name.to_string())];
    emit(&link_msg(index, vec![LinkAttribute::PropList(prop)]))
}

/// Reads a GETLINK reply into a [`Link`].
pub fn parse_link(op: &'static str, payload: &[u8]) -> Result<(Link, LinkMessage), NlError> {
    let mut raw_name = None;
    let msg = LinkMessage::parse(payload).or_else(|e| {
        // Text a pod wrote that is not UTF-8 (see `lenient`).
        let mended = super::lenient::mend(payload).ok_or(e)?;
        raw_name = mended.raw_name;
        LinkMessage::parse(&mended.payload)
    });
    let msg = msg.map_err(|e| NlError::Malformed {
        op,
        reason: e.to_string(),
    })?;
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mac: None,
        mtu: 0,
        up: msg.header.flags.contains(LinkFlags::Up),
        altnames: Vec::new(),
        parent: None,
        raw_name,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(a) => link.mac = HwAddr::new(a),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            LinkAttribute::ParentDevName(p) => link.parent = Some(p.clone()),
            LinkAttribute::PropList(props) => {
                for p in props {
                    if let Prop::AltIfName(n) = p {
                        link.altnames.push(n.clone());
                    }
                }
            }
            _ => {}
        }
    }
    Ok((link, msg))
}

impl<T: Transport> RtnlConn<T> {
    pub fn new(transport: T) -> Self {
        RtnlConn {
            conn: Conn::new(transport),
            parent_by_ethtool: false,
            changed: Changed::default(),
        }
    }

    pub fn with_parent_by_ethtool(mut self, on: bool) -> Self {
        self.parent_by_ethtool = on;
        self
    }

    pub fn transport(&self) -> &T {
        self.conn.transport()
    }

    #[cfg(test)]
    pub fn transport_mut(&mut self) -> &mut T {
        self.conn.transport_mut()
    }

    #[cfg(test)]
    pub fn into_transport(self) -> T {
        self.conn.into_transport()
    }

    /// Starts a listing whose names `fill_parent` will ask ethtool by: the
    /// notices queued so far are no news of it.
    fn watch_from_here(&mut self) -> Result<(), NlError> {
        if self.parent_by_ethtool {
            self.notices("watch links")?;
            self.changed = Changed::default();
        }
        Ok(())
    }

    fn notices(&mut self, op: &'static str) -> Result<(), NlError> {
        let notices = self
            .conn
            .transport_mut()
            .link_notices()
            .map_err(|source| NlError::Socket { op, source })?;
        self.changed.add(notices);
        Ok(())
    }

    /// The link's PCI function from ethtool where the kernel did not send
    /// `IFLA_PARENT_DEV_NAME`. ethtool asks by name, after the listing: the
    /// answer is kept only when no notice says the link was renamed or
    /// deleted since (a pod may rename its links in between, to pass one off
    /// as another; see [`super::linkwatch`] for why that suffices).
    ///
    /// True when a notice left the parent unknown: a new lookup may tell it.
    fn fill_parent(&mut self, link: &mut Link) -> Result<bool, NlError> {
        if !self.parent_by_ethtool || link.parent.is_some() {
            return Ok(false);
        }
        // Asked by the name's bytes, not by a lossy reading of them (which
        // may be another link's name), and checked against notices by bytes.
        let drv = self
            .conn
            .transport_mut()
            .drvinfo(link.name_bytes())
            .map_err(|source| NlError::Socket {
                op: "ethtool drvinfo",
                source,
            })?;
        let Some(parent) = drv.and_then(|d| ethtool::pci_bus_info(&d.bus_info)) else {
            return Ok(false);
        };
        self.notices("watch links")?;
        if self.changed.renamed_or_gone(link.index, link.name_bytes()) {
            tracing::warn!(link = %link.name, "the link was renamed or deleted while its pci function was read: taken as unknown");
            return Ok(true);
        }
        link.parent = Some(parent);
        Ok(false)
    }

    fn get(
        &mut self,
        op: &'static str,
        req: &[u8],
    ) -> Result<Option<(Link, LinkMessage)>, NlError> {
        self.get_raw(op, req)?
            .map(|payload| parse_link(op, &payload))
            .transpose()
    }

    /// The link's RTM_NEWLINK payload as the kernel sent it.
    fn get_raw(&mut self, op: &'static str, req: &[u8]) -> Result<Option<Vec<u8>>, NlError> {
        match self.conn.request(op, RTM_GETLINK, Kind::Do, req) {
            Ok(replies) => match replies.into_iter().next() {
                Some(payload) => Ok(Some(payload)),
                None => Err(NlError::Malformed {
                    op,
                    reason: "no link in the reply".to_string(),
                }),
            },
            Err(e) if e.is_no_device() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl<T: Transport> RtnlConn<T> {
    /// One altname added or deleted: false where the kernel answers
    /// `benign`, the name already as asked.
    fn altname_op(
        &mut self,
        op: &'static str,
        msg_type: u16,
        index: u32,
        name: &str,
        benign: i32,
    ) -> Result<bool, NlError> {
        let req = altname_request(index, name);
        match self.conn.request(op, msg_type, Kind::Do, &req) {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == Some(benign) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl<T: Transport> Rtnl for RtnlConn<T> {
    /// On a kernel that needs ethtool for the parent, a lookup a notice
    /// overtook is made again, up to [`PARENT_TRIES`] in all: udev renames a
    /// VF's netdev just after the driver registers it, and an attach then
    /// still knows the VF by its PCI function rather than its MAC alone.
    fn link(&mut self, by: LinkRef<'_>) -> Result<Option<Link>, NlError> {
        let req = getlink_request(by, vec![LinkExtentMask::SkipStats]);
        let mut tries = 0;
        loop {
            self.watch_from_here()?;
            let Some((mut link, _)) = self.get("get link", &req)? else {
                return Ok(None);
            };
            tries += 1;
            let raced = self.fill_parent(&mut link)?;
            if !raced || tries == PARENT_TRIES || !self.conn.transport().watches_links() {
                return Ok(Some(link));
            }
        }
    }

    fn links(&mut self) -> Result<Vec<Link>, NlError> {
        self.watch_from_here()?;
        let req = getlink_request(LinkRef::Index(0), vec![LinkExtentMask::SkipStats]);
        let replies = self
            .conn
            .request("list links", RTM_GETLINK, Kind::Dump, &req)?;
        let mut links = replies
            .iter()
            .map(|p| parse_link("list links", p).map(|(l, _)| l))
            .collect::<Result<Vec<_>, _>>()?;
        // A listing serves restores, which go by the MAC where the parent
        // is unknown; it is not made again.
        for link in &mut links {
            self.fill_parent(link)?;
        }
        Ok(links)
    }

    fn set_link(&mut self, index: u32, change: &LinkChange<'_>) -> Result<(), NlError> {
        let req = setlink_request(index, change);
        self.conn
            .request("set link", RTM_SETLINK, Kind::Do, &req)
            .map(drop)
    }

    fn del_altname(&mut self, index: u32, name: &str) -> Result<bool, NlError> {
        // netdev_name_node_alt_destroy: ENOENT when the name is not an altname of the link.
        self.altname_op("delete altname", RTM_DELLINKPROP, index, name, libc::ENOENT)
    }

    fn add_altname(&mut self, index: u32, name: &str) -> Result<bool, NlError> {
        // netdev_name_node_alt_create: EEXIST when the namespace has the name.
        self.altname_op("add altname", RTM_NEWLINKPROP, index, name, libc::EEXIST)
    }

    fn vf_state(&mut self, pf_index: u32, vf: u32) -> Result<Option<VfState>, NlError> {
        // IFLA_VFINFO_LIST is only filled when RTEXT_FILTER_VF is asked for
        // (rtnl_vfinfo_size / rtnl_fill_vf); SKIP_STATS drops the per-VF counters.
        let req = getlink_request(
            LinkRef::Index(pf_index),
            vec![LinkExtentMask::Vf, LinkExtentMask::SkipStats],
        );
        let op = "get pf vf info";
        let Some(payload) = self.get_raw(op, &req)? else {
            return Err(NlError::Kernel {
                op,
                errno: libc::ENODEV,
                message: None,
            });
        };
        let (link, msg) = parse_link(op, &payload)?;
        let addr_len = link.mac.as_ref().map_or(6, |m| m.as_bytes().len());
        Ok(vf_state_from(&msg, &payload, addr_len, vf))
    }

    fn set_vf(&mut self, pf_index: u32, vf: u32, field: &VfField) -> Result<(), NlError> {
        let req = set_vf_request(pf_index, vf, field);
        self.conn
            .request(field.step(), RTM_SETLINK, Kind::Do, &req)
            .map(drop)
    }
}
