//! Link messages a pod wrote text into, made readable.
//!
//! A netdev's name, altnames and alias are bytes to the kernel: `dev_valid_name`
//! (net/core/dev.c) refuses only `/`, `:` and whitespace, and `IFLA_IFALIAS`
//! takes anything. netlink-packet-route reads them as UTF-8 and fails the
//! whole message otherwise, so a container with `NET_ADMIN` could make its
//! VF unreadable, and with it every listing of the host once the VF came
//! home: no restore could find it. Such a message is rewritten before it is
//! parsed again: an alias that is not UTF-8, which devgate never reads,
//! dropped; a name read
//! lossily, its bytes kept beside it for what asks the kernel by name
//! (ethtool, on kernels that send no PCI parent; the VF is found by its PCI
//! parent or MAC, and renamed by index); an altname that is not UTF-8 dropped.

use super::nl::{align4, nla, raw_attrs};
use netlink_packet_core::NLA_TYPE_MASK;

/// include/uapi/linux/if_link.h.
const IFLA_IFNAME: u16 = 3;
const IFLA_IFALIAS: u16 = 20;
const IFLA_PROP_LIST: u16 = 52;
const IFLA_ALT_IFNAME: u16 = 53;
/// `struct ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;

/// A link message made readable.
pub struct Mended {
    /// The message with its text attributes made UTF-8.
    pub payload: Vec<u8>,
    /// The `IFLA_IFNAME` bytes it replaced with a lossy reading: the name
    /// the kernel knows the link by.
    pub raw_name: Option<Vec<u8>>,
}

/// The message with its text attributes made UTF-8; `None` when it has no
/// such attribute to mend (its failure lies elsewhere).
pub fn mend(payload: &[u8]) -> Option<Mended> {
    let header = payload.get(..IFINFOMSG_LEN)?;
    let body = &payload[IFINFOMSG_LEN..];
    let mut out = header.to_vec();
    let mut raw_name = None;
    let mut mended = false;
    let mut walked = 0;
    for (raw_kind, value) in raw_attrs(body) {
        walked += align4(4 + value.len());
        match raw_kind & NLA_TYPE_MASK {
            IFLA_IFALIAS if !is_text(value) => mended = true,
            IFLA_IFNAME if !is_text(value) => {
                let raw = strip_nul(value);
                let name = String::from_utf8_lossy(raw).into_owned();
                out.extend(nla(raw_kind, &with_nul(name.as_bytes())));
                raw_name = Some(raw.to_vec());
                mended = true;
            }
            IFLA_PROP_LIST => {
                let mut props = Vec::new();
                for (raw, v) in raw_attrs(value) {
                    if raw & NLA_TYPE_MASK == IFLA_ALT_IFNAME && !is_text(v) {
                        mended = true;
                    } else {
                        props.extend(nla(raw, v));
                    }
                }
                out.extend(nla(raw_kind, &props));
            }
            _ => out.extend(nla(raw_kind, value)),
        }
    }
    // Bytes the walk did not reach are a framing error, not text to mend.
    (mended && walked >= body.len()).then_some(Mended {
        payload: out,
        raw_name,
    })
}

/// The attribute's text up to its first NUL (the kernel ends strings with one).
pub(super) fn strip_nul(value: &[u8]) -> &[u8] {
    value.split(|&b| b == 0).next().unwrap_or_default()
}

fn is_text(value: &[u8]) -> bool {
    std::str::from_utf8(strip_nul(value)).is_ok()
}

fn with_nul(text: &[u8]) -> Vec<u8> {
    let mut v = text.to_vec();
    v.push(0);
    v
}
