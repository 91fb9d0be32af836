//! The bytes sent to the kernel, compared with messages assembled by hand from
//! the uapi layouts (include/uapi/linux/{netlink,rtnetlink,if_link}.h). The
//! real `RtnlConn` code runs; only the socket is a script. The RDMA messages
//! are in msg_rdma.rs.

use std::os::fd::AsRawFd;

use crate::netdev::nl::script::{Reply, Script};
use crate::netdev::rtnl::{LinkChange, LinkRef, Rtnl, RtnlConn};
use crate::netdev::settings::{HwAddr, LinkState, RateConfig, VlanConfig, VlanProto};
use crate::netdev::vfinfo::{VfField, VfState};
use crate::netdev::Netns;

pub(super) const REQUEST_ACK: u16 = 0x1 | 0x4;

/// `struct nlmsghdr` (seq as given, port 0).
fn nlmsghdr(len: u32, msg_type: u16, flags: u16, seq: u32) -> Vec<u8> {
    let mut v = len.to_ne_bytes().to_vec();
    v.extend(msg_type.to_ne_bytes());
    v.extend(flags.to_ne_bytes());
    v.extend(seq.to_ne_bytes());
    v.extend(0u32.to_ne_bytes());
    v
}

/// `struct ifinfomsg`: family, pad, type, index, flags, change.
pub(super) fn ifinfomsg(index: i32, flags: u32, change: u32) -> Vec<u8> {
    let mut v = vec![0u8, 0, 0, 0];
    v.extend(index.to_ne_bytes());
    v.extend(flags.to_ne_bytes());
    v.extend(change.to_ne_bytes());
    v
}

/// `struct nlattr` + value + padding to 4.
pub(super) fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut v = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
    v.extend(kind.to_ne_bytes());
    v.extend(value);
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
    v
}

pub(super) fn u32s(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

pub(super) fn message(msg_type: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let mut v = nlmsghdr(16 + body.len() as u32, msg_type, flags, 1);
    v.extend(body);
    v
}

pub(super) fn sent_by(f: impl FnOnce(&mut RtnlConn<Script>)) -> Vec<u8> {
    let mut conn = RtnlConn::new(Script::new(vec![Reply::Errno(0)]));
    f(&mut conn);
    conn.transport().sent[0].clone()
}

/// RTM_SETLINK on PF 7: IFLA_VFINFO_LIST(22) > IFLA_VF_INFO(1) > `inner`.
fn vf_setlink(inner: Vec<u8>) -> Vec<u8> {
    let mut body = ifinfomsg(7, 0, 0);
    body.extend(attr(22, &attr(1, &inner)));
    message(19, REQUEST_ACK, &body)
}

#[test]
fn vf_mac_is_ifla_vf_mac_with_32_byte_address() {
    let mac: HwAddr = "02:11:22:33:44:55".parse().unwrap();
    let got = sent_by(|c| c.set_vf(7, 3, &VfField::Mac(mac)).unwrap());
    let mut value = u32s(&[3]);
    value.extend([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
    value.extend([0u8; 26]);
    let want = vf_setlink(attr(1, &value));
    assert_eq!(want.len(), 80);
    assert_eq!(got, want);
}

#[test]
fn vf_vlan_is_a_vlan_list_with_big_endian_proto() {
    let vlan = VlanConfig {
        vlan: 100,
        qos: 3,
        proto: VlanProto::Dot1Ad,
    };
    let got = sent_by(|c| c.set_vf(7, 3, &VfField::Vlan(vlan)).unwrap());
    // struct ifla_vf_vlan_info { u32 vf; u32 vlan; u32 qos; __be16 vlan_proto; } = 16 bytes with padding.
    let mut info = u32s(&[3, 100, 3]);
    info.extend([0x88, 0xa8, 0, 0]);
    let want = vf_setlink(attr(12, &attr(1, &info)));
    assert_eq!(got, want);
}

#[test]
fn vf_rate_spoofchk_trust_and_link_state() {
    let rate = RateConfig { min: 10, max: 2500 };
    let table: Vec<(VfField, Vec<u8>)> = vec![
        (VfField::Rate(rate), attr(6, &u32s(&[3, 10, 2500]))),
        (VfField::SpoofChk(true), attr(4, &u32s(&[3, 1]))),
        (VfField::SpoofChk(false), attr(4, &u32s(&[3, 0]))),
        (VfField::Trust(true), attr(9, &u32s(&[3, 1]))),
        (
            VfField::LinkState(LinkState::Disable),
            attr(5, &u32s(&[3, 2])),
        ),
        (
            VfField::LinkState(LinkState::Enable),
            attr(5, &u32s(&[3, 1])),
        ),
    ];
    for (field, inner) in table {
        let got = sent_by(|c| c.set_vf(7, 3, &field).unwrap());
        assert_eq!(got, vf_setlink(inner), "{field:?}");
    }
}

#[test]
fn pf_getlink_asks_for_the_vf_list() {
    let got = sent_by(|c| {
        let _ = c.vf_state(7, 3);
    });
    let mut body = ifinfomsg(7, 0, 0);
    // IFLA_EXT_MASK(29) = RTEXT_FILTER_VF(1) | RTEXT_FILTER_SKIP_STATS(8)
    body.extend(attr(29, &u32s(&[1 | 8])));
    assert_eq!(got, message(18, REQUEST_ACK, &body));
}

#[test]
fn getlink_by_name() {
    let got = sent_by(|c| {
        let _ = c.link(LinkRef::Name("ens1f0v3"));
    });
    let mut body = ifinfomsg(0, 0, 0);
    body.extend(attr(3, b"ens1f0v3\0"));
    body.extend(attr(29, &u32s(&[8])));
    assert_eq!(got, message(18, REQUEST_ACK, &body));
}

#[test]
fn move_and_rename_are_one_setlink() {
    let ns = Netns::fake(42);
    let change = LinkChange {
        netns: Some(&ns),
        name: Some("net1"),
        ..LinkChange::default()
    };
    let got = sent_by(|c| c.set_link(12, &change).unwrap());
    let mut body = ifinfomsg(12, 0, 0);
    // IFLA_NET_NS_FD(28) u32, IFLA_IFNAME(3) NUL-terminated.
    body.extend(attr(28, &u32s(&[ns.as_raw_fd() as u32])));
    body.extend(attr(3, b"net1\0"));
    assert_eq!(got, message(19, REQUEST_ACK, &body));
}

#[test]
fn mac_mtu_and_up() {
    let mac: HwAddr = "02:00:00:00:00:01".parse().unwrap();
    let change = LinkChange {
        mac: Some(&mac),
        mtu: Some(9000),
        up: Some(true),
        ..LinkChange::default()
    };
    let got = sent_by(|c| c.set_link(12, &change).unwrap());
    // ifi_flags = ifi_change = IFF_UP; IFLA_ADDRESS(1), IFLA_MTU(4).
    let mut body = ifinfomsg(12, 1, 1);
    body.extend(attr(1, &[2, 0, 0, 0, 0, 1]));
    body.extend(attr(4, &u32s(&[9000])));
    assert_eq!(got, message(19, REQUEST_ACK, &body));
    let down = LinkChange {
        up: Some(false),
        ..LinkChange::default()
    };
    let got = sent_by(|c| c.set_link(12, &down).unwrap());
    assert_eq!(got, message(19, REQUEST_ACK, &ifinfomsg(12, 0, 1)));
}

#[test]
fn delete_altname_is_dellinkprop() {
    let got = sent_by(|c| {
        c.del_altname(12, "ens1f0v3").unwrap();
    });
    // RTM_DELLINKPROP(109): IFLA_PROP_LIST(52)|NLA_F_NESTED > IFLA_ALT_IFNAME(53).
    let mut body = ifinfomsg(12, 0, 0);
    body.extend(attr(52 | 0x8000, &attr(53, b"ens1f0v3\0")));
    assert_eq!(got, message(109, REQUEST_ACK, &body));
}

#[test]
fn add_altname_is_newlinkprop_and_a_taken_name_is_no_error() {
    let got = sent_by(|c| {
        c.add_altname(12, "enp59s2f3").unwrap();
    });
    // RTM_NEWLINKPROP(108): IFLA_PROP_LIST(52)|NLA_F_NESTED > IFLA_ALT_IFNAME(53).
    let mut body = ifinfomsg(12, 0, 0);
    body.extend(attr(52 | 0x8000, &attr(53, b"enp59s2f3\0")));
    assert_eq!(got, message(108, REQUEST_ACK, &body));
    let mut c = RtnlConn::new(Script::new(vec![Reply::Errno(libc::EEXIST)]));
    assert!(!c.add_altname(12, "enp59s2f3").unwrap());
}

#[test]
fn missing_altname_and_missing_link_are_not_errors() {
    let mut c = RtnlConn::new(Script::new(vec![
        Reply::Errno(libc::ENOENT),
        Reply::Errno(libc::ENODEV),
    ]));
    assert!(!c.del_altname(12, "net1").unwrap());
    assert_eq!(c.link(LinkRef::Name("nope")).unwrap(), None);
    let mut c = RtnlConn::new(Script::new(vec![Reply::Errno(libc::EEXIST)]));
    let e = c.set_link(12, &LinkChange::default()).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EEXIST));
    assert!(
        e.to_string()
            .contains("set link: kernel answered File exists"),
        "{e}"
    );
}

/// A PF's RTM_NEWLINK reply, as the kernel fills it (rtnl_fill_vfinfo).
fn pf_reply() -> Vec<u8> {
    let vf = |n: u32, mac: [u8; 6], vlan: u32, qos: u32, proto: [u8; 2]| {
        let mut mac32 = u32s(&[n]);
        mac32.extend(mac);
        mac32.extend([0u8; 26]);
        let mut vinfo = u32s(&[n, vlan, qos]);
        vinfo.extend([proto[0], proto[1], 0, 0]);
        let mut bcast = u32s(&[n]);
        bcast.extend([0xffu8; 32]);
        let mut e = attr(1, &mac32);
        e.extend(attr(13, &bcast)); // IFLA_VF_BROADCAST
        e.extend(attr(2, &u32s(&[n, vlan, qos]))); // IFLA_VF_VLAN
        e.extend(attr(12, &attr(1, &vinfo))); // IFLA_VF_VLAN_LIST
        e.extend(attr(3, &u32s(&[n, 1000]))); // IFLA_VF_TX_RATE
        e.extend(attr(6, &u32s(&[n, 10, 1000]))); // IFLA_VF_RATE
        e.extend(attr(4, &u32s(&[n, 1]))); // IFLA_VF_SPOOFCHK
        e.extend(attr(5, &u32s(&[n, 2]))); // IFLA_VF_LINK_STATE
        e.extend(attr(7, &u32s(&[n, 0]))); // IFLA_VF_RSS_QUERY_EN
        e.extend(attr(9, &u32s(&[n, n % 2]))); // IFLA_VF_TRUST
        attr(1, &e)
    };
    let mut list = vf(0, [0; 6], 0, 0, [0x81, 0x00]);
    list.extend(vf(3, [2, 0xaa, 0, 0, 0, 3], 100, 5, [0x88, 0xa8]));
    let mut body = ifinfomsg(7, 1, 0);
    body.extend(attr(3, b"ens1f0\0"));
    body.extend(attr(4, &u32s(&[1500])));
    body.extend(attr(1, &[0x0c, 0x42, 0xa1, 0, 0, 1]));
    body.extend(attr(21, &u32s(&[2]))); // IFLA_NUM_VF
    body.extend(attr(22, &list));
    body
}

#[test]
fn vf_state_is_parsed_from_the_vfinfo_list() {
    let reply = Reply::Ack {
        msg_type: 16,
        payloads: vec![pf_reply()],
    };
    let mut c = RtnlConn::new(Script::new(vec![reply]));
    let got = c.vf_state(7, 3).unwrap().unwrap();
    let want = VfState {
        vf: 3,
        mac: "02:aa:00:00:00:03".parse().unwrap(),
        vlan: VlanConfig {
            vlan: 100,
            qos: 5,
            proto: VlanProto::Dot1Ad,
        },
        rate: RateConfig { min: 10, max: 1000 },
        spoofchk: Some(true),
        trust: Some(true),
        link_state: LinkState::Disable,
    };
    assert_eq!(got, want);
    let reply = Reply::Ack {
        msg_type: 16,
        payloads: vec![pf_reply()],
    };
    let mut c = RtnlConn::new(Script::new(vec![reply]));
    assert_eq!(c.vf_state(7, 5).unwrap(), None, "no such vf");
}

/// `pf_reply` with VF 3's IFLA_VF_SPOOFCHK and IFLA_VF_TRUST settings (the
/// second u32 of each) replaced, or their attributes dropped for `None`.
fn pf_reply_with(spoofchk: Option<u32>, trust: Option<u32>) -> Vec<u8> {
    let mut body = pf_reply();
    for (kind, setting) in [(4u16, spoofchk), (9u16, trust)] {
        let mut head = 12u16.to_ne_bytes().to_vec(); // nla_len: 4 + vf + setting
        head.extend(kind.to_ne_bytes());
        head.extend(u32s(&[3]));
        let at = body
            .windows(head.len())
            .position(|w| w == head.as_slice())
            .unwrap();
        match setting {
            Some(v) => body[at + 8..at + 12].copy_from_slice(&v.to_ne_bytes()),
            // Type 0 is no IFLA_VF_* the parser reads: the attribute is gone.
            None => body[at + 2..at + 4].copy_from_slice(&0u16.to_ne_bytes()),
        }
    }
    body
}

#[test]
fn spoofchk_and_trust_the_driver_leaves_unfilled_read_as_not_reported() {
    let read = |spoofchk, trust| {
        let reply = Reply::Ack {
            msg_type: 16,
            payloads: vec![pf_reply_with(spoofchk, trust)],
        };
        let mut c = RtnlConn::new(Script::new(vec![reply]));
        let s = c.vf_state(7, 3).unwrap().unwrap();
        (s.spoofchk, s.trust)
    };
    // rtnl_fill_vfinfo presets both to -1 before ndo_get_vf_config.
    assert_eq!(read(Some(u32::MAX), Some(u32::MAX)), (None, None));
    assert_eq!(read(Some(0), Some(1)), (Some(false), Some(true)));
    assert_eq!(read(Some(1), Some(0)), (Some(true), Some(false)));
    // Kernels before IFLA_VF_TRUST (4.4) send no such attribute.
    assert_eq!(read(Some(1), None), (Some(true), None));
}

/// The raw walk takes any bytes: every cut of a reply, and every byte of it
/// changed, reads without a panic, and the whole reply as before.
#[test]
fn spoofchk_and_trust_are_read_from_any_bytes_without_a_panic() {
    use crate::netdev::vfinfo::reported_flags;
    // The ifinfomsg and its attributes, as the reply carries them.
    let payload = &pf_reply_with(Some(u32::MAX), Some(1))[..];
    for cut in 0..=payload.len() {
        let _ = reported_flags(&payload[..cut], 3);
    }
    for at in 0..payload.len() {
        for value in [0u8, 0x01, 0x7f, 0x80, 0xff] {
            let mut changed = payload.to_vec();
            changed[at] = value;
            let _ = reported_flags(&changed, 3);
        }
    }
    assert_eq!(reported_flags(payload, 3), (None, Some(true)));
    assert_eq!(reported_flags(payload, 9), (None, None), "no such vf");
}

#[test]
fn link_reply_is_parsed() {
    let reply = Reply::Ack {
        msg_type: 16,
        payloads: vec![pf_reply()],
    };
    let mut c = RtnlConn::new(Script::new(vec![reply]));
    let link = c.link(LinkRef::Index(7)).unwrap().unwrap();
    assert_eq!(link.name, "ens1f0");
    assert_eq!(link.mtu, 1500);
    assert!(link.up);
    assert_eq!(link.mac.unwrap().to_string(), "0c:42:a1:00:00:01");
}

#[test]
fn garbage_replies_are_errors_not_panics() {
    use crate::netdev::nl::{Conn, Kind, Transport};
    struct Raw(Vec<Vec<u8>>);
    impl Transport for Raw {
        fn send(&mut self, _: &[u8]) -> std::io::Result<()> {
            Ok(())
        }
        fn recv(&mut self) -> std::io::Result<Vec<u8>> {
            self.0.pop().ok_or_else(|| std::io::Error::other("dry"))
        }
    }
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![1, 2, 3],
        nlmsghdr(8, 2, 0, 1),
        nlmsghdr(400, 16, 0, 1),
        nlmsghdr(16, 2, 0, 1),
    ];
    for case in cases {
        let mut c = Conn::new(Raw(vec![case.clone()]));
        assert!(c.request("t", 18, Kind::Do, &[]).is_err(), "{case:?}");
    }
}

#[test]
fn a_dump_that_fails_midway_is_an_error_not_a_short_list() {
    let reply = Reply::DumpFailed {
        msg_type: 16,
        errno: libc::ENOBUFS,
    };
    let mut c = RtnlConn::new(Script::new(vec![reply]));
    let e = c.links().unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOBUFS), "{e}");
}

#[test]
fn an_inconsistent_dump_is_asked_for_again() {
    let interrupted = || Reply::DumpInterrupted {
        msg_type: 16,
        payloads: vec![pf_reply(), pf_reply()],
    };
    let whole = Reply::Dump {
        msg_type: 16,
        payloads: vec![pf_reply()],
    };
    let mut c = RtnlConn::new(Script::new(vec![interrupted(), whole]));
    let links = c.links().unwrap();
    assert_eq!(links.len(), 1, "{links:?}");
    assert_eq!(c.transport().sent.len(), 2);

    let mut c = RtnlConn::new(Script::new(vec![
        interrupted(),
        interrupted(),
        interrupted(),
    ]));
    let e = c.links().unwrap_err().to_string();
    assert!(e.contains("dump interrupted"), "{e}");
}
