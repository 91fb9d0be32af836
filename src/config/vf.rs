//! `[vf]`: settings the hook applies to VF netdevs handed to pods.
//!
//! ```toml
//! [vf.defaults]
//! spoofchk = true
//! trust = false
//! [vf.pf."0000:19:00.0"]   # overrides for the VFs of one PF
//! vlan = 100
//! [vf]
//! pod_settings = ["vlan", "mtu"]   # what a pod's devgate.io/vf-settings may set
//! ```
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::inventory::PciAddr;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct VfConfig {
    pub defaults: VfSettings,
    /// Per-PF overrides, keyed by PCI address; set fields replace the defaults.
    #[serde(deserialize_with = "super::pci_keys::unique")]
    pub pf: BTreeMap<PciAddr, VfSettings>,
    /// The settings a pod may set for its own VFs (annotation
    /// `devgate.io/vf-settings`), over the node's; none by default, since a
    /// pod is not trusted with its VLAN, MAC policy, trust or rates.
    pub pod_settings: Vec<VfSettingName>,
}

impl VfConfig {
    /// The settings for the VFs of `pf`: its overrides over the defaults.
    pub fn for_pf(&self, pf: &PciAddr) -> VfSettings {
        match self.pf.get(pf) {
            Some(o) => o.over(&self.defaults),
            None => self.defaults.clone(),
        }
    }

    /// `pod`'s settings over the node's for the VFs of `pf`.
    pub fn for_pod(&self, pf: &PciAddr, pod: Option<&VfSettings>) -> VfSettings {
        let node = self.for_pf(pf);
        match pod {
            Some(p) => p.over(&node),
            None => node,
        }
    }

    /// The first setting of `pod` that the node does not let pods set.
    pub fn not_allowed(&self, pod: &VfSettings) -> Option<VfSettingName> {
        pod.set_names()
            .into_iter()
            .find(|n| !self.pod_settings.contains(n))
    }

    /// Checks the ranges serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.defaults.validate("vf.defaults")?;
        for (pf, settings) in &self.pf {
            let at = format!("vf.pf.\"{pf}\"");
            settings.validate(&at)?;
            // Over the defaults: a min_tx_rate from one and a max_tx_rate
            // from the other must still agree, or every VF of the PF fails.
            self.for_pf(pf).validate(&at)?;
            // What a listed PF's VFs get: its overrides over the defaults,
            // unless a pod may bring the VLAN. The defaults alone are not
            // checked: a PF section may supply the VLAN they lack (and the
            // hook refuses a VF whose settings still lack one).
            if !self.pod_settings.contains(&VfSettingName::Vlan) {
                self.for_pf(pf).validate_vlan(&at)?;
            }
        }
        Ok(())
    }
}

/// VF settings; every one is optional, and unset means "leave as it is".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct VfSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacPolicy>,
    /// 802.1Q VLAN id, 0 (none) to 4094.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// 802.1p priority, 0 to 7; applies with `vlan`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<u8>,
    /// `802.1q` (the default) or `802.1ad` (QinQ, needs a non-zero `vlan`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan_proto: Option<crate::netdev::VlanProto>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spoofchk: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_state: Option<VfLinkState>,
    /// Mbps; 0 = no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_tx_rate: Option<u32>,
    /// Mbps; 0 = no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tx_rate: Option<u32>,
    /// MTU of the VF netdev, 68 to 65535.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

impl VfSettings {
    /// `self` where set, else `base`.
    pub fn over(&self, base: &VfSettings) -> VfSettings {
        VfSettings {
            mac: self.mac.or(base.mac),
            vlan: self.vlan.or(base.vlan),
            qos: self.qos.or(base.qos),
            vlan_proto: self.vlan_proto.or(base.vlan_proto),
            spoofchk: self.spoofchk.or(base.spoofchk),
            trust: self.trust.or(base.trust),
            link_state: self.link_state.or(base.link_state),
            min_tx_rate: self.min_tx_rate.or(base.min_tx_rate),
            max_tx_rate: self.max_tx_rate.or(base.max_tx_rate),
            mtu: self.mtu.or(base.mtu),
        }
    }

    /// The names of the settings that are set, in declaration order.
    pub fn set_names(&self) -> Vec<VfSettingName> {
        use VfSettingName as N;
        [
            (N::Mac, self.mac.is_some()),
            (N::Vlan, self.vlan.is_some()),
            (N::Qos, self.qos.is_some()),
            (N::VlanProto, self.vlan_proto.is_some()),
            (N::Spoofchk, self.spoofchk.is_some()),
            (N::Trust, self.trust.is_some()),
            (N::LinkState, self.link_state.is_some()),
            (N::MinTxRate, self.min_tx_rate.is_some()),
            (N::MaxTxRate, self.max_tx_rate.is_some()),
            (N::Mtu, self.mtu.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, set)| set.then_some(n))
        .collect()
    }

    /// The first setting out of its range, with the range: the ranges serde
    /// cannot express.
    pub fn out_of_range(&self) -> Option<(VfSettingName, &'static str)> {
        if self.vlan.is_some_and(|v| v > 4094) {
            return Some((VfSettingName::Vlan, "must be 0 to 4094"));
        }
        if self.qos.is_some_and(|q| q > 7) {
            return Some((VfSettingName::Qos, "must be 0 to 7"));
        }
        if self.mtu.is_some_and(|m| !(68..=65535).contains(&m)) {
            return Some((VfSettingName::Mtu, "must be 68 to 65535"));
        }
        if let (Some(min), Some(max)) = (self.min_tx_rate, self.max_tx_rate) {
            if max != 0 && min > max {
                return Some((VfSettingName::MinTxRate, "must not exceed max_tx_rate"));
            }
        }
        None
    }

    /// A priority or 802.1ad needs a VLAN to apply to (the PF refuses them
    /// without one, `netdev::VfSettings::validate`): checked on what the node
    /// applies, not on a pod's overrides alone, which merge over it.
    fn validate_vlan(&self, at: &str) -> Result<(), ConfigError> {
        match self.vlan_missing() {
            Some((name, reason)) => Err(ConfigError::Invalid {
                key: format!("{at}.{}", name.as_str()),
                reason: reason.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// A setting that needs a non-zero VLAN where there is none.
    pub fn vlan_missing(&self) -> Option<(VfSettingName, &'static str)> {
        if self.vlan.unwrap_or(0) != 0 {
            None
        } else if self.qos.unwrap_or(0) != 0 {
            Some((VfSettingName::Qos, "needs a non-zero vlan"))
        } else if self.vlan_proto == Some(crate::netdev::VlanProto::Dot1Ad) {
            Some((VfSettingName::VlanProto, "802.1ad needs a non-zero vlan"))
        } else {
            None
        }
    }

    fn validate(&self, at: &str) -> Result<(), ConfigError> {
        match self.out_of_range() {
            Some((name, reason)) => Err(ConfigError::Invalid {
                key: format!("{at}.{}", name.as_str()),
                reason: reason.to_string(),
            }),
            None => Ok(()),
        }
    }
}

/// The name of one VF setting, as config and annotation spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VfSettingName {
    Mac,
    Vlan,
    Qos,
    VlanProto,
    Spoofchk,
    Trust,
    LinkState,
    MinTxRate,
    MaxTxRate,
    Mtu,
}

impl VfSettingName {
    /// Set through the PF's netdev (`IFLA_VF_INFO`, as sriov-cni does): all
    /// but the MAC, which the VF's own netdev also takes, the MTU, which only
    /// it takes, and a priority or protocol, which go only with a VLAN
    /// (`netdev::VfSettings::pf_config`).
    pub fn through_pf(self) -> bool {
        !matches!(
            self,
            VfSettingName::Mac | VfSettingName::Mtu | VfSettingName::Qos | VfSettingName::VlanProto
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            VfSettingName::Mac => "mac",
            VfSettingName::Vlan => "vlan",
            VfSettingName::Qos => "qos",
            VfSettingName::VlanProto => "vlan_proto",
            VfSettingName::Spoofchk => "spoofchk",
            VfSettingName::Trust => "trust",
            VfSettingName::LinkState => "link_state",
            VfSettingName::MinTxRate => "min_tx_rate",
            VfSettingName::MaxTxRate => "max_tx_rate",
            VfSettingName::Mtu => "mtu",
        }
    }
}

/// What the hook does with a VF's MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MacPolicy {
    /// Leave the MAC the VF has.
    Keep,
    /// A random locally administered unicast MAC per pod, restored at teardown.
    Random,
}

/// `ip link set <pf> vf N state ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VfLinkState {
    Auto,
    Enable,
    Disable,
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    #[test]
    fn a_pods_settings_go_over_the_nodes_where_allowed() {
        let c = Config::parse(
            "[vf]\npod_settings = [\"mtu\", \"vlan\"]\n[vf.defaults]\nvlan = 10\nspoofchk = true\n",
            "t",
        )
        .unwrap();
        let pf: PciAddr = "0000:19:00.0".parse().unwrap();
        let pod = VfSettings {
            vlan: Some(30),
            mtu: Some(9000),
            ..VfSettings::default()
        };
        assert_eq!(c.vf.not_allowed(&pod), None);
        let s = c.vf.for_pod(&pf, Some(&pod));
        assert_eq!(
            (s.vlan, s.mtu, s.spoofchk),
            (Some(30), Some(9000), Some(true))
        );
        assert_eq!(c.vf.for_pod(&pf, None), c.vf.for_pf(&pf));
        let trusting = VfSettings {
            mtu: Some(1500),
            trust: Some(true),
            ..VfSettings::default()
        };
        assert_eq!(c.vf.not_allowed(&trusting), Some(VfSettingName::Trust));
        // Nothing is allowed unless the node says so.
        assert_eq!(
            VfConfig::default().not_allowed(&pod),
            Some(VfSettingName::Vlan)
        );
        assert_eq!(
            VfConfig::default().not_allowed(&VfSettings::default()),
            None
        );
    }

    #[test]
    fn merge_and_validate() {
        let c = Config::parse(
            "[vf.defaults]\nspoofchk = true\nvlan = 10\nmac = \"random\"\nvlan_proto = \"802.1ad\"\n\
             [vf.pf.\"0000:19:00.0\"]\nvlan = 20\nlink_state = \"enable\"\n",
            "t",
        )
        .unwrap();
        let s = c.vf.for_pf(&"0000:19:00.0".parse().unwrap());
        assert_eq!(s.vlan, Some(20));
        assert_eq!(s.spoofchk, Some(true));
        assert_eq!(s.mac, Some(MacPolicy::Random));
        assert_eq!(s.link_state, Some(VfLinkState::Enable));
        assert_eq!(s.vlan_proto, Some(crate::netdev::VlanProto::Dot1Ad));
        assert_eq!(c.vf.for_pf(&"0000:3b:00.0".parse().unwrap()).vlan, Some(10));

        let bad = [
            ("[vf.defaults]\nvlan = 4095\n", "vf.defaults.vlan"),
            ("[vf.defaults]\nqos = 8\n", "vf.defaults.qos"),
            ("[vf.pf.\"0000:19:00.0\"]\nmtu = 10\n", "mtu"),
            (
                "[vf.defaults]\nmin_tx_rate = 10\nmax_tx_rate = 5\n",
                "min_tx_rate",
            ),
            ("[vf.pf.\"../x\"]\nvlan = 1\n", "pci address"),
            ("[vf.defaults]\nbogus = 1\n", "bogus"),
            ("[vf]\npod_settings = [\"vlan\", \"vendor\"]\n", "vendor"),
            // One PF written two ways: neither's settings may be dropped.
            (
                "[vf.pf.\"0000:3b:00.0\"]\nvlan = 100\n[vf.pf.\"3b:00.0\"]\nmtu = 9000\n",
                "0000:3b:00.0 is named twice, as \"0000:3b:00.0\" and \"3b:00.0\"",
            ),
            (
                "[vf.pf.\"0000:3b:00.0\"]\nvlan = 100\n[vf.pf.\"0000:3B:00.0\"]\nmtu = 9000\n",
                "named twice",
            ),
        ];
        for (text, want) in bad {
            let e = Config::parse(text, "t").unwrap_err();
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
    }
}
