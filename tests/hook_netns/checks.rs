//! Checks of the stand-ins shared by the hook's netns tests.

use super::net::{arp_notify, link, In, Veth};

pub const ORIG_MTU: u32 = 1500;

/// The stand-in is back on the host exactly as it was.
pub fn assert_home(v: &Veth) {
    let l = link(In::Host, &v.name).unwrap_or_else(|| panic!("{} is not back on the host", v.name));
    assert_eq!(l.address.as_deref(), Some(v.mac.as_str()), "{l:?}");
    assert_eq!(l.mtu, ORIG_MTU, "{l:?}");
    assert!(!l.up(), "{l:?}");
    assert!(l.altnames.is_empty(), "{l:?}");
}

pub fn assert_in_pod(at: In<'_>, ifname: &str, mac: &str, mtu: u32) {
    let l = link(at, ifname).unwrap_or_else(|| panic!("{ifname} is not in the pod"));
    assert_eq!(l.address.as_deref(), Some(mac), "{l:?}");
    assert_eq!(l.mtu, mtu, "{l:?}");
    assert!(l.up(), "{l:?}");
    assert_eq!(arp_notify(at, ifname), "1", "arp_notify of {ifname}");
}

pub fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
