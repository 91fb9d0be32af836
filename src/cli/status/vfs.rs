//! The VFs the hook moved into pods, from their saved state (`<state>/vf/`): where
//! each netdev went and where its RDMA device is. In the kernel's shared RDMA
//! netns mode the RDMA device is not moved (every namespace sees it), and status
//! says so, since the pod then shares it with the host.

use std::fmt::Write as _;

use serde::Serialize;

use crate::inventory::PciAddr;
use crate::netdev::SavedVf;

/// Where a VF's RDMA device is while its netdev is in the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RdmaPlacement {
    /// Moved into the pod's network namespace (exclusive mode).
    Pod,
    /// Left in the host's namespace, visible to every namespace (shared mode).
    HostShared,
    /// The VF has no RDMA device.
    None,
}

/// Where the hook's work on a VF stands, from its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VfProgress {
    /// Moved into the pod and configured as planned.
    Attached,
    /// An attach saved the record and has not finished: at work now, or cut
    /// (the pod's next container has it restored).
    Attaching,
    /// A restore began: at work now, or cut (finished by the pod's next
    /// container or its release).
    Restoring,
}

/// One VF in a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VfView {
    pub vf: PciAddr,
    pub container_id: String,
    pub host_netdev: String,
    pub container_ifname: String,
    pub state: VfProgress,
    pub rdma_device: Option<String>,
    pub rdma: RdmaPlacement,
}

impl VfView {
    pub fn of(saved: &SavedVf) -> VfView {
        let a = &saved.attach;
        let rdma = match (&a.rdma_device, a.move_rdma) {
            (None, _) => RdmaPlacement::None,
            (Some(_), true) => RdmaPlacement::Pod,
            (Some(_), false) => RdmaPlacement::HostShared,
        };
        VfView {
            vf: a.vf_bus_id,
            container_id: saved.container_id.clone(),
            host_netdev: a.host_netdev.clone(),
            container_ifname: a.container_ifname.clone(),
            // A restore may begin on a cut attach: the restore is what runs.
            state: match (saved.restoring, saved.attaching) {
                (true, _) => VfProgress::Restoring,
                (false, true) => VfProgress::Attaching,
                (false, false) => VfProgress::Attached,
            },
            rdma_device: a.rdma_device.clone(),
            rdma,
        }
    }
}

/// One line per VF; empty when no VF is in a pod.
pub fn table(vfs: &[VfView]) -> String {
    if vfs.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:<14} {:<24} {:<10} RDMA",
        "VF", "CONTAINER", "NETDEV", "STATE"
    );
    for v in vfs {
        let container: String = v.container_id.chars().take(12).collect();
        let netdev = format!("{} -> {}", v.host_netdev, v.container_ifname);
        let rdma = match (&v.rdma_device, v.rdma) {
            (Some(dev), RdmaPlacement::Pod) => format!("{dev} in the pod's netns"),
            (Some(dev), RdmaPlacement::HostShared) => {
                format!("{dev} not moved: shared with the host (rdma netns mode shared)")
            }
            _ => "-".to_string(),
        };
        let state = match v.state {
            VfProgress::Attached => "attached",
            VfProgress::Attaching => "attaching",
            VfProgress::Restoring => "restoring",
        };
        let _ = writeln!(
            out,
            "{:<14} {:<14} {:<24} {state:<10} {rdma}",
            v.vf.to_string(),
            container,
            netdev
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netdev::saved::{SavedLink, SavedNetns, SAVED_VERSION};
    use crate::netdev::{NetnsId, VfAttach, VfSettings};

    fn saved(bdf: &str, rdma: Option<&str>, move_rdma: bool) -> SavedVf {
        SavedVf {
            version: SAVED_VERSION,
            container_id: "0123456789abcdef".into(),
            attach: VfAttach {
                pf_netdev: "ens1f0".into(),
                vf_index: 1,
                vf_bus_id: bdf.parse().unwrap(),
                host_netdev: "ens1f0v1".into(),
                rdma_device: rdma.map(str::to_owned),
                container_ifname: "net1".into(),
                settings: VfSettings::default(),
                move_rdma,
                rdma_chars: Vec::new(),
            },
            netns: SavedNetns {
                id: NetnsId { dev: 4, ino: 1 },
                path: None,
            },
            host: SavedLink {
                name: "ens1f0v1".into(),
                index: 9,
                mac: None,
                mtu: 1500,
                up: true,
                parent: None,
                altnames: None,
            },
            pf: None,
            pf_index: None,
            pf_parent: None,
            rdma_index: None,
            saved_unix: 1,
            restoring: false,
            attaching: false,
        }
    }

    #[test]
    fn shared_mode_says_the_rdma_device_stayed_on_the_host() {
        let vfs: Vec<VfView> = [
            saved("0000:19:00.2", Some("mlx5_3"), true),
            saved("0000:1d:00.2", Some("mlx5_9"), false),
            saved("0000:3b:00.2", None, false),
        ]
        .iter()
        .map(VfView::of)
        .collect();
        let placements: Vec<RdmaPlacement> = vfs.iter().map(|v| v.rdma).collect();
        assert_eq!(
            placements,
            [
                RdmaPlacement::Pod,
                RdmaPlacement::HostShared,
                RdmaPlacement::None
            ]
        );
        let text = table(&vfs);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].starts_with("0000:19:00.2   0123456789ab   ens1f0v1 -> net1"),
            "{text}"
        );
        assert!(lines[1].ends_with("mlx5_3 in the pod's netns"), "{text}");
        assert!(
            lines[2].ends_with("mlx5_9 not moved: shared with the host (rdma netns mode shared)"),
            "{text}"
        );
        assert!(lines[3].ends_with(" -"), "{text}");
        let json = serde_json::to_value(&vfs[1]).unwrap();
        assert_eq!(json["rdma"], "host_shared");
        assert_eq!(json["rdma_device"], "mlx5_9");
        assert_eq!(table(&[]), "");
    }

    /// A record left by an attach or a restore that has not finished says
    /// so, in the table and the JSON.
    #[test]
    fn an_unfinished_attach_or_restore_is_shown() {
        let mut rec = saved("0000:19:00.2", None, false);
        let state = |rec: &SavedVf| {
            let v = VfView::of(rec);
            let text = table(std::slice::from_ref(&v));
            let word = text.lines().nth(1).unwrap().split_whitespace().nth(5);
            (
                serde_json::to_value(&v).unwrap()["state"].clone(),
                word.unwrap().to_string(),
            )
        };
        assert_eq!(state(&rec), ("attached".into(), "attached".into()));
        rec.attaching = true;
        assert_eq!(state(&rec), ("attaching".into(), "attaching".into()));
        rec.restoring = true;
        assert_eq!(state(&rec), ("restoring".into(), "restoring".into()));
    }
}
