//! Links looked up by an altname: a long one goes as IFLA_ALT_IFNAME, and the
//! real kernel answers both kinds.

use super::msg::{attr, ifinfomsg, message, sent_by, u32s, REQUEST_ACK};
use crate::netdev::rtnl::{LinkRef, Rtnl, RtnlConn};

/// A name of 16 bytes or more can only be an altname, which IFLA_IFNAME's
/// policy refuses: it goes as IFLA_ALT_IFNAME(53), NUL-terminated.
#[test]
fn getlink_by_a_long_altname() {
    let name = "enp59s0f0np0v3x1";
    let got = sent_by(|c| {
        let _ = c.link(LinkRef::Name(name));
    });
    let mut body = ifinfomsg(0, 0, 0);
    body.extend(attr(53, b"enp59s0f0np0v3x1\0"));
    body.extend(attr(29, &u32s(&[8])));
    assert_eq!(got, message(18, REQUEST_ACK, &body));
}

/// The real kernel finds a link by its altname, short or long, on loopback
/// in a namespace of the test's own; `ip` names it there.
#[test]
fn the_real_kernel_finds_a_link_by_its_altname() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it makes a network namespace"
    );
    let found = std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare netns");
        for alt in ["lo-alt", "a-very-long-altname-of-loopback"] {
            // A child of this thread starts in its network namespace.
            let st = std::process::Command::new("ip")
                .args(["link", "property", "add", "dev", "lo", "altname", alt])
                .status()
                .expect("run ip");
            assert!(st.success(), "ip link property add {alt}");
        }
        let mut c = RtnlConn::open().unwrap();
        [
            "lo-alt",
            "a-very-long-altname-of-loopback",
            "no-such-long-altname-here",
        ]
        .map(|n| c.link(LinkRef::Name(n)).unwrap().map(|l| l.index))
    })
    .join()
    .expect("test thread");
    assert_eq!(found, [Some(1), Some(1), None]);
}
