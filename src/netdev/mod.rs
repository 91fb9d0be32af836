//! VF netdevs and RDMA devices in and out of pod network namespaces.
//!
//! Layers, bottom up:
//! - `nl`: netlink framing over a [`nl::Transport`] (a real socket or a script);
//! - `rtnl`, `rdma`: the link and RDMA device operations behind the narrow
//!   [`Rtnl`] and [`RdmaNl`] traits, encoded with netlink-packet-route (rtnetlink)
//!   and by hand (RDMA netlink);
//! - `netns`: namespace handles and per-thread entry;
//! - `saved`: the crash-safe record of each VF's original state;
//! - `vf`, `restore`: attach and detach as transactions over a [`NetEnv`].
//!
//! Synchronous on purpose: the hook runs on the container-start path, and the
//! plugin calls this from a dedicated thread (setns is per thread).

mod chars;
mod error;
pub mod ethtool;
mod extack;
mod find_pf;
pub(crate) mod lenient;
pub mod linkwatch;
pub mod netns;
mod netns_mounts;
pub mod nl;
pub mod rdma;
mod rdma_in_netns;
mod restore;
mod restore_find;
mod restore_rdma;
pub mod rtnl;
pub mod saved;
pub mod settings;
mod vf;
mod vf_prepare;
pub mod vfinfo;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

pub use error::{Cause, VfError};
pub use netns::{Netns, NetnsError, NetnsGuard, NetnsId, NetnsRoots};
pub use nl::NlError;
pub use rdma::{NetnsMode, RdmaConn, RdmaNl};
pub use restore::{detach_listed, detach_vf};
pub use rtnl::{Link, LinkChange, LinkRef, Rtnl, RtnlConn};
pub use saved::{ContainerScan, SavedError, SavedStore, SavedVf};
pub use settings::{CharNum, HwAddr, LinkState, SettingsError, VfAttach, VfSettings, VlanProto};
pub use vf::{attach_all, VfOps};
pub use vfinfo::VfField;

use saved::SavedNetns;

/// The OS side of VF work: netlink sockets per namespace and finding namespaces.
pub trait NetEnv {
    /// The namespace devices return to.
    fn host_netns(&self) -> &Netns;
    /// rtnetlink in `ns`, or in the host namespace for `None`.
    fn rtnl(&mut self, ns: Option<&Netns>) -> Result<Box<dyn Rtnl>, Cause>;
    /// RDMA netlink in `ns`, or in the host namespace for `None`. The
    /// calling thread is in that namespace until the connection drops (see
    /// `rdma_in_netns`): hold it no longer than its requests.
    fn rdma(&mut self, ns: Option<&Netns>) -> Result<Box<dyn RdmaNl>, Cause>;
    /// The saved namespace, if it still exists.
    fn find_netns(&self, saved: &SavedNetns) -> Option<Netns>;
    /// Sets `net.ipv4.conf.<ifname>.arp_notify = 1` in `ns`, so the kernel sends a
    /// gratuitous ARP when the link comes up or its MAC changes (ip-sysctl.rst):
    /// peers learn the VF's new location at once instead of after their ARP
    /// entries time out. No undo is needed: a netdev that changes namespace gets a
    /// fresh `in_device` with the target namespace's defaults (inetdev_event on
    /// NETDEV_UNREGISTER / NETDEV_REGISTER).
    fn set_arp_notify(&mut self, ns: &Netns, ifname: &str) -> Result<(), Cause>;
    /// The char devices (`uverbsN`, `umadN`, `issmN`) the RDMA device `ibdev`
    /// has now, sorted. Their class devices are not netns-tagged: the host's
    /// sysfs lists them wherever the device is.
    fn rdma_chars(&mut self, ibdev: &str) -> Result<Vec<CharNum>, Cause>;
    /// The PCI address of the PF whose VF `vf` is (sysfs `physfn`); `None`
    /// where the host's sysfs has no such link.
    fn vf_physfn(
        &mut self,
        vf: crate::inventory::PciAddr,
    ) -> Result<Option<crate::inventory::PciAddr>, Cause>;
    /// The names of the RDMA devices of the PCI function `vf` that the
    /// host's namespace holds now (sysfs `<vf>/infiniband/`, whose entries
    /// are netns-tagged with `ib_class`), sorted.
    fn vf_rdma(&mut self, vf: crate::inventory::PciAddr) -> Result<Vec<String>, Cause>;
    /// Waits `step` (the real environment sleeps): a VF whose namespace died
    /// comes home from a kernel workqueue some time after the namespace is
    /// gone.
    fn pause(&mut self, step: std::time::Duration);
    /// What [`NetEnv::pause`] waited in all, so that the VFs of one pod
    /// share one bound.
    fn paused(&self) -> std::time::Duration;
}

/// The real environment: sockets are created inside each namespace on the
/// calling thread, which returns to where it was before the call ends, or,
/// for RDMA netlink, when the connection drops.
pub struct SysNetEnv {
    host: Netns,
    roots: NetnsRoots,
    sys_root: std::path::PathBuf,
    paused: std::time::Duration,
}

impl SysNetEnv {
    /// The calling thread's namespace is the host's.
    pub fn new(roots: NetnsRoots) -> Result<SysNetEnv, NetnsError> {
        Ok(SysNetEnv {
            host: Netns::current()?,
            roots,
            sys_root: std::path::PathBuf::from("/sys"),
            paused: std::time::Duration::ZERO,
        })
    }

    /// With the host's sysfs at `sys_root` (`<host-root>/sys`).
    pub fn with_sys_root(mut self, sys_root: std::path::PathBuf) -> Self {
        self.sys_root = sys_root;
        self
    }
}

impl NetEnv for SysNetEnv {
    fn host_netns(&self) -> &Netns {
        &self.host
    }

    fn rtnl(&mut self, ns: Option<&Netns>) -> Result<Box<dyn Rtnl>, Cause> {
        let _guard = ns.unwrap_or(&self.host).enter()?;
        Ok(Box::new(RtnlConn::open()?))
    }

    fn rdma(&mut self, ns: Option<&Netns>) -> Result<Box<dyn RdmaNl>, Cause> {
        // The thread stays in `ns` while the connection lives: the kernel
        // moves a device only for a caller in the device's namespace.
        let conn = rdma_in_netns::InNetns::open(ns.unwrap_or(&self.host), RdmaConn::open)?;
        Ok(Box::new(conn))
    }

    fn find_netns(&self, saved: &SavedNetns) -> Option<Netns> {
        self.roots.find(saved.id, saved.path.as_deref())
    }

    fn set_arp_notify(&mut self, ns: &Netns, ifname: &str) -> Result<(), Cause> {
        // /proc/sys/net resolves against the opening thread's netns (net_ctl_header_lookup).
        let _guard = ns.enter()?;
        let path = self
            .roots
            .proc_root
            .join("sys/net/ipv4/conf")
            .join(ifname)
            .join("arp_notify");
        std::fs::write(&path, b"1").map_err(|source| Cause::Sysctl { path, source })
    }

    fn rdma_chars(&mut self, ibdev: &str) -> Result<Vec<CharNum>, Cause> {
        chars::rdma_chars(&self.sys_root, ibdev)
    }

    fn vf_rdma(&mut self, vf: crate::inventory::PciAddr) -> Result<Vec<String>, Cause> {
        chars::function_rdma(&self.sys_root, vf)
    }

    fn pause(&mut self, step: std::time::Duration) {
        std::thread::sleep(step);
        self.paused += step;
    }

    fn paused(&self) -> std::time::Duration {
        self.paused
    }

    fn vf_physfn(
        &mut self,
        vf: crate::inventory::PciAddr,
    ) -> Result<Option<crate::inventory::PciAddr>, Cause> {
        // drivers/pci/iov.c (pci_iov_sysfs_link): `physfn` links a VF to its
        // PF's device directory, named by the PF's address.
        let path = self
            .sys_root
            .join("bus/pci/devices")
            .join(vf.to_string())
            .join("physfn");
        match std::fs::read_link(&path) {
            Ok(target) => Ok(target
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Cause::Sysfs { path, source }),
        }
    }
}
