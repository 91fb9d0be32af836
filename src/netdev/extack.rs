//! The kernel's text beside a netlink error (extended ACK, Linux 4.12):
//! asked for with `NETLINK_EXT_ACK`, so that an operator reads, say, "mtu
//! greater than device maximum" beside "Invalid argument".

use std::os::fd::RawFd;

use super::nl::{align4, attrs, NLMSG_HDRLEN};

/// include/uapi/linux/netlink.h
const SOL_NETLINK: libc::c_int = 270;
const NETLINK_CAP_ACK: libc::c_int = 10;
const NETLINK_EXT_ACK: libc::c_int = 11;
/// The error echoes the request's header only (`NETLINK_CAP_ACK`).
const NLM_F_CAPPED: u16 = 0x100;
/// Attributes follow the echoed request.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `enum nlmsgerr_attrs`: the message, a NUL-terminated string.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Longest message kept; the kernel's are a line (`NL_SET_ERR_MSG`).
const MAX_MESSAGE: usize = 256;

/// Asks the kernel for its text beside errors on `fd`, and for the failed
/// request's header alone in them rather than the whole request; a kernel
/// without either answers as before, so failures are ignored.
pub fn ask(fd: RawFd) {
    for option in [NETLINK_EXT_ACK, NETLINK_CAP_ACK] {
        let on: libc::c_int = 1;
        // SAFETY: a valid option value of its size for this descriptor.
        let _ = unsafe {
            libc::setsockopt(
                fd,
                SOL_NETLINK,
                option,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
}

/// The kernel's message in an `NLMSG_ERROR` with header flags `flags` and
/// `body` (what follows the header: the error, the echoed request, then
/// the attributes); none where it carries none.
pub fn message(flags: u16, body: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let echoed = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        let len = body.get(4..8)?;
        u32::from_ne_bytes([len[0], len[1], len[2], len[3]]) as usize
    };
    let tlvs = body.get(4usize.checked_add(align4(echoed.max(NLMSG_HDRLEN)))?..)?;
    let (_, text) = attrs(tlvs).find(|(kind, _)| *kind == NLMSGERR_ATTR_MSG)?;
    let text = text.split(|b| *b == 0).next().unwrap_or_default();
    let text: String = String::from_utf8_lossy(text)
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_MESSAGE)
        .collect();
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netdev::nl::nla;

    /// An `NLMSG_ERROR` body: `-errno`, the request's header (of `len`),
    /// its payload unless capped, then `tlvs`.
    fn body(capped: bool, tlvs: &[u8]) -> Vec<u8> {
        let payload = [7u8; 20];
        let mut b = (-libc::EINVAL).to_ne_bytes().to_vec();
        let len = (NLMSG_HDRLEN + payload.len()) as u32;
        b.extend(len.to_ne_bytes());
        b.extend([0u8; 12]);
        if !capped {
            b.extend(payload);
        }
        b.extend(tlvs);
        b
    }

    #[test]
    fn the_kernels_message_is_read_where_it_is_sent() {
        let msg = nla(NLMSGERR_ATTR_MSG, b"mtu greater than device maximum\0");
        // NLMSGERR_ATTR_OFFS before it, as the kernel may send.
        let mut both = nla(2, &40u32.to_ne_bytes());
        both.extend(&msg);
        let want = Some("mtu greater than device maximum".to_string());
        let flags = NLM_F_ACK_TLVS | NLM_F_CAPPED;
        assert_eq!(message(flags, &body(true, &msg)), want);
        assert_eq!(message(flags, &body(true, &both)), want);
        assert_eq!(message(NLM_F_ACK_TLVS, &body(false, &msg)), want);
        // No attributes flagged, none sent, or an empty message: none.
        assert_eq!(message(NLM_F_CAPPED, &body(true, &msg)), None);
        assert_eq!(message(flags, &body(true, &[])), None);
        assert_eq!(message(flags, &body(true, &nla(1, b"\0"))), None);
        // Bounded, and no control characters reach a log line.
        let long = nla(1, &[b"x\n".repeat(400), vec![0]].concat());
        let text = message(flags, &body(true, &long)).unwrap();
        assert_eq!(text, "x".repeat(256));
        // Truncated or lying lengths read nothing, and never panic.
        for cut in 0..body(true, &msg).len() {
            let _ = message(flags, &body(true, &msg)[..cut]);
        }
        let mut lying = body(false, &msg);
        lying[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(message(NLM_F_ACK_TLVS, &lying), None);
    }

    /// The real kernel's text for an MTU out of a device's range
    /// (`dev_validate_mtu`, net/core/dev.c: `u32::MAX` reads there as the
    /// int -1), on loopback in a namespace of the test's own.
    #[test]
    fn the_real_kernel_says_why() {
        use crate::netdev::nl::{NlError, NlSocket};
        use crate::netdev::rtnl::{LinkChange, Rtnl, RtnlConn};
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root: it makes a network namespace"
        );
        let err = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare netns");
            let sock = NlSocket::open(netlink_sys::constants::NETLINK_ROUTE).unwrap();
            let change = LinkChange {
                netns: None,
                name: None,
                mac: None,
                mtu: Some(u32::MAX),
                up: None,
            };
            RtnlConn::new(sock).set_link(1, &change).unwrap_err()
        })
        .join()
        .expect("test thread");
        assert!(
            matches!(&err, NlError::Kernel { errno: libc::EINVAL, message: Some(m), .. } if m.contains("mtu")),
            "{err:?}"
        );
        assert!(
            err.to_string().ends_with(": mtu less than device minimum"),
            "{err}"
        );
    }
}
