//! A small model of the kernel objects VF work touches (links per namespace,
//! a PF's VF table, RDMA devices), behind the same traits as the real sockets.
//! It follows the kernel rules the logic depends on: a move carries the new
//! name when the old one is taken (`__dev_change_net_namespace`), a rename of
//! an up link is EBUSY (`dev_change_name`), a dying namespace hands physical
//! devices back to the host as `dev<ifindex>` and destroys virtual ones.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use super::netns::Netns;
use super::nl::NlError;
use super::rdma::RdmaNl;
use super::rtnl::{Link, LinkChange, LinkRef, Rtnl};
use super::saved::SavedNetns;
use super::settings::HwAddr;
use super::vfinfo::VfField;
use super::vfinfo::VfState;
use super::{Cause, NetEnv};

mod rdma;

use rdma::FakeRdma;

pub const HOST: u64 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FLink {
    pub ns: u64,
    pub link: Link,
    /// Returned to the host when its namespace dies (a VF), else destroyed (a veth).
    pub physical: bool,
}

/// A mutating call, as the kernel would see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    SetLink {
        ns: u64,
        index: u32,
        to_ns: Option<u64>,
        name: Option<String>,
        mac: Option<HwAddr>,
        mtu: Option<u32>,
        up: Option<bool>,
    },
    DelAltname {
        ns: u64,
        index: u32,
        name: String,
    },
    AddAltname {
        ns: u64,
        index: u32,
        name: String,
    },
    SetVf {
        pf: u32,
        vf: u32,
        field: VfField,
    },
    RdmaSetNs {
        name: String,
        to_ns: u64,
    },
    RdmaRename {
        index: u32,
        name: String,
    },
    ArpNotify {
        ns: u64,
        name: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Model {
    pub links: Vec<FLink>,
    pub vfs: BTreeMap<(u32, u32), VfState>,
    /// name → (index, netns)
    pub rdma: BTreeMap<String, (u32, u64)>,
    pub rdma_shared: bool,
    pub namespaces: BTreeSet<u64>,
    /// Add the old name as an altname on rename (what udev does on many hosts).
    pub altname_on_rename: bool,
    pub calls: Vec<Call>,
    /// Fail the n-th mutating call (0-based) with EIO, or `fail_errno`.
    pub fail_at: Option<usize>,
    pub fail_errno: Option<i32>,
    pub next_index: u32,
    /// Links (by index) with arp_notify set; a move to another netns clears it.
    pub arp_notify: BTreeSet<u32>,
    /// RDMA device name → its char devices now.
    pub rdma_chars: BTreeMap<String, Vec<super::CharNum>>,
    /// Char devices an RDMA device takes when it next moves (the kernel's
    /// lowest free minors).
    pub renumber_on_move: BTreeMap<String, Vec<super::CharNum>>,
    /// The driver fills neither spoof checking nor trust in what it reports
    /// (`ndo_get_vf_config`), though it applies both.
    pub unreported_flags: bool,
    /// The driver has no setter for either (EOPNOTSUPP, as `do_setvfinfo` answers).
    pub unsupported_flags: bool,
    /// VF → its PF's PCI address (sysfs `physfn`).
    pub physfn: BTreeMap<crate::inventory::PciAddr, crate::inventory::PciAddr>,
    /// RDMA device index → the PCI function it belongs to (sysfs
    /// `<function>/infiniband/<name>`).
    pub rdma_parent: BTreeMap<u32, crate::inventory::PciAddr>,
    /// What a pod's container does to a link right after a given call.
    pub meddle: Option<Meddle>,
    /// Namespaces no longer found (unmounted, no handle left) whose cleanup
    /// has not run yet: namespace → the pauses until it runs.
    pub dying: BTreeMap<u64, u32>,
    /// What the environment's pauses waited in all.
    pub paused: std::time::Duration,
}

/// A container with `NET_ADMIN` acting on a link in its netns between two
/// of the hook's calls: it names the link `altname` and brings it up, and
/// moves it into a namespace of its own making where `to_ns` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meddle {
    /// After the n-th mutating call (0-based).
    pub after: usize,
    pub index: u32,
    pub altname: String,
    pub to_ns: Option<u64>,
}

/// What tests compare: the kernel objects, without the call log.
pub type World = (
    Vec<FLink>,
    BTreeMap<(u32, u32), VfState>,
    BTreeMap<String, (u32, u64)>,
);

fn kernel(op: &'static str, errno: i32) -> NlError {
    NlError::Kernel {
        op,
        errno,
        message: None,
    }
}

impl Model {
    pub fn world(&self) -> World {
        let mut links = self.links.clone();
        links.sort_by_key(|l| (l.ns, l.link.index));
        (links, self.vfs.clone(), self.rdma.clone())
    }

    pub fn add_link(&mut self, ns: u64, name: &str, mac: &str, physical: bool) -> u32 {
        self.next_index = self.next_index.max(10) + 1;
        self.namespaces.insert(ns);
        self.links.push(FLink {
            ns,
            physical,
            link: Link {
                index: self.next_index,
                name: name.to_string(),
                mac: mac.parse().ok(),
                mtu: 1500,
                up: false,
                altnames: Vec::new(),
                parent: None,
                raw_name: None,
            },
        });
        self.next_index
    }

    fn name_in_use(&self, ns: u64, name: &str) -> bool {
        self.links.iter().any(|l| {
            l.ns == ns && (l.link.name == name || l.link.altnames.iter().any(|a| a == name))
        })
    }

    fn pos(&self, ns: u64, index: u32) -> Result<usize, NlError> {
        self.links
            .iter()
            .position(|l| l.ns == ns && l.link.index == index)
            .ok_or(kernel("fake", libc::ENODEV))
    }

    fn mutate(&mut self, call: Call) -> Result<(), NlError> {
        let n = self.calls.len();
        self.calls.push(call);
        if self.fail_at == Some(n) {
            return Err(kernel("fake", self.fail_errno.unwrap_or(libc::EIO)));
        }
        if let Some(m) = self.meddle.take_if(|m| m.after + 1 == n) {
            let link = self.links.iter_mut().find(|l| l.link.index == m.index);
            if let Some(l) = link.filter(|l| l.ns != HOST) {
                l.link.altnames.push(m.altname);
                l.link.up = true;
                if let Some(to) = m.to_ns {
                    l.ns = to;
                    self.namespaces.insert(to);
                }
            }
        }
        Ok(())
    }

    /// The namespace is no longer found, and its cleanup (physical links
    /// home) runs after `pauses` of the environment, as the kernel's
    /// `cleanup_net` workqueue does some time after the last reference.
    pub fn start_dying(&mut self, ns: u64, pauses: u32) {
        self.dying.insert(ns, pauses);
        self.run_cleanups();
    }

    fn pause(&mut self, step: std::time::Duration) {
        self.paused += step;
        for left in self.dying.values_mut() {
            *left = left.saturating_sub(1);
        }
        self.run_cleanups();
    }

    fn run_cleanups(&mut self) {
        let due: Vec<u64> = self
            .dying
            .iter()
            .filter(|(_, left)| **left == 0)
            .map(|(ns, _)| *ns)
            .collect();
        for ns in due {
            self.dying.remove(&ns);
            self.destroy_ns(ns);
        }
    }

    /// The namespace dies: physical links go home, virtual ones vanish.
    pub fn destroy_ns(&mut self, ns: u64) {
        self.namespaces.remove(&ns);
        let moving: Vec<usize> = (0..self.links.len())
            .filter(|i| self.links[*i].ns == ns)
            .collect();
        for i in moving {
            if self.links[i].physical {
                let name = self.links[i].link.name.clone();
                if self.name_in_use(HOST, &name) {
                    self.links[i].link.name = format!("dev{}", self.links[i].link.index);
                }
                self.links[i].ns = HOST;
                self.links[i].link.up = false;
            }
        }
        self.links.retain(|l| l.ns != ns);
        for dev in self.rdma.values_mut() {
            if dev.1 == ns {
                dev.1 = HOST;
            }
        }
    }

    fn set_link(&mut self, ns: u64, index: u32, c: &LinkChange<'_>) -> Result<(), NlError> {
        let to_ns = c.netns.map(|n| n.id().ino);
        self.mutate(Call::SetLink {
            ns,
            index,
            to_ns,
            name: c.name.map(str::to_string),
            mac: c.mac.cloned(),
            mtu: c.mtu,
            up: c.up,
        })?;
        let i = self.pos(ns, index)?;
        let mut ns = ns;
        if let Some(to) = to_ns.filter(|t| *t != ns) {
            if !self.namespaces.contains(&to) {
                return Err(kernel("fake", libc::EINVAL));
            }
            // `__dev_change_net_namespace` (net/core/dev.c): a taken name
            // takes the one given with the move; a taken altname fails it.
            let l = &self.links[i].link;
            let clash = self.name_in_use(to, &l.name);
            let alt_clash = l.altnames.iter().any(|a| self.name_in_use(to, a));
            let given_taken = c.name.is_none_or(|n| self.name_in_use(to, n));
            if alt_clash || (clash && given_taken) {
                return Err(kernel("fake", libc::EEXIST));
            }
            if clash {
                self.links[i].link.name = c.name.unwrap_or_default().to_string();
            }
            self.links[i].ns = to;
            self.links[i].link.up = false;
            self.arp_notify.remove(&index);
            ns = to;
        }
        if let Some(mac) = c.mac {
            self.links[i].link.mac = Some(mac.clone());
        }
        if let Some(mtu) = c.mtu {
            self.links[i].link.mtu = mtu;
        }
        if let Some(name) = c.name.filter(|n| *n != self.links[i].link.name) {
            if self.name_in_use(ns, name) {
                return Err(kernel("fake", libc::EEXIST));
            }
            if self.links[i].link.up {
                return Err(kernel("fake", libc::EBUSY));
            }
            let old = std::mem::replace(&mut self.links[i].link.name, name.to_string());
            if self.altname_on_rename {
                self.links[i].link.altnames.push(old);
            }
        }
        if let Some(up) = c.up {
            self.links[i].link.up = up;
        }
        Ok(())
    }
}

/// The fake environment: one shared model, sockets bound to a namespace id.
pub struct FakeNet {
    pub model: Rc<RefCell<Model>>,
    host: Netns,
}

impl FakeNet {
    pub fn new(model: Model) -> FakeNet {
        let model = Rc::new(RefCell::new(model));
        model.borrow_mut().namespaces.insert(HOST);
        FakeNet {
            model,
            host: Netns::fake(HOST),
        }
    }
}

struct FakeRtnl {
    model: Rc<RefCell<Model>>,
    ns: u64,
}

impl NetEnv for FakeNet {
    fn host_netns(&self) -> &Netns {
        &self.host
    }

    fn rtnl(&mut self, ns: Option<&Netns>) -> Result<Box<dyn Rtnl>, Cause> {
        Ok(Box::new(FakeRtnl {
            model: self.model.clone(),
            ns: ns.map_or(HOST, |n| n.id().ino),
        }))
    }

    fn rdma(&mut self, ns: Option<&Netns>) -> Result<Box<dyn RdmaNl>, Cause> {
        Ok(Box::new(FakeRdma {
            model: self.model.clone(),
            ns: ns.map_or(HOST, |n| n.id().ino),
        }))
    }

    fn find_netns(&self, saved: &SavedNetns) -> Option<Netns> {
        let m = self.model.borrow();
        let ino = saved.id.ino;
        let alive = m.namespaces.contains(&ino) && !m.dying.contains_key(&ino);
        alive.then(|| Netns::fake(ino))
    }

    fn set_arp_notify(&mut self, ns: &Netns, ifname: &str) -> Result<(), Cause> {
        let mut m = self.model.borrow_mut();
        let ns = ns.id().ino;
        m.mutate(Call::ArpNotify {
            ns,
            name: ifname.to_string(),
        })?;
        let index = m
            .links
            .iter()
            .find(|l| l.ns == ns && l.link.name == ifname)
            .map(|l| l.link.index)
            .ok_or(kernel("fake", libc::ENOENT))?;
        m.arp_notify.insert(index);
        Ok(())
    }

    fn vf_physfn(
        &mut self,
        vf: crate::inventory::PciAddr,
    ) -> Result<Option<crate::inventory::PciAddr>, Cause> {
        Ok(self.model.borrow().physfn.get(&vf).copied())
    }

    fn vf_rdma(&mut self, vf: crate::inventory::PciAddr) -> Result<Vec<String>, Cause> {
        Ok(rdma::function_devices(&self.model.borrow(), vf))
    }

    fn pause(&mut self, step: std::time::Duration) {
        self.model.borrow_mut().pause(step);
    }

    fn paused(&self) -> std::time::Duration {
        self.model.borrow().paused
    }

    fn rdma_chars(&mut self, ibdev: &str) -> Result<Vec<super::CharNum>, Cause> {
        let mut chars = self
            .model
            .borrow()
            .rdma_chars
            .get(ibdev)
            .cloned()
            .unwrap_or_default();
        chars.sort();
        Ok(chars)
    }
}

impl Rtnl for FakeRtnl {
    fn link(&mut self, by: LinkRef<'_>) -> Result<Option<Link>, NlError> {
        let m = self.model.borrow();
        Ok(m.links
            .iter()
            .filter(|l| l.ns == self.ns)
            .find(|l| match by {
                LinkRef::Index(i) => l.link.index == i,
                LinkRef::Name(n) => l.link.name == n || l.link.altnames.iter().any(|a| a == n),
            })
            .map(|l| l.link.clone()))
    }

    fn links(&mut self) -> Result<Vec<Link>, NlError> {
        let m = self.model.borrow();
        Ok(m.links
            .iter()
            .filter(|l| l.ns == self.ns)
            .map(|l| l.link.clone())
            .collect())
    }

    fn set_link(&mut self, index: u32, change: &LinkChange<'_>) -> Result<(), NlError> {
        self.model.borrow_mut().set_link(self.ns, index, change)
    }

    fn del_altname(&mut self, index: u32, name: &str) -> Result<bool, NlError> {
        let mut m = self.model.borrow_mut();
        m.mutate(Call::DelAltname {
            ns: self.ns,
            index,
            name: name.to_string(),
        })?;
        let i = m.pos(self.ns, index)?;
        let before = m.links[i].link.altnames.len();
        m.links[i].link.altnames.retain(|a| a != name);
        Ok(m.links[i].link.altnames.len() != before)
    }

    fn add_altname(&mut self, index: u32, name: &str) -> Result<bool, NlError> {
        let mut m = self.model.borrow_mut();
        m.mutate(Call::AddAltname {
            ns: self.ns,
            index,
            name: name.to_string(),
        })?;
        let i = m.pos(self.ns, index)?;
        if m.name_in_use(self.ns, name) {
            return Ok(false);
        }
        m.links[i].link.altnames.push(name.to_string());
        Ok(true)
    }

    fn vf_state(&mut self, pf_index: u32, vf: u32) -> Result<Option<VfState>, NlError> {
        let m = self.model.borrow();
        m.pos(self.ns, pf_index)?;
        let mut state = m.vfs.get(&(pf_index, vf)).cloned();
        if let Some(s) = state.as_mut().filter(|_| m.unreported_flags) {
            (s.spoofchk, s.trust) = (None, None);
        }
        Ok(state)
    }

    fn set_vf(&mut self, pf_index: u32, vf: u32, field: &VfField) -> Result<(), NlError> {
        let mut m = self.model.borrow_mut();
        m.mutate(Call::SetVf {
            pf: pf_index,
            vf,
            field: field.clone(),
        })?;
        m.pos(self.ns, pf_index)?;
        if m.unsupported_flags && matches!(field, VfField::SpoofChk(_) | VfField::Trust(_)) {
            return Err(kernel("fake", libc::EOPNOTSUPP));
        }
        let s = m
            .vfs
            .get_mut(&(pf_index, vf))
            .ok_or(kernel("fake", libc::EINVAL))?;
        match field {
            VfField::Mac(x) => s.mac = x.clone(),
            VfField::Vlan(x) => s.vlan = *x,
            VfField::Rate(x) => s.rate = *x,
            VfField::SpoofChk(x) => s.spoofchk = Some(*x),
            VfField::Trust(x) => s.trust = Some(*x),
            VfField::LinkState(x) => s.link_state = *x,
        }
        Ok(())
    }
}
