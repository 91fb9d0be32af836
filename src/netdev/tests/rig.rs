//! The world the logic tests run in: a host with one PF and one VF (with its
//! RDMA device), a pod netns, and a rig that runs attach and detach on it.

use crate::netdev::fake::{FakeNet, Model, HOST};
use crate::netdev::saved::SavedStore;
use crate::netdev::settings::{LinkState, RateConfig, VlanConfig, VlanProto};
use crate::netdev::vfinfo::VfState;
use crate::netdev::{attach_all, Netns, VfAttach, VfError, VfOps, VfSettings};

pub const POD: u64 = 2;
pub const PF: u32 = 11;
pub const VF_NETDEV: u32 = 12;

pub fn nop(_: &'static str) {}

/// Asserts that `err`, with its causes, says `text`.
pub fn says(err: &VfError, text: &str) {
    let chain = nri::ErrorChain(err).to_string();
    assert!(chain.contains(text), "{chain}");
}

pub fn vf_state() -> VfState {
    VfState {
        vf: 3,
        mac: "00:00:00:00:00:00".parse().unwrap(),
        vlan: VlanConfig {
            vlan: 0,
            qos: 0,
            proto: VlanProto::Dot1Q,
        },
        rate: RateConfig { min: 0, max: 0 },
        spoofchk: Some(true),
        trust: Some(false),
        link_state: LinkState::Auto,
    }
}

/// A host with PF ens1f0 (VF 3 = ens1f0v3, RDMA mlx5_3) and a pod with lo and eth0.
pub fn model() -> Model {
    let mut m = Model::default();
    let pf = m.add_link(HOST, "ens1f0", "0c:42:a1:00:00:01", true);
    let vf = m.add_link(HOST, "ens1f0v3", "0e:00:00:00:00:03", true);
    assert_eq!((pf, vf), (PF, VF_NETDEV));
    m.links[1].link.parent = Some("0000:3b:02.3".to_string());
    m.vfs.insert((PF, 3), vf_state());
    m.rdma.insert("mlx5_3".to_string(), (5, HOST));
    m.add_link(POD, "lo", "00:00:00:00:00:00", false);
    m.add_link(POD, "eth0", "0a:58:0a:00:00:05", false);
    m
}

pub fn action() -> VfAttach {
    VfAttach {
        pf_netdev: "ens1f0".to_string(),
        vf_index: 3,
        vf_bus_id: "0000:3b:02.3".parse().unwrap(),
        host_netdev: "ens1f0v3".to_string(),
        rdma_device: Some("mlx5_3".to_string()),
        container_ifname: "net1".to_string(),
        settings: VfSettings {
            mac: Some("02:00:00:00:00:11".parse().unwrap()),
            vlan: Some(100),
            qos: Some(2),
            spoofchk: Some(false),
            trust: Some(true),
            link_state: Some(LinkState::Enable),
            max_tx_rate: Some(1000),
            mtu: Some(9000),
            ..VfSettings::default()
        },
        move_rdma: true,
        rdma_chars: Vec::new(),
    }
}

pub struct Rig {
    pub net: FakeNet,
    dir: tempfile::TempDir,
    pub store: SavedStore,
    pub pod: Netns,
}

impl Rig {
    pub fn new(m: Model) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let store = SavedStore::new(dir.path());
        Rig {
            net: FakeNet::new(m),
            dir,
            store,
            pod: Netns::fake(POD),
        }
    }

    pub fn attach(&mut self, actions: &[VfAttach]) -> Result<(), VfError> {
        let mut ops = VfOps {
            env: &mut self.net,
            store: &self.store,
            checkpoint: &nop,
        };
        attach_all(&mut ops, "ctr1", &self.pod, None, actions)
    }

    pub fn detach(&mut self, container: &str) -> Result<usize, VfError> {
        let mut ops = VfOps {
            env: &mut self.net,
            store: &self.store,
            checkpoint: &nop,
        };
        let vfs = self.store.vfs_of(container).map_err(VfError::Records)?;
        crate::netdev::detach_listed(&mut ops, container, &vfs)
    }

    /// [`crate::netdev::detach_listed`] of `vfs` for `container`.
    pub fn detach_listed(
        &mut self,
        container: &str,
        vfs: &[crate::inventory::PciAddr],
    ) -> Result<usize, VfError> {
        let mut ops = VfOps {
            env: &mut self.net,
            store: &self.store,
            checkpoint: &nop,
        };
        crate::netdev::detach_listed(&mut ops, container, vfs)
    }

    /// Attaches `action()` for `container` into the namespace `ns`.
    pub fn attach_as(&mut self, container: &str, ns: u64) -> Result<(), VfError> {
        let mut ops = VfOps {
            env: &mut self.net,
            store: &self.store,
            checkpoint: &nop,
        };
        let pod = crate::netdev::Netns::fake(ns);
        attach_all(&mut ops, container, &pod, None, &[action()])
    }

    pub fn m(&self) -> std::cell::RefMut<'_, Model> {
        self.net.model.borrow_mut()
    }

    pub fn records(&self) -> usize {
        let _ = &self.dir;
        self.store.all().unwrap().len()
    }
}

pub fn host_world(m: &Model) -> crate::netdev::fake::World {
    let (links, vfs, rdma) = m.world();
    (
        links.into_iter().filter(|l| l.ns == HOST).collect(),
        vfs,
        rdma,
    )
}
