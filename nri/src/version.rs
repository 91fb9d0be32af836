//! Which NRI version a runtime speaks, and which events it therefore accepts.
//!
//! From v0.12 the runtime states its NRI version in
//! `ConfigureRequest.NRI_version`. Older runtimes do not, so the version is
//! inferred from the runtime's own name and version using the NRI module each
//! release vendors (go.mod of containerd and CRI-O; the same table as
//! `pkg/api/version.go` `InferVersionFromRuntime`).

use std::fmt;

use crate::EventMask;

/// An NRI release, `vMAJOR.MINOR.PATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NriVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

/// First release with the pod-update and validation events (12-14).
const V0_10: NriVersion = NriVersion::new(0, 10, 0);
/// First release that synchronizes the plugins it launches (commit b881bc4:
/// v0.6.1's `startPlugins` registers and configures them only; its
/// `syncFn` runs for external connections alone).
const V0_7: NriVersion = NriVersion::new(0, 7, 0);
/// The pre-release CRI-O 1.33 vendors (`v0.9.1-0.20250219030224-e597e7849f24`),
/// whose `LAST` is 14: the pod-update events (12, 13) without validation.
const V0_9_1: NriVersion = NriVersion::new(0, 9, 1);

/// What a runtime without module build information states as its NRI
/// version (`pkg/version`: `UnknownVersion`, `DevelVersion`); like an empty
/// field, these say nothing, and the stub infers the version instead.
const UNSTATED: [&str; 3] = ["", "0.0.0-unknown", "(devel)"];

impl NriVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> NriVersion {
        NriVersion {
            major,
            minor,
            patch,
        }
    }

    /// Parses `v0.12.2`, `0.8.0`, `v0.10` or `v0.12.2-31-g8ec8b28`: an
    /// optional `v`, then major and minor, an optional patch; any suffix
    /// after `-`, `+` or `~` is ignored.
    pub fn parse(text: &str) -> Option<NriVersion> {
        let (major, minor, patch) = parse_triple(text.trim().trim_start_matches('v'))?;
        Some(NriVersion::new(major, minor, patch))
    }

    /// The runtime's NRI version from a `ConfigureRequest`: the stated
    /// `NRI_version`, or, when it is absent, unknown, a development build or
    /// unreadable, the one inferred from the runtime's name and version (as
    /// `pkg/stub` `Configure` does).
    pub fn of_runtime(
        nri_version: &str,
        runtime_name: &str,
        runtime_version: &str,
    ) -> Option<NriVersion> {
        let stated = nri_version.trim();
        let parsed = if UNSTATED.contains(&stated) {
            None
        } else {
            NriVersion::parse(stated).filter(|v| *v != NriVersion::new(0, 0, 0))
        };
        parsed.or_else(|| NriVersion::infer_from_runtime(runtime_name, runtime_version))
    }

    /// The NRI version vendored by `runtime_name` at `runtime_version`, as
    /// sent in `ConfigureRequest`; `None` for a runtime not known here.
    pub fn infer_from_runtime(runtime_name: &str, runtime_version: &str) -> Option<NriVersion> {
        let (major, minor, patch) = parse_triple(runtime_version.trim().trim_start_matches('v'))?;
        match runtime_name {
            "containerd" => containerd_nri(major, minor, patch),
            "cri-o" | "crio" | "CRI-O" => crio_nri(major, minor),
            _ => None,
        }
    }

    /// Whether a runtime with this NRI version sends Synchronize to a plugin
    /// it launched (a pre-installed one); every version does to a plugin
    /// that connects to its socket.
    pub fn synchronizes_launched(self) -> bool {
        self >= V0_7
    }

    /// The events a runtime with this NRI version accepts in a subscription.
    pub fn valid_events(self) -> EventMask {
        if self >= V0_10 {
            EventMask::SINCE_V0_10
        } else if self >= V0_9_1 {
            EventMask::SINCE_V0_9_1
        } else {
            EventMask::BEFORE_V0_10
        }
    }

    /// [`NriVersion::valid_events`], conservatively assuming a pre-v0.10
    /// runtime when the version is not known.
    pub fn valid_events_of(version: Option<NriVersion>) -> EventMask {
        version.map_or(EventMask::BEFORE_V0_10, NriVersion::valid_events)
    }
}

impl fmt::Display for NriVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

fn parse_triple(text: &str) -> Option<(u32, u32, u32)> {
    // '~' appears in distribution builds, e.g. Debian's "1.7.24~ds1".
    let core = text.split(['-', '+', '~']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    Some((major, minor, patch))
}

/// containerd release → vendored NRI (nri.md §4 table).
fn containerd_nri(major: u32, minor: u32, patch: u32) -> Option<NriVersion> {
    let v = match (major, minor) {
        (1, 7) => match patch {
            0..=6 => NriVersion::new(0, 3, 0),
            7..=13 => NriVersion::new(0, 4, 0),
            14..=15 => NriVersion::new(0, 6, 0),
            16..=25 => NriVersion::new(0, 6, 1),
            _ => NriVersion::new(0, 8, 0),
        },
        // 1.6 and older have no NRI v0.2+ at all; treat as the oldest.
        (0..=1, _) => NriVersion::new(0, 3, 0),
        (2, 0..=1) => NriVersion::new(0, 8, 0),
        (2, 2) if patch == 0 => NriVersion::new(0, 10, 0),
        (2, 2) => NriVersion::new(0, 11, 0),
        (2, 3) => NriVersion::new(0, 12, 0),
        // Later releases vendor at least what 2.3 did.
        _ => NriVersion::new(0, 12, 0),
    };
    Some(v)
}

/// CRI-O release → vendored NRI (nri.md §4 table).
fn crio_nri(major: u32, minor: u32) -> Option<NriVersion> {
    if major != 1 {
        return None;
    }
    let v = match minor {
        0..=25 => return None,
        26..=28 => NriVersion::new(0, 3, 0),
        29 => NriVersion::new(0, 5, 0),
        30 => NriVersion::new(0, 6, 0),
        31 => NriVersion::new(0, 6, 1),
        32 => NriVersion::new(0, 9, 0),
        33 => V0_9_1,
        34 => NriVersion::new(0, 10, 0),
        _ => NriVersion::new(0, 11, 0),
    };
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tags_and_describe_output() {
        assert_eq!(
            NriVersion::parse("v0.12.2"),
            Some(NriVersion::new(0, 12, 2))
        );
        assert_eq!(NriVersion::parse("0.8.0"), Some(NriVersion::new(0, 8, 0)));
        assert_eq!(NriVersion::parse("v0.10"), Some(NriVersion::new(0, 10, 0)));
        assert_eq!(
            NriVersion::parse("v0.12.2-31-g8ec8b28"),
            Some(NriVersion::new(0, 12, 2))
        );
        assert_eq!(NriVersion::parse(""), None);
        assert_eq!(NriVersion::parse("vx.y"), None);
        assert_eq!(NriVersion::parse("1"), None);
    }

    #[test]
    fn infers_containerd_releases() {
        let cases = [
            ("1.7.24+unknown", "v0.6.1"),
            ("1.7.24~ds1", "v0.6.1"),
            ("v1.7.24", "v0.6.1"),
            ("1.7.5", "v0.3.0"),
            ("1.7.30", "v0.8.0"),
            ("2.0.4", "v0.8.0"),
            ("2.1.1", "v0.8.0"),
            ("2.2.0", "v0.10.0"),
            ("2.2.3", "v0.11.0"),
            ("2.3.4", "v0.12.0"),
        ];
        for (runtime, nri) in cases {
            let got = NriVersion::infer_from_runtime("containerd", runtime);
            assert_eq!(
                got.map(|v| v.to_string()).as_deref(),
                Some(nri),
                "{runtime}"
            );
        }
        assert_eq!(NriVersion::infer_from_runtime("containerd", "dev"), None);
    }

    #[test]
    fn infers_crio_releases_and_rejects_unknown_runtimes() {
        let v = NriVersion::infer_from_runtime("cri-o", "1.34.1");
        assert_eq!(v, Some(NriVersion::new(0, 10, 0)));
        let v = NriVersion::infer_from_runtime("cri-o", "1.31.0");
        assert_eq!(v, Some(NriVersion::new(0, 6, 1)));
        assert_eq!(NriVersion::infer_from_runtime("podman", "5.0.0"), None);
        let v = NriVersion::infer_from_runtime("cri-o", "1.33.2");
        assert_eq!(
            v.map(NriVersion::valid_events).map(EventMask::bits),
            Some(0x1FFF)
        );
        let v = NriVersion::infer_from_runtime("cri-o", "1.32.4");
        assert_eq!(
            v.map(NriVersion::valid_events).map(EventMask::bits),
            Some(0x7FF)
        );
    }

    #[test]
    fn an_unstated_version_is_inferred_from_the_runtime() {
        for stated in ["", "0.0.0-unknown", "(devel)", " v0.0.0 ", "garbage"] {
            let v = NriVersion::of_runtime(stated, "containerd", "2.3.0");
            assert_eq!(v, Some(NriVersion::new(0, 12, 0)), "{stated:?}");
        }
        let v = NriVersion::of_runtime("v0.12.2", "containerd", "1.7.24");
        assert_eq!(v, Some(NriVersion::new(0, 12, 2)), "a stated version wins");
        assert_eq!(NriVersion::of_runtime("0.0.0-unknown", "podman", "5"), None);
    }

    #[test]
    fn valid_events_by_version() {
        let old = NriVersion::new(0, 6, 1).valid_events();
        assert_eq!(old, EventMask::BEFORE_V0_10);
        let new = NriVersion::new(0, 12, 0).valid_events();
        assert_eq!(new, EventMask::SINCE_V0_10);
        assert_eq!(NriVersion::valid_events_of(None).bits(), 0x7FF);
    }
}
