//! `devgate.io/vf-settings`: a pod's own settings for its VFs, as a JSON object
//! with the fields of the node config's `[vf.defaults]`
//! (`{"vlan": 30, "mtu": 9000}`). Parsed and range-checked here; whether the node
//! lets pods set each one is the plan's question (`[vf] pod_settings`).

use super::{AllocationError, VF_SETTINGS};
use crate::config::VfSettings;

/// Nine settings with their names and values fit in a few hundred bytes.
pub const MAX_VF_SETTINGS_BYTES: usize = 1024;

pub(super) fn parse_vf_settings(text: &str) -> Result<VfSettings, AllocationError> {
    if text.len() > MAX_VF_SETTINGS_BYTES {
        return Err(AllocationError::TooLarge {
            annotation: VF_SETTINGS,
            len: text.len(),
            limit: MAX_VF_SETTINGS_BYTES,
        });
    }
    // Unknown and duplicate fields are errors (`deny_unknown_fields`, serde's
    // derive), so a pod cannot slip past a check with a second spelling.
    let settings: VfSettings =
        serde_json::from_str(text).map_err(|e| AllocationError::Malformed {
            annotation: VF_SETTINGS,
            entry: "-".into(),
            // serde quotes the pod's unknown key or value as decoded: no
            // control character of it reaches the kubelet's event.
            reason: crate::untrusted::one_line(&e.to_string(), 200),
        })?;
    match settings.out_of_range() {
        Some((name, reason)) => Err(AllocationError::Malformed {
            annotation: VF_SETTINGS,
            entry: name.as_str().into(),
            reason: reason.into(),
        }),
        None => Ok(settings),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MacPolicy, VfLinkState};

    #[test]
    fn settings_parse_or_name_what_is_wrong() {
        let s = parse_vf_settings(
            r#"{"vlan":30,"qos":2,"mtu":9000,"mac":"random","link_state":"enable","max_tx_rate":1000}"#,
        )
        .unwrap();
        assert_eq!((s.vlan, s.qos, s.mtu), (Some(30), Some(2), Some(9000)));
        assert_eq!(s.mac, Some(MacPolicy::Random));
        assert_eq!(s.link_state, Some(VfLinkState::Enable));
        assert_eq!(s.trust, None);
        assert_eq!(parse_vf_settings("{}").unwrap(), VfSettings::default());

        let long = format!(r#"{{"mtu":9000{}}}"#, " ".repeat(MAX_VF_SETTINGS_BYTES));
        let cases = [
            (
                r#"{"vlan":4095}"#,
                "devgate.io/vf-settings: vlan: malformed: must be 0 to 4094",
            ),
            (
                r#"{"mtu":20}"#,
                "devgate.io/vf-settings: mtu: malformed: must be 68 to 65535",
            ),
            (
                r#"{"vlan":-1}"#,
                "devgate.io/vf-settings: -: malformed: invalid value",
            ),
            (r#"{"vendor":1}"#, "unknown field `vendor`"),
            (r#"{"mtu":1500,"mtu":9000}"#, "duplicate field `mtu`"),
            (r#"{"mac":"00:11:22:33:44:55"}"#, "unknown variant"),
            ("[1]", "devgate.io/vf-settings: -: malformed"),
            (long.as_str(), "over the limit of 1024"),
            (r#"{"\r\n\u001b[2Jx":1}"#, "unknown field `   [2Jx`"),
            (r#"{"mac":"\nX"}"#, "unknown variant ` X`"),
        ];
        for (text, want) in cases {
            let e = parse_vf_settings(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
