//! The fake RDMA netlink: devices per namespace, and the kernel's rule that
//! none moves while the subsystem's netns mode is shared.

use std::cell::RefCell;
use std::rc::Rc;

use super::super::netns::Netns;
use super::super::nl::NlError;
use super::super::rdma::{NetnsMode, RdmaNl};
use super::{kernel, Call, Model, HOST};

pub(super) struct FakeRdma {
    pub(super) model: Rc<RefCell<Model>>,
    pub(super) ns: u64,
}

impl RdmaNl for FakeRdma {
    fn devices(&mut self) -> Result<Vec<(u32, String)>, NlError> {
        let m = self.model.borrow();
        Ok(m.rdma
            .iter()
            .filter(|(_, (_, ns))| m.rdma_shared || *ns == self.ns)
            .map(|(n, (i, _))| (*i, n.clone()))
            .collect())
    }

    fn rename(&mut self, index: u32, name: &str) -> Result<(), NlError> {
        // nldev_set_doit finds the device in the socket's namespace.
        let old = self
            .dev_name(index)?
            .ok_or(kernel("fake rdma rename", libc::EINVAL))?;
        let mut m = self.model.borrow_mut();
        if old == name {
            return Ok(());
        }
        // ib_device_rename: a name any device holds, in any namespace.
        if m.rdma.contains_key(name) {
            return Err(kernel("fake rdma rename", libc::EEXIST));
        }
        m.mutate(Call::RdmaRename {
            index,
            name: name.to_string(),
        })?;
        if let Some(dev) = m.rdma.remove(&old) {
            m.rdma.insert(name.to_string(), dev);
        }
        if let Some(chars) = m.rdma_chars.remove(&old) {
            m.rdma_chars.insert(name.to_string(), chars);
        }
        Ok(())
    }

    fn set_netns(&mut self, index: u32, netns: &Netns) -> Result<(), NlError> {
        let mut m = self.model.borrow_mut();
        // ib_device_set_netns_put: no device moves while the mode is shared.
        if m.rdma_shared {
            return Err(kernel("fake rdma set netns", libc::EOPNOTSUPP));
        }
        let to = netns.id().ino;
        // Found in the socket's namespace, and moved only from the caller's
        // (rdma_dev_change_netns: ENODEV otherwise); a connection's thread
        // is in its namespace (`NetEnv::rdma`), so both are `self.ns`.
        let name = m
            .rdma
            .iter()
            .find(|(_, (i, ns))| *i == index && *ns == self.ns)
            .map(|(n, _)| n.clone())
            .ok_or(kernel("fake", libc::ENODEV))?;
        m.mutate(Call::RdmaSetNs {
            name: name.clone(),
            to_ns: to,
        })?;
        if let Some(dev) = m.rdma.get_mut(&name) {
            dev.1 = to;
        }
        if let Some(chars) = m.renumber_on_move.remove(&name) {
            m.rdma_chars.insert(name, chars);
        }
        Ok(())
    }

    fn netns_mode(&mut self) -> Result<NetnsMode, NlError> {
        Ok(if self.model.borrow().rdma_shared {
            NetnsMode::Shared
        } else {
            NetnsMode::Exclusive
        })
    }
}

/// The devices of the PCI function `vf` that the host's sysfs lists: the
/// host's own (`ib_class` is netns-tagged), or all in shared mode.
pub(super) fn function_devices(m: &Model, vf: crate::inventory::PciAddr) -> Vec<String> {
    m.rdma
        .iter()
        .filter(|(_, (i, ns))| (*ns == HOST || m.rdma_shared) && m.rdma_parent.get(i) == Some(&vf))
        .map(|(n, _)| n.clone())
        .collect()
}
