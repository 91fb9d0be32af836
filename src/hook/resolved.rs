//! The container annotation the NRI plugin adds for the hook: what devgate
//! resolved for this container, so the hook does no discovery of its own.
//!
//! Key [`RESOLVED_ANNOTATION`], value JSON:
//! ```json
//! {"version": 1,
//!  "networks": [{"pf_netdev": "ens1f0", "vf_index": 3, "vf_bus_id": "0000:3b:02.3",
//!                "host_netdev": "ens1f0v3", "rdma_device": "mlx5_5",
//!                "container_ifname": "net1", "move_rdma": true,
//!                "settings": {"mac": "02:00:00:00:00:11", "vlan": 100, "mtu": 9000},
//!                "rdma_chars": [{"name": "umad5", "major": 231, "minor": 5},
//!                               {"name": "uverbs5", "major": 231, "minor": 197}]}]}
//! ```
//! Unknown fields are refused so that a newer plugin cannot be half-understood.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::netdev::VfAttach;

pub const RESOLVED_ANNOTATION: &str = "devgate.io/resolved";
pub const RESOLVED_VERSION: u32 = 1;
/// Four VFs take about 1.5 KiB.
pub const MAX_RESOLVED_BYTES: usize = 64 * 1024;
/// More VFs than any NIC gives one container.
pub const MAX_NETWORKS: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {RESOLVED_ANNOTATION}: {reason}")]
pub struct ResolvedError {
    pub reason: String,
}

/// What the hook applies to one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resolved {
    pub version: u32,
    #[serde(default)]
    pub networks: Vec<VfAttach>,
}

impl Resolved {
    pub fn new(networks: Vec<VfAttach>) -> Resolved {
        Resolved {
            version: RESOLVED_VERSION,
            networks,
        }
    }

    /// The annotation value the plugin puts on the container.
    pub fn to_annotation(&self) -> Result<String, ResolvedError> {
        self.check()?;
        serde_json::to_string(self).map_err(|e| ResolvedError {
            reason: e.to_string(),
        })
    }

    /// Reads the annotation, if present, and checks it.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<Resolved>, ResolvedError> {
        annotations
            .get(RESOLVED_ANNOTATION)
            .map(|v| Resolved::parse(v))
            .transpose()
    }

    pub fn parse(value: &str) -> Result<Resolved, ResolvedError> {
        let err = |reason: String| ResolvedError { reason };
        if value.len() > MAX_RESOLVED_BYTES {
            return Err(err(format!(
                "{} bytes, over the limit of {MAX_RESOLVED_BYTES}",
                value.len()
            )));
        }
        // A pod can write this annotation, and serde_json decodes the escapes in
        // what it quotes (an unknown field's name): one line, bounded.
        let resolved: Resolved = serde_json::from_str(value)
            .map_err(|e| err(crate::untrusted::one_line(&e.to_string(), 300)))?;
        resolved.check()?;
        Ok(resolved)
    }

    fn check(&self) -> Result<(), ResolvedError> {
        let err = |reason: String| ResolvedError { reason };
        if self.version != RESOLVED_VERSION {
            return Err(err(format!(
                "version {} (this hook reads {RESOLVED_VERSION})",
                self.version
            )));
        }
        if self.networks.len() > MAX_NETWORKS {
            return Err(err(format!(
                "{} networks, over the limit of {MAX_NETWORKS}",
                self.networks.len()
            )));
        }
        for n in &self.networks {
            n.validate()
                .map_err(|e| err(format!("vf {}: {e}", n.vf_bus_id)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod can write the annotation: a field name with escaped line breaks must
    /// not break the one-line error the runtime shows (found by fuzzing).
    #[test]
    fn errors_quoting_the_pod_stay_one_line() {
        let value = r#"{"version":1,"networks":[{"x\r\ndevgate-hook: forged":1}]}"#;
        let e = Resolved::parse(value).unwrap_err().to_string();
        assert!(!e.contains(['\r', '\n']), "{e:?}");
        assert!(
            e.starts_with("annotation devgate.io/resolved: unknown field"),
            "{e}"
        );
        // A name refused is quoted cut, however long the pod made it.
        let long = FULL.replace("\"net1\"", &format!("\"{}\"", "n".repeat(60_000)));
        let e = Resolved::parse(&long).unwrap_err().to_string();
        assert!(
            e.contains("is not a valid interface name") && e.len() < 200,
            "{e}"
        );
        let long = FULL.replace("\"mlx5_5\"", &format!("\"{}\"", "m".repeat(60_000)));
        let e = Resolved::parse(&long).unwrap_err().to_string();
        assert!(
            e.contains("is not an rdma device name") && e.len() < 200,
            "{e}"
        );
    }

    const FULL: &str = r#"{"version":1,"networks":[{"pf_netdev":"ens1f0","vf_index":3,
        "vf_bus_id":"0000:3b:02.3","host_netdev":"ens1f0v3","rdma_device":"mlx5_5",
        "container_ifname":"net1","move_rdma":true,
        "settings":{"mac":"02:00:00:00:00:11","vlan":100,"qos":1,"vlan_proto":"802.1q",
                    "spoofchk":false,"trust":true,"link_state":"enable",
                    "min_tx_rate":0,"max_tx_rate":1000,"mtu":9000}}]}"#;

    #[test]
    fn the_documented_shape_parses_and_round_trips() {
        let r = Resolved::parse(FULL).unwrap();
        assert_eq!(r.networks.len(), 1);
        let n = &r.networks[0];
        assert_eq!(
            (n.vf_index, n.container_ifname.as_str(), n.move_rdma),
            (3, "net1", true)
        );
        assert_eq!(n.settings.mtu, Some(9000));
        let again = Resolved::parse(&r.to_annotation().unwrap()).unwrap();
        assert_eq!(again, r);
        let minimal = r#"{"version":1,"networks":[{"vf_index":0,"vf_bus_id":"0000:00:10.1",
            "host_netdev":"veth0","container_ifname":"net1"}]}"#;
        assert!(Resolved::parse(minimal).is_ok());
        let mut map = BTreeMap::new();
        assert_eq!(Resolved::from_annotations(&map).unwrap(), None);
        map.insert(RESOLVED_ANNOTATION.to_string(), FULL.to_string());
        assert!(Resolved::from_annotations(&map).unwrap().is_some());
    }

    #[test]
    fn bad_values_are_refused() {
        let bad = [
            FULL.replace(r#""version":1"#, r#""version":2"#),
            FULL.replace(r#""vf_index":3"#, r#""vf_index":3,"extra":1"#),
            FULL.replace("net1", "../x"),
            FULL.replace("0000:3b:02.3", "0000:3b:02"),
            FULL.replace(r#""vlan":100"#, r#""vlan":5000"#),
            FULL.replace(r#""rdma_device":"mlx5_5","#, ""),
            "{".to_string(),
            format!(
                "{{\"version\":1,\"pad\":\"{}\"}}",
                "x".repeat(MAX_RESOLVED_BYTES)
            ),
        ];
        for value in bad {
            let e = Resolved::parse(&value).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("annotation devgate.io/resolved: "),
                "{e}"
            );
        }
        let many = Resolved::new(vec![
            Resolved::parse(FULL).unwrap().networks[0].clone();
            MAX_NETWORKS + 1
        ]);
        assert!(many.to_annotation().is_err());
    }
}
