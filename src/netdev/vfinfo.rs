//! PF-side VF settings over rtnetlink: one `IFLA_VF_INFO` per RTM_SETLINK
//! on the PF, and the PF's `IFLA_VFINFO_LIST` read back (include/uapi/linux/
//! if_link.h; `do_setvfinfo` and `rtnl_fill_vfinfo` in net/core/rtnetlink.c),
//! and the state saved from it.

use netlink_packet_route::link::{
    LinkAttribute, LinkMessage, LinkVfInfo, VfInfo, VfInfoLinkState, VfInfoMac, VfInfoRate,
    VfInfoSpoofCheck, VfInfoTrust, VfLinkState, VfVlan, VfVlanInfo, VlanProtocol,
};
use serde::{Deserialize, Serialize};

use super::rtnl::{emit, link_msg};
use super::settings::{HwAddr, LinkState, RateConfig, VfConfig, VlanConfig, VlanProto};

/// One PF-side VF setting (`IFLA_VFINFO_LIST > IFLA_VF_INFO > ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VfField {
    Mac(HwAddr),
    Vlan(VlanConfig),
    Rate(RateConfig),
    SpoofChk(bool),
    Trust(bool),
    LinkState(LinkState),
}

impl VfField {
    pub fn step(&self) -> &'static str {
        match self {
            VfField::Mac(_) => "set pf vf mac",
            VfField::Vlan(_) => "set pf vf vlan",
            VfField::Rate(_) => "set pf vf rate",
            VfField::SpoofChk(_) => "set pf vf spoofchk",
            VfField::Trust(_) => "set pf vf trust",
            VfField::LinkState(_) => "set pf vf link state",
        }
    }
}

/// What a setting the pod changed goes back to where the PF never reported its
/// value before: the restrictive one, so that the next tenant does not inherit
/// what this one was granted. A trusted VF may change its MAC and enter
/// promiscuous mode (`ndo_set_vf_trust`), and one without spoof checking may send
/// frames with any source address.
pub const RESTRICTIVE_SPOOFCHK: bool = true;
/// See [`RESTRICTIVE_SPOOFCHK`].
pub const RESTRICTIVE_TRUST: bool = false;

/// A VF's admin state as the PF reports it (one `IFLA_VF_INFO` of `IFLA_VFINFO_LIST`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "SavedVfState", into = "SavedVfState")]
pub struct VfState {
    pub vf: u32,
    pub mac: HwAddr,
    pub vlan: VlanConfig,
    pub rate: RateConfig,
    /// `None`: the driver does not report it (`rtnl_fill_vfinfo` presets the
    /// setting to -1 before `ndo_get_vf_config`, and a driver may leave it).
    pub spoofchk: Option<bool>,
    /// `None`: not reported, as for `spoofchk`.
    pub trust: Option<bool>,
    pub link_state: LinkState,
}

/// [`VfState`] as saved: spoof checking and trust as the booleans every
/// version of the record has held, the restrictive value standing for one
/// the driver did not report, which `unreported` names. A version that
/// knows no `unreported` (a hook or plugin of the release before, during an
/// upgrade or after a downgrade) reads the record and restores that value.
#[derive(Serialize, Deserialize)]
struct SavedVfState {
    vf: u32,
    mac: HwAddr,
    vlan: VlanConfig,
    rate: RateConfig,
    /// Always written; read as unreported when absent or null.
    #[serde(default)]
    spoofchk: Option<bool>,
    #[serde(default)]
    trust: Option<bool>,
    link_state: LinkState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unreported: Option<Vec<Unreported>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Unreported {
    Spoofchk,
    Trust,
    /// What a later version may add: read, and left alone.
    #[serde(other)]
    Other,
}

impl From<SavedVfState> for VfState {
    fn from(s: SavedVfState) -> VfState {
        let unreported = s.unreported.unwrap_or_default();
        let reported = |flag, value: Option<bool>| value.filter(|_| !unreported.contains(&flag));
        VfState {
            spoofchk: reported(Unreported::Spoofchk, s.spoofchk),
            trust: reported(Unreported::Trust, s.trust),
            vf: s.vf,
            mac: s.mac,
            vlan: s.vlan,
            rate: s.rate,
            link_state: s.link_state,
        }
    }
}

impl From<VfState> for SavedVfState {
    fn from(s: VfState) -> SavedVfState {
        let unreported = [
            (s.spoofchk.is_none(), Unreported::Spoofchk),
            (s.trust.is_none(), Unreported::Trust),
        ];
        let unreported: Vec<_> = unreported
            .into_iter()
            .filter(|u| u.0)
            .map(|u| u.1)
            .collect();
        SavedVfState {
            spoofchk: Some(s.spoofchk.unwrap_or(RESTRICTIVE_SPOOFCHK)),
            trust: Some(s.trust.unwrap_or(RESTRICTIVE_TRUST)),
            unreported: (!unreported.is_empty()).then_some(unreported),
            vf: s.vf,
            mac: s.mac,
            vlan: s.vlan,
            rate: s.rate,
            link_state: s.link_state,
        }
    }
}

impl VfState {
    /// What restores this state for the fields `changed` touched. The admin MAC is
    /// restored whenever it was saved (sriov-cni PR #397: apps can change it).
    pub fn restore_config(&self, changed: &VfConfig) -> VfConfig {
        VfConfig {
            mac: Some(self.mac.clone()),
            vlan: changed.vlan.map(|_| self.vlan),
            rate: changed.rate.map(|_| self.rate),
            spoofchk: changed
                .spoofchk
                .map(|_| self.spoofchk.unwrap_or(RESTRICTIVE_SPOOFCHK)),
            trust: changed
                .trust
                .map(|_| self.trust.unwrap_or(RESTRICTIVE_TRUST)),
            link_state: changed.link_state.map(|_| self.link_state),
        }
    }
}

/// RTM_SETLINK on the PF with one `IFLA_VF_INFO` holding one setting.
pub fn set_vf_request(pf_index: u32, vf: u32, field: &VfField) -> Vec<u8> {
    let info = match field {
        VfField::Mac(mac) => VfInfo::Mac(VfInfoMac::new(vf, mac.as_bytes())),
        VfField::Vlan(v) => VfInfo::VlanList(vec![VfVlan::Info(VfVlanInfo::new(
            vf,
            u32::from(v.vlan),
            u32::from(v.qos),
            VlanProtocol::from(v.proto.ethertype()),
        ))]),
        VfField::Rate(r) => VfInfo::Rate(VfInfoRate::new(vf, r.min, r.max)),
        VfField::SpoofChk(on) => VfInfo::SpoofCheck(VfInfoSpoofCheck::new(vf, *on)),
        VfField::Trust(on) => VfInfo::Trust(VfInfoTrust::new(vf, *on)),
        VfField::LinkState(s) => {
            VfInfo::LinkState(VfInfoLinkState::new(vf, VfLinkState::from(s.raw())))
        }
    };
    let list = vec![LinkVfInfo(vec![info])];
    emit(&link_msg(pf_index, vec![LinkAttribute::VfInfoList(list)]))
}

/// Picks VF `vf` out of a PF's `IFLA_VFINFO_LIST`. The MAC is cut to the PF's
/// address length (`ifla_vf_mac.mac` is always 32 bytes).
pub fn vf_state_from(
    msg: &LinkMessage,
    payload: &[u8],
    pf_addr_len: usize,
    vf: u32,
) -> Option<VfState> {
    let list = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::VfInfoList(l) => Some(l),
        _ => None,
    })?;
    let entry = list.iter().find(|e| {
        e.0.iter()
            .any(|i| matches!(i, VfInfo::Mac(m) if m.vf_id == vf))
    })?;
    let (spoofchk, trust) = reported_flags(payload, vf);
    let mut state = VfState {
        vf,
        mac: HwAddr::default(),
        vlan: VlanConfig {
            vlan: 0,
            qos: 0,
            proto: VlanProto::Dot1Q,
        },
        rate: RateConfig { min: 0, max: 0 },
        spoofchk,
        trust,
        link_state: LinkState::Auto,
    };
    let addr_len = pf_addr_len.clamp(1, super::settings::HWADDR_MAX);
    for info in &entry.0 {
        match info {
            VfInfo::Mac(m) => state.mac = HwAddr::new(&m.mac[..addr_len]).unwrap_or_default(),
            VfInfo::Vlan(v) => {
                state.vlan.vlan = v.vlan_id as u16;
                state.vlan.qos = v.qos as u8;
            }
            VfInfo::VlanList(list) => {
                if let Some(VfVlan::Info(i)) = list.first() {
                    state.vlan = VlanConfig {
                        vlan: i.vlan_id as u16,
                        qos: i.qos as u8,
                        proto: match u16::from(i.protocol) {
                            0x88a8 => VlanProto::Dot1Ad,
                            _ => VlanProto::Dot1Q,
                        },
                    };
                }
            }
            VfInfo::Rate(r) => {
                state.rate = RateConfig {
                    min: r.min_tx_rate,
                    max: r.max_tx_rate,
                }
            }
            VfInfo::LinkState(l) => {
                state.link_state = match l.state {
                    VfLinkState::Enable => LinkState::Enable,
                    VfLinkState::Disable => LinkState::Disable,
                    _ => LinkState::Auto,
                }
            }
            _ => {}
        }
    }
    Some(state)
}

// include/uapi/linux/if_link.h
const IFLA_VFINFO_LIST: u16 = 22;
const IFLA_VF_INFO: u16 = 1;
const IFLA_VF_MAC: u16 = 1;
const IFLA_VF_SPOOFCHK: u16 = 4;
const IFLA_VF_TRUST: u16 = 9;
/// `struct ifinfomsg`, ahead of a link's attributes.
const IFINFOMSG_LEN: usize = 16;

/// Spoof checking and trust (`struct ifla_vf_spoofchk` / `ifla_vf_trust`:
/// `vf`, `setting`) of VF `vf`, read from the raw reply: `rtnl_fill_vfinfo`
/// presets both settings to -1 before asking the driver, so a driver that does
/// not fill one reports `u32::MAX`, which the parsed message reads as off.
/// That, or an absent attribute, is `None`.
pub(super) fn reported_flags(payload: &[u8], vf: u32) -> (Option<bool>, Option<bool>) {
    use super::nl::attrs;
    let Some(entry) = vf_entry(payload, vf) else {
        return (None, None);
    };
    let setting = |kind: u16| {
        let (_, value) = attrs(entry).find(|(k, _)| *k == kind)?;
        match u32_at(value, 4)? {
            u32::MAX => None,
            setting => Some(setting != 0),
        }
    };
    (setting(IFLA_VF_SPOOFCHK), setting(IFLA_VF_TRUST))
}

/// VF `vf`'s `IFLA_VF_INFO` in the PF's `IFLA_VFINFO_LIST`, found by the VF
/// number of its `IFLA_VF_MAC`.
fn vf_entry(payload: &[u8], vf: u32) -> Option<&[u8]> {
    use super::nl::attrs;
    let list = attrs(payload.get(IFINFOMSG_LEN..)?).find(|(k, _)| *k == IFLA_VFINFO_LIST)?;
    attrs(list.1)
        .filter(|(k, _)| *k == IFLA_VF_INFO)
        .map(|(_, e)| e)
        .find(|e| attrs(e).any(|(k, v)| k == IFLA_VF_MAC && u32_at(v, 0) == Some(vf)))
}

/// The native-endian `u32` at byte `offset` of an attribute's value.
fn u32_at(value: &[u8], offset: usize) -> Option<u32> {
    let bytes = value.get(offset..offset.checked_add(4)?)?;
    bytes.try_into().map(u32::from_ne_bytes).ok()
}
