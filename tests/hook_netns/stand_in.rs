//! The fixture's VF 1 of NIC 0 with a veth pair standing in for its netdev, and
//! the pod spec that allocates it: the set-up of the VF end-to-end tests.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use devgate::inventory::Vf;

use crate::net::Veth;
use crate::support::node::{allocation, vf_entry, Node, DEVICE_ALLOCATED};
use crate::support::{PodSpec, DEVGATE};

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

/// A `devgate-hook` in `dir` that runs `body`, a shell script given the real
/// hook's path: for hooks that skip or break a stage. Its path, for the
/// config's `hook_path`.
// Each test crate that includes this module reads its own part.
#[allow(dead_code)]
pub fn wrapped_hook(dir: &Path, body: impl Fn(&Path) -> String) -> String {
    let real = Path::new(DEVGATE).with_file_name("devgate-hook");
    let path = dir.join("devgate-hook");
    std::fs::write(&path, format!("#!/bin/sh\n{}", body(&real))).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}
