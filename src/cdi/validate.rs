//! The rules a runtime's CDI library applies when it loads a spec: a known
//! `cdiVersion` at least as new as the fields used, a `vendor/class` kind, at
//! least one device, unique well-formed device names, non-empty device edits,
//! well-formed env entries and device nodes (SPEC.md, `pkg/parser`,
//! `container-edits.go`, `specs-go/version.go`). A spec devgate writes must pass
//! them all: a runtime that refuses one spec refuses every device in it.
use std::collections::HashSet;

use super::{CdiError, ContainerEdits, Spec, MAX_DEVICES};

/// Spec versions the CDI library knows, oldest first (`specs-go/version.go`).
const KNOWN_VERSIONS: [&str; 10] = [
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];
/// Kind name segment limit (SPEC.md "Kind").
const MAX_CLASS: usize = 63;
/// DNS subdomain limit of the vendor prefix.
const MAX_VENDOR: usize = 253;

/// Checks `spec` against the rules runtimes apply on load.
pub fn validate(spec: &Spec) -> Result<(), CdiError> {
    let invalid = |reason: String| CdiError::Invalid {
        kind: spec.kind.clone(),
        reason,
    };
    let version = version_index(&spec.cdi_version)
        .ok_or_else(|| invalid(format!("unknown cdiVersion {:?}", spec.cdi_version)))?;
    let (vendor, class) = spec
        .kind
        .split_once('/')
        .ok_or_else(|| invalid("kind is not vendor/class".into()))?;
    vendor_or_class(vendor, MAX_VENDOR).map_err(|r| invalid(format!("vendor: {r}")))?;
    vendor_or_class(class, MAX_CLASS).map_err(|r| invalid(format!("class: {r}")))?;
    if spec.devices.is_empty() {
        return Err(invalid("no devices (a spec needs at least one)".into()));
    }
    if spec.devices.len() > MAX_DEVICES {
        return Err(invalid(format!("more than {MAX_DEVICES} devices")));
    }
    edits(&spec.container_edits).map_err(|r| invalid(format!("containerEdits: {r}")))?;
    let mut seen = HashSet::new();
    for d in &spec.devices {
        let bad = |reason: String| CdiError::InvalidDevice {
            kind: spec.kind.clone(),
            name: d.name.chars().take(64).collect(),
            reason,
        };
        device_name(&d.name).map_err(bad)?;
        if !seen.insert(d.name.as_str()) {
            return Err(bad("duplicate device name".into()));
        }
        if d.container_edits.is_empty() {
            return Err(bad("empty containerEdits".into()));
        }
        edits(&d.container_edits).map_err(bad)?;
    }
    let needed = required_version(spec);
    if version < needed {
        return Err(invalid(format!(
            "cdiVersion {} is older than {} which the fields used need",
            spec.cdi_version, KNOWN_VERSIONS[needed]
        )));
    }
    Ok(())
}

/// True when `version` is a known spec version not older than `min`.
pub fn version_at_least(version: &str, min: &str) -> bool {
    matches!((version_index(version), version_index(min)), (Some(v), Some(m)) if v >= m)
}

fn version_index(version: &str) -> Option<usize> {
    let v = version.strip_prefix('v').unwrap_or(version);
    KNOWN_VERSIONS.iter().position(|k| *k == v)
}

/// The oldest version whose fields cover what `spec` uses.
fn required_version(spec: &Spec) -> usize {
    let idx = |v: &str| version_index(v).unwrap_or(0);
    let class_has_dot = spec
        .kind
        .split_once('/')
        .is_some_and(|(_, c)| c.contains('.'));
    if !spec.annotations.is_empty()
        || spec.devices.iter().any(|d| !d.annotations.is_empty())
        || class_has_dot
    {
        return idx("0.6.0");
    }
    let all_edits = spec
        .devices
        .iter()
        .map(|d| &d.container_edits)
        .chain(std::iter::once(&spec.container_edits));
    let host_path = all_edits
        .flat_map(|e| &e.device_nodes)
        .any(|n| n.host_path.is_some());
    let digit_name = spec
        .devices
        .iter()
        .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()));
    if host_path || digit_name {
        return idx("0.5.0");
    }
    idx("0.3.0")
}

/// Vendor and class: a letter first, an alphanumeric last, `-_.` between.
fn vendor_or_class(name: &str, max: usize) -> Result<(), String> {
    let b = name.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return Err("empty".into());
    };
    if b.len() > max {
        return Err(format!("longer than {max} characters"));
    }
    if !first.is_ascii_alphabetic() {
        return Err(format!("{name:?} should start with a letter"));
    }
    if !last.is_ascii_alphanumeric() {
        return Err(format!("{name:?} should end with a letter or digit"));
    }
    match b
        .iter()
        .find(|c| !(c.is_ascii_alphanumeric() || b"-_.".contains(c)))
    {
        Some(c) => Err(format!("invalid character {:?} in {name:?}", *c as char)),
        None => Ok(()),
    }
}

/// Device name: alphanumeric first and last, `-_.:` between.
fn device_name(name: &str) -> Result<(), String> {
    let b = name.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return Err("empty device name".into());
    };
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err("a device name starts and ends with a letter or digit".into());
    }
    match b
        .iter()
        .find(|c| !(c.is_ascii_alphanumeric() || b"-_.:".contains(c)))
    {
        Some(c) => Err(format!("invalid character {:?}", *c as char)),
        None => Ok(()),
    }
}

fn edits(e: &ContainerEdits) -> Result<(), String> {
    if let Some(v) = e.env.iter().find(|v| v.find('=').is_none_or(|i| i == 0)) {
        return Err(format!("env entry {v:?} is not NAME=VALUE"));
    }
    let mut paths = HashSet::new();
    for n in &e.device_nodes {
        if n.path.is_empty() || !n.path.starts_with('/') {
            return Err(format!("device node path {:?} is not absolute", n.path));
        }
        if !paths.insert(n.path.as_str()) {
            return Err(format!("device node {} listed twice", n.path));
        }
        if !matches!(n.kind.as_str(), "b" | "c" | "u" | "p") {
            return Err(format!("device node {}: invalid type {:?}", n.path, n.kind));
        }
        let perms_ok = n.permissions.is_empty()
            || n.permissions == "none"
            || n.permissions.chars().all(|c| "rwm".contains(c));
        if !perms_ok {
            return Err(format!(
                "device node {}: invalid permissions {:?}",
                n.path, n.permissions
            ));
        }
        // Numbers are always written so that no runtime stats the host path.
        if n.major < 0 || n.minor < 0 || (n.kind != "p" && n.major == 0) {
            return Err(format!(
                "device node {}: invalid numbers {}:{}",
                n.path, n.major, n.minor
            ));
        }
    }
    Ok(())
}
