//! Link notices of one netns (`RTNLGRP_LINK`), which tie an answer asked by a
//! link's name to the link a listing gave under that name.
//!
//! `ETHTOOL_GDRVINFO` knows links only by name, and a pod with `NET_ADMIN`
//! names its links as it likes: between the listing and the ioctl it can
//! rename the VF away and a dummy to the VF's name, then rename both back, so
//! that asking again by name finds the listed link once more (an A-B-A).
//! Notices close that window. Every rename and deletion sends `RTM_NEWLINK` or
//! `RTM_DELLINK` for the link to `RTNLGRP_LINK` listeners from within its
//! `rtnl_lock` section (`dev_change_name` → `NETDEV_CHANGENAME` →
//! `rtnetlink_event`; `unregister_netdevice_many` → `rtmsg_ifinfo`,
//! net/core/dev.c), and `SIOCETHTOOL` looks the name up under the same lock
//! (`dev_ioctl` → `dev_ethtool`, net/core/dev_ioctl.c). So if the ioctl found
//! a name standing for another link than the one listed under it, the listed
//! link was renamed or deleted after the listing, and that link's notice is
//! queued before the ioctl returns. A listing made after the watch was
//! drained, and no notice for the listed link once the ioctl returned, mean
//! the ioctl answered for that link.

use std::io;

use netlink_packet_core::NetlinkBuffer;

use super::nl::NLMSG_HDRLEN;

/// include/uapi/linux/rtnetlink.h: `RTNLGRP_LINK`, `RTM_NEWLINK`, `RTM_DELLINK`.
const RTNLGRP_LINK: u32 = 1;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
/// include/uapi/linux/if_link.h.
const IFLA_IFNAME: u16 = 3;
/// A link notice is one message of about 1.5 KiB (`rtnl_fill_ifinfo` with no
/// extension filter: no VF list); a datagram that does not fit is taken as
/// lost.
const DATAGRAM: usize = 64 * 1024;
/// Changed links remembered before every link counts as changed.
const MAX_CHANGED: usize = 1024;

/// A netlink socket of the calling thread's netns that receives its link
/// notices, read without blocking.
pub struct LinkWatch {
    sock: netlink_sys::Socket,
}

impl LinkWatch {
    /// Subscribed in the calling thread's netns (a socket keeps the netns it
    /// was made in).
    pub fn open() -> io::Result<LinkWatch> {
        let mut sock = netlink_sys::Socket::new(netlink_sys::constants::NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.add_membership(RTNLGRP_LINK)?;
        Ok(LinkWatch { sock })
    }

    /// The link notices queued since the last call, each a whole netlink
    /// message; `None` when the kernel dropped some (ENOBUFS: the queue
    /// overflowed) or one did not fit.
    pub fn notices(&mut self) -> io::Result<Option<Vec<Vec<u8>>>> {
        let mut out = Vec::new();
        let mut lost = false;
        let mut buf: Vec<u8> = Vec::with_capacity(DATAGRAM);
        loop {
            buf.clear();
            match self
                .sock
                .recv(&mut buf, libc::MSG_DONTWAIT | libc::MSG_TRUNC)
            {
                // A namespace whose links flap faster than this reads: no
                // more kept, and every link counts as changed.
                Ok(_) if out.len() > MAX_CHANGED => return Ok(None),
                Ok(len) if len > buf.len() => lost = true,
                Ok(_) => lost |= !link_messages(&buf, &mut out),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => lost = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok((!lost).then_some(out))
    }
}

/// Appends the link notices of one datagram, each a whole message; false
/// when the datagram is malformed.
pub fn link_messages(data: &[u8], out: &mut Vec<Vec<u8>>) -> bool {
    let mut off = 0;
    while off < data.len() {
        let Ok(msg) = NetlinkBuffer::new_checked(&data[off..]) else {
            return false;
        };
        let len = msg.length() as usize;
        if matches!(msg.message_type(), RTM_NEWLINK | RTM_DELLINK) {
            out.push(data[off..off + len].to_vec());
        }
        off += super::nl::align4(len);
    }
    true
}

/// One link notice: the link's ifindex, and its name's bytes then (`None`
/// for a deletion, or a notice without `IFLA_IFNAME`); `Some(None)` for a
/// notice that changes no link's name or existence. Bytes, not text: two
/// names that are not UTF-8 may read the same lossily (`n\xff`, `n\xfe`).
fn notice(msg: &[u8]) -> Option<Option<(u32, Option<Vec<u8>>)>> {
    let kind = u16::from_ne_bytes([*msg.get(4)?, *msg.get(5)?]);
    let body = msg.get(NLMSG_HDRLEN..)?;
    // `struct ifinfomsg`: family, pad, type, then the ifindex; 16 bytes.
    let b = body.get(4..8)?;
    let index = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    // A port leaving a bridge is an `RTM_DELLINK` of family `AF_BRIDGE`
    // (net/bridge/br_netlink.c, `br_info_notify`): the link stays.
    if kind == RTM_DELLINK && *body.first()? == libc::AF_BRIDGE as u8 {
        return Some(None);
    }
    let name = super::nl::attrs(body.get(16..)?)
        .find(|(k, _)| *k == IFLA_IFNAME)
        .map(|(_, v)| super::lenient::strip_nul(v).to_vec());
    Some(Some((index, name.filter(|_| kind == RTM_NEWLINK))))
}

/// The links notices reported since a point: the ifindex of each with its
/// name then, or every link once a notice was lost or unreadable.
#[derive(Debug, Default)]
pub struct Changed {
    all: bool,
    links: Vec<(u32, Option<Vec<u8>>)>,
}

impl Changed {
    /// Takes in what one read of the watch returned.
    pub fn add(&mut self, notices: Option<Vec<Vec<u8>>>) {
        let Some(notices) = notices else {
            self.all = true;
            return;
        };
        for msg in notices {
            match notice(&msg) {
                Some(Some(n)) => self.links.push(n),
                Some(None) => {}
                None => self.all = true,
            }
        }
        if self.links.len() > MAX_CHANGED {
            self.all = true;
            self.links = Vec::new();
        }
    }

    /// Whether the link listed as `index` named `name` may since have been
    /// deleted or renamed. Its other notices (carrier, operstate, MTU, up or
    /// down) carry the same name and say nothing of the name's meaning; a
    /// rename away from `name` carries another, however briefly it held.
    pub fn renamed_or_gone(&self, index: u32, name: impl AsRef<[u8]>) -> bool {
        let name = name.as_ref();
        self.all
            || self
                .links
                .iter()
                .any(|(i, n)| *i == index && n.as_deref() != Some(name))
    }
}
