//! `[sriov]`: VFs the node should have, created by `install/bootstrap.sh` and
//! checked by `devgate doctor`. devgate itself never changes VF counts: the kernel
//! destroys every VF of a PF when its count changes (drivers/pci/iov.c), which
//! would pull netdevs out of running pods.
//!
//! ```toml
//! [sriov.num_vfs]
//! "0000:19:00.0" = 8
//! ```
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::inventory::PciAddr;

/// The most VFs a PF can have: `sriov_totalvfs` is a u16 (PCIe SR-IOV capability).
pub const MAX_VFS_PER_PF: u32 = 65535;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct SriovConfig {
    /// VFs per PF, keyed by the PF's PCI address; a PF not listed is left alone.
    #[serde(deserialize_with = "super::pci_keys::unique")]
    pub num_vfs: BTreeMap<PciAddr, u32>,
}

impl SriovConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (pf, n) in &self.num_vfs {
            if *n > MAX_VFS_PER_PF {
                return Err(ConfigError::Invalid {
                    key: format!("sriov.num_vfs.\"{pf}\""),
                    reason: format!("must be at most {MAX_VFS_PER_PF}"),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    #[test]
    fn num_vfs_parse_and_validate() {
        let c = Config::parse("[sriov.num_vfs]\n\"0000:19:00.0\" = 8\n", "t").unwrap();
        assert_eq!(
            c.sriov.num_vfs.get(&"0000:19:00.0".parse().unwrap()),
            Some(&8)
        );
        for (text, want) in [
            (
                "[sriov.num_vfs]\n\"0000:19:00.0\" = 70000\n",
                "at most 65535",
            ),
            ("[sriov.num_vfs]\n\"../x\" = 1\n", "pci address"),
            ("[sriov.num_vfs]\n\"0000:19:00.0\" = -1\n", "u32"),
            ("[sriov]\nnumvfs = {}\n", "numvfs"),
            (
                "[sriov.num_vfs]\n\"0000:19:00.0\" = 8\n\"19:00.0\" = 4\n",
                "0000:19:00.0 is named twice",
            ),
        ] {
            let e = Config::parse(text, "t").unwrap_err();
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
    }
}
