//! What to do with one VF: the attach request and its settings (the PF-side VF
//! state the kernel reports is in `vfinfo`). Field meanings follow sriov-cni's NetConf
//! (`docs/configuration-reference.md`) and include/uapi/linux/if_link.h.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::inventory::PciAddr;

/// `IFNAMSIZ` - 1 (include/uapi/linux/if.h).
pub const IFNAME_MAX: usize = 15;
/// Longest RDMA device name accepted (`IB_DEVICE_NAME_MAX` is 64 with the NUL).
pub const IBDEV_NAME_MAX: usize = 63;
/// `MAX_ADDR_LEN` (include/linux/netdevice.h): the size of `ifla_vf_mac.mac`.
pub const HWADDR_MAX: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("not a hardware address (want hex bytes separated by ':'): {input:?}")]
    HwAddr { input: String },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// A link-layer address: 6 bytes for Ethernet, 20 for IPoIB, at most 32.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct HwAddr(Vec<u8>);

impl HwAddr {
    pub fn new(bytes: &[u8]) -> Option<HwAddr> {
        (!bytes.is_empty() && bytes.len() <= HWADDR_MAX).then(|| HwAddr(bytes.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }
}

impl fmt::Display for HwAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for HwAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for HwAddr {
    type Err = SettingsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || SettingsError::HwAddr {
            input: s.chars().take(100).collect(),
        };
        if s.len() > HWADDR_MAX * 3 {
            return Err(err());
        }
        let bytes = s
            .split(':')
            .map(|p| {
                if p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()) {
                    u8::from_str_radix(p, 16).map_err(|_| err())
                } else {
                    Err(err())
                }
            })
            .collect::<Result<Vec<u8>, _>>()?;
        HwAddr::new(&bytes).ok_or_else(err)
    }
}

impl Serialize for HwAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HwAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// VLAN tag protocol; sriov-cni's `vlanProto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum VlanProto {
    #[default]
    #[serde(rename = "802.1q", alias = "802.1Q")]
    Dot1Q,
    #[serde(rename = "802.1ad", alias = "802.1AD")]
    Dot1Ad,
}

impl VlanProto {
    /// The ethertype (`ETH_P_8021Q`, `ETH_P_8021AD`), sent big-endian in `ifla_vf_vlan_info`.
    pub fn ethertype(self) -> u16 {
        match self {
            VlanProto::Dot1Q => 0x8100,
            VlanProto::Dot1Ad => 0x88a8,
        }
    }
}

/// `IFLA_VF_LINK_STATE_{AUTO,ENABLE,DISABLE}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LinkState {
    #[default]
    Auto,
    Enable,
    Disable,
}

impl LinkState {
    pub fn raw(self) -> u32 {
        match self {
            LinkState::Auto => 0,
            LinkState::Enable => 1,
            LinkState::Disable => 2,
        }
    }
}

/// How a VF is configured, as resolved by the plan (config defaults already
/// merged); every field is optional and only set fields are applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct VfSettings {
    /// Admin MAC on the PF and effective MAC of the VF netdev.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<HwAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan_proto: Option<VlanProto>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spoofchk: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_state: Option<LinkState>,
    /// Mbps; 0 = no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_tx_rate: Option<u32>,
    /// Mbps; 0 = no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tx_rate: Option<u32>,
    /// MTU of the VF netdev in the container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

impl VfSettings {
    /// The PF-side part (RTM_SETLINK on the PF), without the MAC; `None` fields are left alone.
    pub fn pf_config(&self) -> VfConfig {
        let vlan = self.vlan.map(|vlan| VlanConfig {
            vlan,
            qos: self.qos.unwrap_or(0),
            proto: self.vlan_proto.unwrap_or_default(),
        });
        // sriov-cni sends IFLA_VF_RATE when either rate is set, the other as 0.
        let rate = (self.min_tx_rate.is_some() || self.max_tx_rate.is_some()).then(|| RateConfig {
            min: self.min_tx_rate.unwrap_or(0),
            max: self.max_tx_rate.unwrap_or(0),
        });
        VfConfig {
            mac: self.mac.clone(),
            vlan,
            rate,
            spoofchk: self.spoofchk,
            trust: self.trust,
            link_state: self.link_state,
        }
    }

    /// Limits from sriov-cni's `LoadConf` and the kernel's MTU floor (ETH_MIN_MTU 68).
    pub fn validate(&self) -> Result<(), SettingsError> {
        if let Some(mac) = &self.mac {
            if mac.as_bytes().len() != 6 || mac.is_zero() || mac.as_bytes()[0] & 1 == 1 {
                return Err(invalid(
                    "mac",
                    format!("{mac} is not a unicast ethernet address"),
                ));
            }
        }
        match self.vlan {
            Some(v) if v > 4094 => return Err(invalid("vlan", format!("{v} is over 4094"))),
            None | Some(0) if self.qos.unwrap_or(0) != 0 => {
                return Err(invalid("qos", "needs a non-zero vlan"))
            }
            None | Some(0) if self.vlan_proto == Some(VlanProto::Dot1Ad) => {
                return Err(invalid("vlan_proto", "802.1ad needs a non-zero vlan"))
            }
            _ => {}
        }
        if let Some(q) = self.qos.filter(|q| *q > 7) {
            return Err(invalid("qos", format!("{q} is over 7")));
        }
        if let (Some(min), Some(max)) = (self.min_tx_rate, self.max_tx_rate) {
            if max != 0 && min > max {
                return Err(invalid(
                    "min_tx_rate",
                    format!("{min} is over max_tx_rate {max}"),
                ));
            }
        }
        if let Some(mtu) = self.mtu.filter(|m| !(68..=65535).contains(m)) {
            return Err(invalid("mtu", format!("{mtu} is outside 68..=65535")));
        }
        Ok(())
    }
}

/// One VF to give to a container: the hook's and the plugin's input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VfAttach {
    /// The PF netdev on this host; empty when there is none (PF-side settings then fail).
    #[serde(default)]
    pub pf_netdev: String,
    /// N of the PF's `virtfnN`.
    pub vf_index: u32,
    pub vf_bus_id: PciAddr,
    /// The VF netdev's name on the host.
    pub host_netdev: String,
    /// The VF's RDMA device (`mlx5_3`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// Name inside the container: `net1`, `net2`, ...
    pub container_ifname: String,
    #[serde(default)]
    pub settings: VfSettings,
    /// Move the RDMA device into the pod netns (the kernel is in exclusive RDMA netns mode).
    #[serde(default)]
    pub move_rdma: bool,
    /// With `move_rdma`: the RDMA device's char devices as the container's
    /// nodes and cgroup rules name them, checked again after the move.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma_chars: Vec<CharNum>,
}

/// A char device by its class name and numbers (`uverbs3`, 231:195).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CharNum {
    pub name: String,
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for CharNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:{}", self.name, self.major, self.minor)
    }
}

impl VfAttach {
    /// What a saved record keeps of the action on disk: all but
    /// `rdma_chars`, which only the attach in progress reads. Records outlive
    /// a version (a rollback's poststop reads what the newer hook saved), and
    /// a devgate from before the field refuses a record that carries it.
    pub fn saved_form(&self) -> VfAttach {
        VfAttach {
            rdma_chars: Vec::new(),
            ..self.clone()
        }
    }

    pub fn validate(&self) -> Result<(), SettingsError> {
        if !self.pf_netdev.is_empty() {
            check_ifname("pf_netdev", &self.pf_netdev)?;
        }
        check_ifname("host_netdev", &self.host_netdev)?;
        check_ifname("container_ifname", &self.container_ifname)?;
        if let Some(dev) = &self.rdma_device {
            let ok = !dev.is_empty()
                && dev.len() <= IBDEV_NAME_MAX
                && dev
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !ok {
                // Cut as interface names are: the annotation may hold 64 KiB.
                let shown: String = dev.chars().take(IBDEV_NAME_MAX + 1).collect();
                return Err(invalid(
                    "rdma_device",
                    format!("{shown:?} is not an rdma device name"),
                ));
            }
        }
        if self.move_rdma && self.rdma_device.is_none() {
            return Err(invalid("move_rdma", "set without rdma_device"));
        }
        self.settings.validate()
    }
}

/// Kernel rules for a netdev name (net/core/dev.c `dev_valid_name`).
pub fn check_ifname(field: &'static str, name: &str) -> Result<(), SettingsError> {
    let ok = !name.is_empty()
        && name.len() <= IFNAME_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if ok {
        Ok(())
    } else {
        // Quoted (escapes keep it one line) and cut: it may be a pod's.
        let shown: String = name.chars().take(IFNAME_MAX + 1).collect();
        Err(invalid(
            field,
            format!("{shown:?} is not a valid interface name"),
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VlanConfig {
    pub vlan: u16,
    pub qos: u8,
    pub proto: VlanProto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateConfig {
    pub min: u32,
    pub max: u32,
}

/// PF-side VF settings to send; `None` = leave alone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VfConfig {
    pub mac: Option<HwAddr>,
    pub vlan: Option<VlanConfig>,
    pub rate: Option<RateConfig>,
    pub spoofchk: Option<bool>,
    pub trust: Option<bool>,
    pub link_state: Option<LinkState>,
}

impl VfConfig {
    pub fn is_empty(&self) -> bool {
        *self == VfConfig::default()
    }
}
