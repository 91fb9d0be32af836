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
//!
//! `dev_ioctl` first calls `dev_load`, which, for a name no link has, asks
//! for module `netdev-<name>` where the caller has `CAP_NET_ADMIN` (the alias
//! tunnel drivers give their fallback devices: `gre0` loads ip_gre) and, with
//! `CAP_SYS_MODULE`, for the module `<name>` itself (net/core/dev_ioctl.c).
//! A name read in a pod's netns is the pod's to choose and can be gone by
//! the time of the ioctl: the call runs with both out of the thread's
//! effective set ([`NoModuleLoading`]; `ETHTOOL_GDRVINFO` needs neither), so
//! no module is ever loaded on a pod's word.

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

/// `ETHTOOL_GDRVINFO` for the link `name` in the netns of socket `fd`: the
/// name's bytes as the kernel holds them, which need not be UTF-8 (a pod's
/// rename). `None` when there is no such link or its driver reports nothing
/// (ENODEV, EOPNOTSUPP).
pub fn drvinfo(fd: RawFd, name: &[u8]) -> io::Result<Option<Drv>> {
    if name.is_empty() || name.len() >= IFNAMSIZ || name.contains(&0) {
        return Ok(None);
    }
    let _no_modules = NoModuleLoading::new()?;
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut info: DrvInfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    let mut req = IfReqData {
        name: [0; IFNAMSIZ],
        data: &mut info,
        _pad: [0; 16],
    };
    req.name[..name.len()].copy_from_slice(name);
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

// include/uapi/linux/capability.h
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_MODULE: u32 = 16;
/// What `dev_load` asks before it loads a module.
const MODULE_CAPS: u32 = (1 << CAP_NET_ADMIN) | (1 << CAP_SYS_MODULE);
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`; version 3 takes two (64 capability bits).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's capability sets (capget with pid 0: this thread).
fn thread_caps() -> io::Result<[CapData; 2]> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: a version-3 header and room for its two data structs.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(data)
}

fn set_thread_caps(data: &[CapData; 2]) -> io::Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: as in `thread_caps`; capset changes only the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `CAP_NET_ADMIN` and `CAP_SYS_MODULE` out of the calling thread's
/// effective set while alive, back in (they stay permitted) when dropped.
/// Capabilities are per thread: the process's other threads keep theirs.
/// A failure to lower them fails the lookup. One to raise them again (they
/// stay permitted, so the kernel has no reason to refuse) would leave the
/// thread without `CAP_NET_ADMIN`: its later netlink changes then fail with
/// EPERM, which fails the container's start or keeps its VF's record.
pub struct NoModuleLoading {
    lowered: u32,
}

impl NoModuleLoading {
    pub fn new() -> io::Result<NoModuleLoading> {
        let mut caps = thread_caps()?;
        let lowered = caps[0].effective & MODULE_CAPS;
        if lowered == 0 {
            return Ok(NoModuleLoading { lowered });
        }
        caps[0].effective &= !lowered;
        set_thread_caps(&caps)?;
        Ok(NoModuleLoading { lowered })
    }
}

impl Drop for NoModuleLoading {
    fn drop(&mut self) {
        if self.lowered == 0 {
            return;
        }
        let raised = thread_caps().and_then(|mut caps| {
            caps[0].effective |= self.lowered;
            set_thread_caps(&caps)
        });
        if let Err(e) = raised {
            tracing::warn!(error = %e, "cap_net_admin and cap_sys_module not raised again");
        }
    }
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

    /// This thread's effective capabilities, from /proc.
    fn cap_eff() -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
        u64::from_str_radix(line["CapEff:".len()..].trim(), 16).unwrap()
    }

    #[test]
    fn module_loading_caps_are_off_for_this_thread_only_while_held() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root: it lowers and raises cap_net_admin and cap_sys_module"
        );
        let bit = u64::from(MODULE_CAPS);
        let (lowered_tx, lowered) = std::sync::mpsc::channel();
        let (checked, checked_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            assert_eq!(cap_eff() & bit, bit, "root starts with both");
            let guard = NoModuleLoading::new().unwrap();
            assert_eq!(cap_eff() & bit, 0, "lowered");
            lowered_tx.send(()).unwrap();
            checked_rx.recv().unwrap();
            drop(guard);
            assert_eq!(cap_eff() & bit, bit, "raised again");
        });
        lowered.recv().unwrap();
        assert_eq!(cap_eff() & bit, bit, "another thread keeps them");
        checked.send(()).unwrap();
        worker.join().unwrap();
    }

    #[test]
    fn names_the_kernel_cannot_hold_are_no_link() {
        let long = "x".repeat(IFNAMSIZ);
        for name in ["", long.as_str(), "a\0b"] {
            assert_eq!(drvinfo(-1, name.as_bytes()).unwrap(), None, "{name:?}");
        }
    }
}
