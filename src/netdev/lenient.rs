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
//! lossily (the VF is found by its PCI parent or MAC, and renamed by index);
//! an altname that is not UTF-8 dropped.

use super::nl::{align4, attrs};

/// include/uapi/linux/if_link.h.
const IFLA_IFNAME: u16 = 3;
const IFLA_IFALIAS: u16 = 20;
const IFLA_PROP_LIST: u16 = 52;
const IFLA_ALT_IFNAME: u16 = 53;
/// `struct ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;

/// The message with its text attributes made UTF-8; `None` when it has no
/// such attribute to mend (its failure lies elsewhere).
pub fn mend(payload: &[u8]) -> Option<Vec<u8>> {
    let header = payload.get(..IFINFOMSG_LEN)?;
    let body = &payload[IFINFOMSG_LEN..];
    let mut out = header.to_vec();
    let mut mended = false;
    let mut walked = 0;
    for (kind, raw_kind, value) in raw_attrs(body) {
        walked += align4(4 + value.len());
        match kind {
            IFLA_IFALIAS if !is_text(value) => mended = true,
            IFLA_IFNAME if !is_text(value) => {
                let name = String::from_utf8_lossy(strip_nul(value)).into_owned();
                push(&mut out, raw_kind, &with_nul(name.as_bytes()));
                mended = true;
            }
            IFLA_PROP_LIST => {
                let mut props = Vec::new();
                for (k, raw, v) in raw_attrs(value) {
                    if k == IFLA_ALT_IFNAME && !is_text(v) {
                        mended = true;
                    } else {
                        push(&mut props, raw, v);
                    }
                }
                push(&mut out, raw_kind, &props);
            }
            _ => push(&mut out, raw_kind, value),
        }
    }
    // Bytes the walk did not reach are a framing error, not text to mend.
    (mended && walked >= body.len()).then_some(out)
}

/// `(kind without flags, kind as sent, value)` of each attribute.
fn raw_attrs(data: &[u8]) -> impl Iterator<Item = (u16, u16, &[u8])> {
    let mut offsets = Vec::new();
    let mut at = 0;
    for (kind, value) in attrs(data) {
        let raw = u16::from_ne_bytes([data[at + 2], data[at + 3]]);
        offsets.push((kind, raw, value));
        at += align4(4 + value.len());
    }
    offsets.into_iter()
}

fn push(out: &mut Vec<u8>, raw_kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&raw_kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(align4(out.len()), 0);
}

fn strip_nul(value: &[u8]) -> &[u8] {
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
