//! The fixture's VF 1 of NIC 0 with a veth pair standing in for its netdev, and
//! the pod spec that allocates it: the set-up of the VF end-to-end tests.

use devgate::inventory::Vf;

use crate::net::Veth;
use crate::support::node::{allocation, vf_entry, Node, DEVICE_ALLOCATED};
use crate::support::PodSpec;

pub struct StandIn {
    // Each test crate that includes this module reads its own part.
    #[allow(dead_code)]
    pub vf: Vf,
    /// The VF netdev's name on the host.
    pub host_name: String,
    /// The `device-allocated` annotation that allocates the VF.
    pub alloc: String,
    /// Deleted (with its peer) on drop.
    _veth: Veth,
}

impl StandIn {
    /// The veth is named like the VF netdev of `node`'s host root, with `mac`.
    pub fn new(node: &Node, peer: &str, mac: &str) -> StandIn {
        let nic = &node.fixture.expected().rdma[0];
        let vf = nic.vfs[1].clone();
        let host_name = vf.netdev.clone().expect("fixture vf netdev");
        StandIn {
            alloc: allocation(&[], &[vf_entry(0, nic.bus_id, vf.bus_id)]),
            _veth: Veth::new(&host_name, peer, mac),
            host_name,
            vf,
        }
    }

    /// A pod with its own network namespace holding the VF.
    pub fn pod(&self, name: &str) -> PodSpec {
        PodSpec::new(name)
            .own_netns()
            .annotation(DEVICE_ALLOCATED, &self.alloc)
    }
}
