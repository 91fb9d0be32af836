//! A netdev's PCI function by ethtool, for kernels whose rtnetlink does not
//! report it.
//!
//! `IFLA_PARENT_DEV_NAME` came with Linux 5.16 (commit 00e77ed8e64d, "rtnetlink:
//! add IFLA_PARENT_[DEV|DEV_BUS]_NAME"). Before it, a VF netdev's identity is
//! what `ETHTOOL_GDRVINFO` reports as `bus_info`: the driver's `pci_name()`
//! (mlx5, ice, i40e, ixgbevf, bnxt), or, for a driver without `get_drvinfo`, the
//! parent device's name (net/ethtool/ioctl.c, `ethtool_get_drvinfo`). The ioctl
//! needs no capability and works on any socket of the link's netns: a netlink
//! socket has no ioctls of its own, so `sock_do_ioctl` hands `SIOCETHTOOL` to
//! `dev_ioctl` in the socket's netns (net/socket.c).

use std::io;
use std::os::fd::RawFd;

use crate::inventory::PciAddr;

// include/uapi/linux/sockios.h, include/uapi/linux/ethtool.h
const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
const IFNAMSIZ: usize = 16;
const ETHTOOL_BUSINFO_LEN: usize = 32;

/// `struct ethtool_drvinfo`.
#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; ETHTOOL_BUSINFO_LEN],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// `struct ifreq` with `ifr_data`, padded to the kernel's size (40 bytes on
/// 64-bit: the union holds a `struct ifmap`).
#[repr(C)]
struct IfReqData {
    name: [u8; IFNAMSIZ],
    data: *mut DrvInfo,
    _pad: [u8; 16],
}

/// What `ETHTOOL_GDRVINFO` says of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drv {
    pub driver: String,
    pub bus_info: String,
}

/// `ETHTOOL_GDRVINFO` for the link `name` in the netns of socket `fd`.
/// `None` when there is no such link or its driver reports nothing
/// (ENODEV, EOPNOTSUPP).
pub fn drvinfo(fd: RawFd, name: &str) -> io::Result<Option<Drv>> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= IFNAMSIZ || bytes.contains(&0) {
        return Ok(None);
    }
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut info: DrvInfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    let mut req = IfReqData {
        name: [0; IFNAMSIZ],
        data: &mut info,
        _pad: [0; 16],
    };
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `req` and `info` live across the call; the kernel writes at most
    // `sizeof(struct ethtool_drvinfo)` through `data` and reads `req`.
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req as *mut IfReqData) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODEV) | Some(libc::EOPNOTSUPP) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(Drv {
        driver: c_str(&info.driver),
        bus_info: c_str(&info.bus_info),
    }))
}

fn c_str(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// The PCI function in a `bus_info`, in sysfs form; `None` for anything else
/// (virtual links report "", "tun", "N/A", a virtio device's parent...).
pub fn pci_bus_info(bus_info: &str) -> Option<String> {
    bus_info.parse::<PciAddr>().ok().map(|a| a.to_string())
}

/// Whether a kernel of this `uname -r` release lacks `IFLA_PARENT_DEV_NAME`
/// (before 5.16). A release that does not parse counts as new: the attribute
/// is then expected, and its absence means a virtual link.
pub fn release_lacks_parent_attr(release: &str) -> bool {
    let mut nums = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (nums.next().flatten(), nums.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) < (5, 16),
        _ => false,
    }
}

/// The running kernel's release, `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: all-zero is a valid utsname; uname fills it with NUL-terminated fields.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut uts) } != 0 {
        return String::new();
    }
    let bytes: Vec<u8> = uts.release.iter().map(|&c| c as u8).collect();
    c_str(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel() {
        // struct ethtool_drvinfo is 196 bytes; struct ifreq 40 on 64-bit.
        assert_eq!(std::mem::size_of::<DrvInfo>(), 196);
        assert_eq!(std::mem::size_of::<IfReqData>(), 40);
    }

    #[test]
    fn releases_before_5_16_lack_the_attribute() {
        for (release, lacks) in [
            ("4.18.0-513.5.1.el8_9.x86_64", true),
            ("5.4.0-150-generic", true),
            ("5.14.0-362.8.1.el9_3.x86_64", true),
            ("5.15.0-91-generic", true),
            ("5.16.0", false),
            ("6.8.0-49-generic", false),
            ("10.1", false),
            ("", false),
            ("garbage", false),
            ("5", false),
        ] {
            assert_eq!(release_lacks_parent_attr(release), lacks, "{release}");
        }
    }

    #[test]
    fn only_pci_addresses_are_bus_info() {
        assert_eq!(
            pci_bus_info("0000:3b:00.2").as_deref(),
            Some("0000:3b:00.2")
        );
        assert_eq!(
            pci_bus_info("0000:3B:00.2").as_deref(),
            Some("0000:3b:00.2")
        );
        for other in [
            "",
            "tun",
            "N/A",
            "virtio2",
            "0000:3b:00",
            "usb-0000:00:14.0-1",
        ] {
            assert_eq!(pci_bus_info(other), None, "{other}");
        }
    }

    #[test]
    fn names_the_kernel_cannot_hold_are_no_link() {
        let long = "x".repeat(IFNAMSIZ);
        for name in ["", long.as_str(), "a\0b"] {
            assert_eq!(drvinfo(-1, name).unwrap(), None, "{name:?}");
        }
    }
}
