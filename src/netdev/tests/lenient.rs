//! Link messages carrying text that is not UTF-8 (a name, an altname or an
//! alias a container with `NET_ADMIN` set) still read: scripted bytes, and
//! the real kernel's answer for a veth a namespace of the test's own renamed.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use crate::netdev::nl::{nla, NlSocket};
use crate::netdev::rtnl::{parse_link, Rtnl, RtnlConn};

fn with_nul(b: &[u8]) -> Vec<u8> {
    let mut v = b.to_vec();
    v.push(0);
    v
}

/// `struct ifinfomsg` for index 7, then the attributes.
fn payload(name: &[u8], alias: Option<&[u8]>, altnames: &[&[u8]]) -> Vec<u8> {
    let mut p = vec![0u8, 0, 0, 0];
    p.extend(7i32.to_ne_bytes());
    p.extend([0u8; 8]);
    p.extend(nla(3, &with_nul(name)));
    if let Some(a) = alias {
        p.extend(nla(20, &with_nul(a)));
    }
    let props: Vec<u8> = altnames
        .iter()
        .flat_map(|n| nla(53, &with_nul(n)))
        .collect();
    // IFLA_PROP_LIST | NLA_F_NESTED, as the kernel sends it.
    p.extend(nla(52 | 0x8000, &props));
    p
}

#[test]
fn text_that_is_not_utf8_is_mended_not_refused() {
    let (link, _) = parse_link(
        "t",
        &payload(b"net1", Some(b"\xff\xfe"), &[b"ok0", b"\xffx"]),
    )
    .unwrap();
    assert_eq!(link.index, 7);
    assert_eq!(link.name, "net1");
    assert_eq!(link.altnames, ["ok0"]);
    let (link, _) = parse_link("t", &payload(b"n\xffe", None, &[])).unwrap();
    assert_eq!(link.name, "n\u{fffd}e");
    // Plain text reads as it is.
    let (link, _) = parse_link("t", &payload(b"net1", Some(b"uplink"), &[b"ok0"])).unwrap();
    assert_eq!(
        (link.name.as_str(), link.altnames.as_slice()),
        ("net1", &["ok0".to_string()][..])
    );
    // What mending cannot help still fails.
    assert!(parse_link("t", &[0u8; 8]).is_err());
}

#[test]
fn the_real_kernels_listing_reads_a_link_named_in_bytes() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it makes a network namespace and a veth pair"
    );
    let names = std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare netns");
        let ip = |args: &[&OsStr]| {
            let out = Command::new("ip").args(args).output().expect("run ip");
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        };
        let s = |t: &'static str| OsStr::new(t);
        ip(&[
            s("link"),
            s("add"),
            s("dglen0"),
            s("type"),
            s("veth"),
            s("peer"),
            s("name"),
            s("dglen1"),
        ]);
        ip(&[
            s("link"),
            s("set"),
            s("dglen0"),
            s("alias"),
            OsStr::from_bytes(b"\xff\xfe"),
        ]);
        ip(&[
            s("link"),
            s("property"),
            s("add"),
            s("dev"),
            s("dglen0"),
            s("altname"),
            OsStr::from_bytes(b"alt\xff"),
        ]);
        ip(&[
            s("link"),
            s("set"),
            s("dglen1"),
            s("name"),
            OsStr::from_bytes(b"dg\xffx"),
        ]);
        let sock = NlSocket::open(netlink_sys::constants::NETLINK_ROUTE).unwrap();
        let mut c = RtnlConn::new(sock);
        let links = c.links().expect("a listing with such names");
        links
            .into_iter()
            .map(|l| (l.name, l.altnames))
            .collect::<Vec<_>>()
    })
    .join()
    .expect("test thread");
    assert!(
        names.contains(&("dglen0".to_string(), Vec::new())),
        "{names:?}"
    );
    assert!(names.iter().any(|(n, _)| n == "dg\u{fffd}x"), "{names:?}");
}

/// A message broken for another reason is not made to read by mending.
#[test]
fn only_text_is_mended() {
    let mut broken = payload(b"n\xffe", None, &[]);
    // An attribute claiming more bytes than follow.
    broken.extend([200u8, 0, 4, 0, 1, 2]);
    assert!(parse_link("t", &broken).is_err());
    assert!(crate::netdev::lenient::mend(&payload(b"net1", Some(b"ok"), &[])).is_none());
}
