//! The plan's VFs as the hook moves them (`devgate.io/resolved`), with the
//! node's VF settings in the hook's terms.

use super::DeviceError;
use crate::config::{self, MacPolicy, VfLinkState};
use crate::inventory::PciAddr;
use crate::netdev::{self, VfAttach};
use crate::plan::NetworkAction;

/// The hook's view of the plan's network actions, for a pod whose network
/// `owned` (a container of it holds its VFs: moved into the pod, or about to
/// be) or not. A VF with no host netdev is one already moved into the pod when
/// the pod's network is owned: this container moves nothing, and needs nothing.
/// Otherwise its netdev is not where this container could move it from (in
/// another netns, or none at all, as for InfiniBand without IPoIB): refusing
/// keeps the promise that the container gets exactly its allocation.
pub(crate) fn vf_attachments(
    actions: &[NetworkAction],
    pod_uid: &str,
    owned: bool,
) -> Result<Vec<VfAttach>, DeviceError> {
    if owned && actions.iter().any(|a| a.netdev.is_none()) {
        return Ok(Vec::new());
    }
    actions
        .iter()
        .map(|a| {
            let host_netdev = a.netdev.clone().ok_or_else(|| DeviceError::NoNetdev {
                entry: String::new(),
                vf: a.vf_bus_id,
            })?;
            Ok(VfAttach {
                pf_netdev: a.pf_netdev.clone().unwrap_or_default(),
                vf_index: a.vf_index,
                vf_bus_id: a.vf_bus_id,
                host_netdev,
                rdma_device: a.rdma_device.clone(),
                container_ifname: a.container_ifname.clone(),
                settings: netdev_settings(&a.settings, pod_uid, &a.vf_bus_id),
                move_rdma: a.move_rdma,
                rdma_chars: a.rdma_chars.clone(),
            })
        })
        .collect()
}

/// Node config settings as the hook applies them. `mac = "random"` becomes a
/// locally administered unicast MAC derived from the pod and the VF, so a
/// re-run hook or a second container of the pod computes the same address.
fn netdev_settings(cfg: &config::VfSettings, pod_uid: &str, vf: &PciAddr) -> netdev::VfSettings {
    let mac = match cfg.mac {
        Some(MacPolicy::Random) => netdev::HwAddr::new(&pod_mac(pod_uid, vf)),
        Some(MacPolicy::Keep) | None => None,
    };
    netdev::VfSettings {
        mac,
        vlan: cfg.vlan,
        qos: cfg.qos,
        vlan_proto: cfg.vlan_proto,
        spoofchk: cfg.spoofchk,
        trust: cfg.trust,
        link_state: cfg.link_state.map(|s| match s {
            VfLinkState::Auto => netdev::LinkState::Auto,
            VfLinkState::Enable => netdev::LinkState::Enable,
            VfLinkState::Disable => netdev::LinkState::Disable,
        }),
        min_tx_rate: cfg.min_tx_rate,
        max_tx_rate: cfg.max_tx_rate,
        mtu: cfg.mtu,
    }
}

pub(super) fn pod_mac(pod_uid: &str, vf: &PciAddr) -> [u8; 6] {
    // SHA-256 of the pod's UID and the VF's address: the same pod and VF give
    // the same MAC in every process and every release (std's hasher is not
    // specified to stay the same from one Rust release to the next, and a
    // VF moved in again after its owner stopped must keep the pod's MAC).
    let mut input = Vec::with_capacity(pod_uid.len() + 16);
    input.extend_from_slice(pod_uid.as_bytes());
    input.push(0);
    input.extend_from_slice(vf.to_string().as_bytes());
    let digest = ring::digest::digest(&ring::digest::SHA256, &input);
    let b = digest.as_ref();
    // Locally administered (bit 1), unicast (bit 0 clear): IEEE 802 section 8.2.
    [(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}
