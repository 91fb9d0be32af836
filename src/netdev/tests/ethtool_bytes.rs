//! A link a pod renamed to bytes that are not UTF-8, on a kernel that sends
//! no PCI parent: ethtool is asked by the name's bytes, and renames are told
//! by bytes, so the VF is still known by its function when its restore looks
//! for it (a name read lossily is another link's name as often as not).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use super::ethtool::{c_during, conn, in_new_netns, link_payload, notice};
use crate::netdev::ethtool::Drv;
use crate::netdev::nl::script::Reply;
use crate::netdev::nl::{NlSocket, Transport};
use crate::netdev::rtnl::{Rtnl, RtnlConn};

fn dump(payloads: Vec<Vec<u8>>) -> Reply {
    Reply::Dump {
        msg_type: 16,
        payloads,
    }
}

#[test]
fn a_name_that_is_not_utf8_asks_ethtool_by_its_bytes() {
    let mut c = conn(
        vec![dump(vec![link_payload(5, b"ens1f0v\xff", None)])],
        true,
    );
    // The lossy reading names another link of the namespace.
    c.transport_mut().drv.extend([
        (&b"ens1f0v\xff"[..], "mlx5_core", "0000:3b:00.4"),
        ("ens1f0v\u{fffd}".as_bytes(), "mlx5_core", "0000:3b:00.9"),
    ]);
    let links = c.links().unwrap();
    assert_eq!(links[0].name, "ens1f0v\u{fffd}");
    assert_eq!(links[0].name_bytes(), b"ens1f0v\xff");
    assert_eq!(links[0].parent.as_deref(), Some("0000:3b:00.4"));
}

/// Renamed away and back during the ioctl through another name that reads
/// the same lossily: a rename all the same.
#[test]
fn a_rename_between_names_that_read_alike_is_one() {
    let parent = |during: Vec<Vec<u8>>| {
        let mut c = conn(
            vec![dump(vec![link_payload(5, b"ens1f0v\xff", None)])],
            true,
        );
        c.transport_mut()
            .drv
            .push((b"ens1f0v\xff", "mlx5_core", "0000:3b:00.4"));
        c_during(&mut c, Some(during));
        c.links().unwrap()[0].parent.clone()
    };
    let renamed = vec![notice(16, 5, b"ens1f0v\xfe"), notice(16, 5, b"ens1f0v\xff")];
    assert_eq!(parent(renamed), None);
    // Its other notices (under the same bytes) leave it known.
    assert_eq!(
        parent(vec![notice(16, 5, b"ens1f0v\xff")]).as_deref(),
        Some("0000:3b:00.4")
    );
}

/// The real kernel's socket, whose ioctl must find the veth by the bytes it
/// was asked with; the answer stands in for a VF's (a veth has no PCI
/// function).
struct ByBytes(NlSocket);

impl Transport for ByBytes {
    fn send(&mut self, d: &[u8]) -> std::io::Result<()> {
        self.0.send(d)
    }
    fn recv(&mut self) -> std::io::Result<Vec<u8>> {
        self.0.recv()
    }
    fn drvinfo(&mut self, name: &[u8]) -> std::io::Result<Option<Drv>> {
        let real = self.0.drvinfo(name)?;
        Ok(real.filter(|d| d.driver == "veth").map(|_| Drv {
            driver: "mlx5_core".to_string(),
            bus_info: "0000:3b:00.3".to_string(),
        }))
    }
    fn link_notices(&mut self) -> std::io::Result<Option<Vec<Vec<u8>>>> {
        self.0.link_notices()
    }
}

#[test]
fn the_real_kernel_answers_ethtool_for_a_name_that_is_not_utf8() {
    let found = in_new_netns(|| {
        let ip = |args: &[&OsStr]| {
            let out = Command::new("ip").args(args).output().expect("run ip");
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        };
        let s = OsStr::new;
        ip(&[
            s("link"),
            s("add"),
            s("dgbv0"),
            s("type"),
            s("veth"),
            s("peer"),
            s("name"),
            s("dgbv1"),
        ]);
        ip(&[
            s("link"),
            s("set"),
            s("dgbv0"),
            s("name"),
            OsStr::from_bytes(b"dgb\xffv"),
        ]);
        let sock = NlSocket::open(netlink_sys::constants::NETLINK_ROUTE)
            .unwrap()
            .with_link_watch()
            .unwrap();
        let mut c = RtnlConn::new(ByBytes(sock)).with_parent_by_ethtool(true);
        c.links()
            .unwrap()
            .into_iter()
            .map(|l| (l.name, l.parent))
            .collect::<Vec<_>>()
    });
    let vf = |name: &str| {
        found
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
    };
    assert_eq!(
        vf("dgb\u{fffd}v"),
        Some(Some("0000:3b:00.3".to_string())),
        "{found:?}"
    );
    assert_eq!(
        vf("dgbv1"),
        Some(Some("0000:3b:00.3".to_string())),
        "{found:?}"
    );
}
