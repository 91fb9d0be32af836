//! A link's PCI function on kernels before 5.16: taken from ethtool's
//! `bus_info` where rtnetlink sends no `IFLA_PARENT_DEV_NAME`. The scripted
//! socket checks what `RtnlConn` asks and keeps; the real kernel checks the
//! ioctl itself on a veth in a namespace of its own.

use std::process::Command;

use crate::netdev::ethtool::{self, Drv};
use crate::netdev::nl::script::{Reply, Script};
use crate::netdev::nl::{NlSocket, Transport};
use crate::netdev::rtnl::{LinkRef, Rtnl, RtnlConn};

/// An RTM_NEWLINK payload: `struct ifinfomsg`, IFLA_IFNAME (3) and, if given,
/// IFLA_PARENT_DEV_NAME (56).
pub(super) fn link_payload(index: i32, name: impl AsRef<[u8]>, parent: Option<&str>) -> Vec<u8> {
    let attr = |kind: u16, text: &[u8]| {
        let mut value = text.to_vec();
        value.push(0);
        let mut v = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        v.extend(kind.to_ne_bytes());
        v.extend(value);
        v.resize(v.len().next_multiple_of(4), 0);
        v
    };
    let mut body = vec![0u8, 0, 0, 0];
    body.extend(index.to_ne_bytes());
    body.extend([0u8; 8]);
    body.extend(attr(3, name.as_ref()));
    if let Some(p) = parent {
        body.extend(attr(56, p.as_bytes()));
    }
    body
}

pub(super) fn conn(replies: Vec<Reply>, old_kernel: bool) -> RtnlConn<Script> {
    let mut script = Script::new(replies);
    script.drv = vec![
        (b"ens1f0v1", "mlx5_core", "0000:3b:00.3"),
        (b"veth0", "veth", ""),
        (b"eth0", "virtio_net", "0000:00:03.0"),
    ];
    RtnlConn::new(script).with_parent_by_ethtool(old_kernel)
}

fn one(name: &str, parent: Option<&str>) -> Reply {
    at(5, name, parent)
}

fn at(index: i32, name: &str, parent: Option<&str>) -> Reply {
    Reply::Ack {
        msg_type: 16,
        payloads: vec![link_payload(index, name, parent)],
    }
}

#[test]
fn an_old_kernels_vf_is_known_by_its_bus_info() {
    let mut c = conn(vec![one("ens1f0v1", None)], true);
    let link = c.link(LinkRef::Name("ens1f0v1")).unwrap().unwrap();
    assert_eq!(link.parent.as_deref(), Some("0000:3b:00.3"));
    assert_eq!(c.transport().asked, ["ens1f0v1"]);
    assert_eq!(
        c.transport().sent.len(),
        1,
        "the notices stand for a second lookup"
    );
}

/// A pod renaming its links between the listing and the ioctl (to have the
/// VF's name answer for a dummy, or the reverse, then renaming them back):
/// the listed link's notice says it changed, and its function is taken as
/// unknown once the lookup was overtaken three times.
#[test]
fn a_link_renamed_meanwhile_has_no_parent() {
    let thrice = |during: Option<Vec<Vec<u8>>>| {
        let mut c = conn((0..3).map(|_| one("ens1f0v1", None)).collect(), true);
        for _ in 0..3 {
            c_during(&mut c, during.clone());
        }
        let link = c.link(LinkRef::Name("ens1f0v1")).unwrap().unwrap();
        assert_eq!(c.transport().sent.len(), 3);
        link.parent
    };
    let renamed = vec![notice(16, 5, "tmp"), notice(16, 5, "ens1f0v1")];
    assert_eq!(thrice(Some(renamed)), None, "renamed");
    // Notices lost to an overflowing queue: nothing can be told.
    assert_eq!(thrice(None), None, "notices lost");
    // Deleted meanwhile (and another link made under the name).
    assert_eq!(
        thrice(Some(vec![notice(17, 5, "ens1f0v1")])),
        None,
        "deleted"
    );
}

/// udev renaming a VF's netdev just after its driver registered it: the
/// lookup it overtook is made again, and the next one tells the function.
#[test]
fn a_lookup_overtaken_once_is_made_again() {
    for during in [Some(vec![notice(16, 5, "eth7")]), None] {
        let mut c = conn((0..2).map(|_| one("ens1f0v1", None)).collect(), true);
        c_during(&mut c, during);
        let link = c.link(LinkRef::Name("ens1f0v1")).unwrap().unwrap();
        assert_eq!(link.parent.as_deref(), Some("0000:3b:00.3"));
        assert_eq!(c.transport().sent.len(), 2);
        assert_eq!(c.transport().asked, ["ens1f0v1", "ens1f0v1"]);
    }
}

/// A listing serves restores, which match by MAC where the parent is
/// unknown: it is not made again.
#[test]
fn a_listing_overtaken_is_not_made_again() {
    let dump = Reply::Dump {
        msg_type: 16,
        payloads: vec![link_payload(5, "ens1f0v1", None)],
    };
    let mut c = conn(vec![dump], true);
    c_during(&mut c, None);
    let links = c.links().unwrap();
    assert_eq!(links[0].parent, None);
    assert_eq!(c.transport().sent.len(), 1);
}

/// Notices of other links, of this one before its listing, and of this one
/// under its listed name (carrier, MTU, up or down) say nothing of what the
/// ioctl answered for.
#[test]
fn other_notices_leave_the_parent_known() {
    let mut c = conn(vec![one("ens1f0v1", None)], true);
    let during = vec![notice(16, 6, "veth0"), notice(16, 5, "ens1f0v1")];
    c_during(&mut c, Some(during));
    c.transport_mut().queued = vec![notice(16, 5, "tmp")];
    let link = c.link(LinkRef::Name("ens1f0v1")).unwrap().unwrap();
    assert_eq!(link.parent.as_deref(), Some("0000:3b:00.3"));
}

/// A transport that watches no links cannot tell a rename: no parent.
#[test]
fn without_notices_no_parent_is_taken() {
    struct Blind(Script);
    impl Transport for Blind {
        fn send(&mut self, d: &[u8]) -> std::io::Result<()> {
            self.0.send(d)
        }
        fn recv(&mut self) -> std::io::Result<Vec<u8>> {
            self.0.recv()
        }
        fn drvinfo(&mut self, name: &[u8]) -> std::io::Result<Option<Drv>> {
            self.0.drvinfo(name)
        }
    }
    let script = conn(vec![one("ens1f0v1", None)], true).into_transport();
    let mut c = RtnlConn::new(Blind(script)).with_parent_by_ethtool(true);
    let link = c.link(LinkRef::Name("ens1f0v1")).unwrap().unwrap();
    assert_eq!(link.parent, None);
    assert_eq!(c.transport().0.asked, ["ens1f0v1"]);
}

/// A link notice as the kernel queues it: `RTM_NEWLINK` (16) or `RTM_DELLINK` (17).
pub(super) fn notice(kind: u16, index: i32, name: impl AsRef<[u8]>) -> Vec<u8> {
    crate::netdev::nl::frame(kind, 0, 0, &link_payload(index, name, None))
}

pub(super) fn c_during(c: &mut RtnlConn<Script>, notices: Option<Vec<Vec<u8>>>) {
    c.transport_mut().during_drvinfo.push_back(notices);
}

#[test]
fn a_virtual_links_bus_info_is_no_parent() {
    let mut c = conn(vec![one("veth0", None)], true);
    let link = c.link(LinkRef::Name("veth0")).unwrap().unwrap();
    assert_eq!(link.parent, None);
    assert_eq!(c.transport().asked, ["veth0"]);
}

#[test]
fn the_kernels_attribute_wins_and_costs_no_ioctl() {
    // virtio_net: the attribute names the virtio device, bus_info its PCI function.
    let mut c = conn(vec![one("eth0", Some("virtio2"))], true);
    let link = c.link(LinkRef::Name("eth0")).unwrap().unwrap();
    assert_eq!(link.parent.as_deref(), Some("virtio2"));
    assert!(c.transport().asked.is_empty());
}

#[test]
fn a_new_kernel_asks_ethtool_nothing() {
    let mut c = conn(vec![one("ens1f0v1", None)], false);
    let link = c.link(LinkRef::Name("ens1f0v1")).unwrap().unwrap();
    assert_eq!(link.parent, None, "a link without the attribute is virtual");
    assert!(c.transport().asked.is_empty());
}

#[test]
fn a_dump_on_an_old_kernel_fills_every_link() {
    let dump = Reply::Dump {
        msg_type: 16,
        payloads: vec![
            link_payload(1, "lo", None),
            link_payload(5, "ens1f0v1", None),
            link_payload(6, "veth0", None),
        ],
    };
    let mut c = conn(vec![dump], true);
    let parents: Vec<_> = c
        .links()
        .unwrap()
        .into_iter()
        .map(|l| (l.name, l.parent))
        .collect();
    assert_eq!(
        parents,
        [
            ("lo".to_string(), None),
            ("ens1f0v1".to_string(), Some("0000:3b:00.3".to_string())),
            ("veth0".to_string(), None),
        ]
    );
    assert_eq!(c.transport().asked, ["lo", "ens1f0v1", "veth0"]);
}

/// Runs `f` on a thread of its own in a new network namespace (netns is per
/// thread), with `ip` at hand there: children inherit the thread's namespace.
pub(super) fn in_new_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it makes a network namespace and a veth pair"
    );
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare netns");
        f()
    })
    .join()
    .expect("test thread")
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?}: {out:?}");
}

#[test]
fn the_real_kernel_answers_drvinfo_on_a_netlink_socket() {
    let (veth, lo, gone, via_rtnl) = in_new_netns(|| {
        ip(&[
            "link", "add", "dgeth0", "type", "veth", "peer", "name", "dgeth1",
        ]);
        let mut sock = NlSocket::open(netlink_sys::constants::NETLINK_ROUTE).unwrap();
        let veth = sock.drvinfo(b"dgeth0").unwrap();
        let lo = sock.drvinfo(b"lo").unwrap();
        let gone = sock.drvinfo(b"dgnosuch0").unwrap();
        let mut c = RtnlConn::new(sock).with_parent_by_ethtool(true);
        let via_rtnl = c.link(LinkRef::Name("dgeth0")).unwrap().unwrap();
        (veth, lo, gone, via_rtnl)
    });
    assert_eq!(
        veth,
        Some(Drv {
            driver: "veth".to_string(),
            bus_info: String::new()
        })
    );
    // The loopback has no get_drvinfo and no parent device: EOPNOTSUPP.
    assert_eq!(lo, None);
    assert_eq!(gone, None, "ENODEV");
    assert_eq!(via_rtnl.parent, None, "a veth has no pci function");
    // The namespace was the thread's: the host's sockets do not see its links.
    let mut host = NlSocket::open(netlink_sys::constants::NETLINK_ROUTE).unwrap();
    assert_eq!(host.drvinfo(b"dgeth0").unwrap(), None);
    assert!(!ethtool::kernel_release().is_empty());
}

/// A real socket in a fresh netns whose ethtool answer stands in for a VF's
/// (a veth has no PCI function), its ioctl made between `ip` renames as a pod
/// with `NET_ADMIN` could make them.
struct Racing {
    sock: NlSocket,
    before: &'static [&'static [&'static str]],
    after: &'static [&'static [&'static str]],
}

impl Transport for Racing {
    fn send(&mut self, d: &[u8]) -> std::io::Result<()> {
        self.sock.send(d)
    }
    fn recv(&mut self) -> std::io::Result<Vec<u8>> {
        self.sock.recv()
    }
    fn drvinfo(&mut self, name: &[u8]) -> std::io::Result<Option<Drv>> {
        self.before.iter().for_each(|a| ip(a));
        let real = self.sock.drvinfo(name)?;
        self.after.iter().for_each(|a| ip(a));
        assert_eq!(real.map(|d| d.driver).as_deref(), Some("veth"));
        Ok(Some(Drv {
            driver: "mlx5_core".to_string(),
            bus_info: "0000:3b:00.3".to_string(),
        }))
    }
    fn link_notices(&mut self) -> std::io::Result<Option<Vec<Vec<u8>>>> {
        self.sock.link_notices()
    }
}

#[test]
fn the_real_kernels_notices_catch_names_swapped_around_the_ioctl() {
    const SWAP: &[&[&str]] = &[
        &["link", "set", "dgvf0", "name", "dgtmp0"],
        &["link", "set", "dgdum0", "name", "dgvf0"],
    ];
    const BACK: &[&[&str]] = &[
        &["link", "set", "dgvf0", "name", "dgdum0"],
        &["link", "set", "dgtmp0", "name", "dgvf0"],
    ];
    const OTHER: &[&[&str]] = &[&["link", "set", "dgx0", "name", "dgy0"]];
    const OTHER_BACK: &[&[&str]] = &[&["link", "set", "dgy0", "name", "dgx0"]];
    const MTU: &[&[&str]] = &[&["link", "set", "dgvf0", "mtu", "1400"]];
    let parents = in_new_netns(|| {
        // dgvf0 plays the VF, dgdum0 the pod's dummy.
        ip(&[
            "link", "add", "dgvf0", "type", "veth", "peer", "name", "dgdum0",
        ]);
        ip(&[
            "link", "add", "dgx0", "type", "veth", "peer", "name", "dgx1",
        ]);
        let parent = |before, after| {
            let sock = NlSocket::open(netlink_sys::constants::NETLINK_ROUTE)
                .unwrap()
                .with_link_watch()
                .unwrap();
            let racing = Racing {
                sock,
                before,
                after,
            };
            let mut c = RtnlConn::new(racing).with_parent_by_ethtool(true);
            let link = c.link(LinkRef::Name("dgvf0")).unwrap().unwrap();
            assert_eq!(link.name, "dgvf0");
            link.parent
        };
        [
            parent(&[], &[]),
            parent(SWAP, BACK),
            parent(OTHER, OTHER_BACK),
            parent(MTU, &[]),
        ]
    });
    let vf = Some("0000:3b:00.3".to_string());
    assert_eq!(parents[0], vf, "nothing renamed");
    assert_eq!(parents[1], None, "the ioctl answered for the dummy");
    assert_eq!(parents[2], vf, "another link renamed");
    assert_eq!(parents[3], vf, "the link's mtu changed: no rename");
}

#[test]
fn notices_are_read_from_whole_datagrams_and_bounded() {
    use crate::netdev::linkwatch::{link_messages, Changed};
    use crate::netdev::nl::frame;
    let mut datagram = notice(16, 5, "ens1f0v1");
    datagram.extend(frame(20, 0, 0, &[0; 8])); // RTM_NEWADDR: no link notice
    datagram.extend(notice(17, 7, "dummy0"));
    datagram.extend(notice(16, 8, "tmp"));
    let mut out = Vec::new();
    assert!(link_messages(&datagram, &mut out));
    assert_eq!(out.len(), 3);
    let mut changed = Changed::default();
    changed.add(Some(out));
    assert!(
        !changed.renamed_or_gone(5, "ens1f0v1"),
        "same name: no rename"
    );
    assert!(changed.renamed_or_gone(7, "dummy0"), "deleted");
    assert!(changed.renamed_or_gone(8, "eth3"), "renamed");
    assert!(!changed.renamed_or_gone(6, "eth6"), "no notice");
    // A port leaving a bridge (RTM_DELLINK of family AF_BRIDGE) stays a link.
    let mut port_out = notice(17, 9, "eth9");
    port_out[16] = libc::AF_BRIDGE as u8;
    let mut changed = Changed::default();
    changed.add(Some(vec![port_out]));
    assert!(!changed.renamed_or_gone(9, "eth9"), "bridge port removed");
    let mut out = Vec::new();
    assert!(
        !link_messages(&datagram[..datagram.len() - 3], &mut out),
        "cut short"
    );
    // A notice without its ifindex, or more links than are kept: every link.
    let mut changed = Changed::default();
    changed.add(Some(vec![frame(16, 0, 0, &[0; 4])]));
    assert!(changed.renamed_or_gone(1, "x"));
    let mut changed = Changed::default();
    changed.add(Some((0..1025).map(|i| notice(16, i, "x")).collect()));
    assert!(changed.renamed_or_gone(4096, "y"));
}
