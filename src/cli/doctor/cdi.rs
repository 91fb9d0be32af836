//! `device_mode = "cdi"` against what containerd will do with CDI names.
//!
//! The plugin decides from the runtime's name and version and `runtime_cdi`
//! (`plugin::features`); only the node shows containerd's `enable_cdi`, which
//! decides 1.7.30+ (off by default) and can turn 2.1+ off (on by default). A
//! runtime that gets CDI names it does not inject starts the container without
//! those devices or fails it, so that mismatch fails; one that could take them
//! but gets raw nodes only warns (raw nodes are always exact).
use std::path::PathBuf;

use nri::RuntimeInfo;

use super::containerd::{version_word, ContainerdConfig};
use super::host::{Host, Roots};
use super::Check;
use crate::cdi::{self, Class, DeviceNode, SpecDirs};
use crate::config::{Config, DeviceMode, RuntimeCdi};
use crate::inventory::Inventory;
use crate::plugin::features;

const NAME: &str = "cdi";
const SPECS: &str = "cdi specs";

/// With `device_mode = "cdi"`: each device of the node, resolved in the
/// runtime's spec directories as a container's is, gives the nodes a plan
/// for it gives, the check the plugin makes at each creation.
pub fn specs(roots: &Roots, host: &dyn Host, config: &Config, inventory: &Inventory) -> Check {
    if config.device_mode == DeviceMode::Nodes {
        return Check::pass(SPECS, "device_mode = \"nodes\": no spec is read");
    }
    if config.runtime_cdi == RuntimeCdi::Off {
        return Check::pass(SPECS, "runtime_cdi = \"off\": raw nodes, no spec is read");
    }
    // Only where devgate names CDI devices (the cdi check says whether that
    // agrees with containerd): elsewhere containers get raw nodes.
    let names = host
        .containerd_version()
        .ok()
        .and_then(|line| Some(names_cdi(version_word(&line)?, config)));
    if names == Some(false) {
        return Check::pass(SPECS, "raw nodes for this containerd: no spec is read");
    }
    let dirs: Vec<PathBuf> = config
        .cdi_spec_dirs
        .iter()
        .map(|d| roots.host_path(d))
        .collect();
    let generated = match cdi::generate(inventory, config, &Class::ALL, cdi::DEFAULT_CDI_VERSION) {
        Ok(g) => g,
        Err(e) => return Check::warn(SPECS, e.to_string(), "see the config check"),
    };
    let checker = SpecDirs::default();
    let (mut count, mut failed) = (0, Vec::new());
    for (class, spec) in &generated.specs {
        for dev in &spec.devices {
            count += 1;
            let nodes = dev.container_edits.device_nodes.iter();
            let want: Vec<DeviceNode> = nodes
                .chain(&spec.container_edits.device_nodes)
                .cloned()
                .collect();
            if let Err(e) = checker.check(&dirs, &[class.qualified(&dev.name)], &want) {
                failed.push(e.to_string());
            }
        }
    }
    let shown = |d: &[PathBuf]| {
        d.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if failed.is_empty() {
        return Check::pass(
            SPECS,
            format!(
                "{count} devices: the specs in {} give what devgate plans",
                shown(&dirs)
            ),
        );
    }
    // Without containerd (CRI-O) whether the runtime reads the specs is
    // not known here: said, not failed.
    let report = if names.is_some() {
        Check::fail
    } else {
        Check::warn
    };
    report(
        SPECS,
        format!(
            "{} of {count} devices would be refused, the first: {}",
            failed.len(),
            failed[0]
        ),
        "run devgate cdi generate -o /etc/cdi on the node (after every change of its devices)",
    )
}

pub fn cdi(host: &dyn Host, containerd: &ContainerdConfig, config: &Config) -> Check {
    if config.device_mode == DeviceMode::Nodes {
        return Check::pass(NAME, "device_mode = \"nodes\": devices as raw nodes");
    }
    let Ok(line) = host.containerd_version() else {
        return Check::warn(
            NAME,
            "containerd version unknown: cannot tell whether it injects cdi devices",
            "see the containerd check",
        );
    };
    let version = version_word(&line).unwrap_or_default();
    let Some(v) = features::release(version) else {
        return Check::warn(
            NAME,
            format!("cannot read a release from {line:?}"),
            "see the containerd check",
        );
    };
    let enable_cdi = match &containerd.loaded {
        Ok(Some(eff)) => eff
            .cri
            .as_ref()
            .and_then(|t| t.get("enable_cdi"))
            .and_then(|v| v.as_bool()),
        Ok(None) => None,
        Err(e) => return Check::warn(NAME, e.clone(), "see the nri enabled check"),
    };
    let devgate_names = names_cdi(version, config);
    let injects = injects(v, enable_cdi);
    let setting = match enable_cdi {
        Some(b) => format!("enable_cdi = {b}"),
        None => "enable_cdi unset".to_string(),
    };
    let path = containerd.path.display();
    match (devgate_names, injects) {
        (true, true) => Check::pass(NAME, format!("cdi names; containerd {version} injects them ({setting})")),
        (false, false) => Check::pass(NAME, format!("raw nodes; containerd {version} does not inject cdi devices ({setting})")),
        (true, false) => Check::fail(
            NAME,
            format!("devgate would name cdi devices, but containerd {version} does not inject them ({setting} in {path})"),
            "set enable_cdi = true in containerd's CRI config and restart it, or set runtime_cdi = \"off\" (or \"auto\") in devgate's config",
        ),
        (false, true) if config.runtime_cdi == RuntimeCdi::Off => Check::pass(
            NAME,
            format!("raw nodes (runtime_cdi = \"off\"); containerd {version} could inject cdi devices"),
        ),
        (false, true) => Check::warn(
            NAME,
            format!("containerd {version} injects cdi devices ({setting}), but devgate cannot see that and uses raw nodes"),
            "set runtime_cdi = \"on\" in devgate's config to use the cdi names of device_mode = \"cdi\"",
        ),
    }
}

/// Whether the plugin, configured by containerd `version`, names CDI devices
/// in its adjustments (`plugin::features`, from `runtime_cdi`).
fn names_cdi(version: &str, config: &Config) -> bool {
    let runtime = RuntimeInfo {
        name: "containerd".into(),
        version: version.into(),
        ..RuntimeInfo::default()
    };
    features::detect(&runtime, config.runtime_cdi).cdi_devices
}

/// Whether containerd `v` injects CDI devices of an NRI adjustment:
/// 2.1+ unless `enable_cdi = false`, 1.7.30+ only with `enable_cdi = true`
/// (containerd#12650); 1.7.26-1.7.29 and 2.0 drop them.
fn injects(v: (u32, u32, u32), enable_cdi: Option<bool>) -> bool {
    if v >= (2, 1, 0) {
        enable_cdi != Some(false)
    } else {
        ((1, 7, 30)..(1, 8, 0)).contains(&v) && enable_cdi == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_lines_and_enable_cdi() {
        let cases = [
            ((1, 7, 24), Some(true), false),
            ((1, 7, 30), None, false),
            ((1, 7, 30), Some(true), true),
            ((2, 0, 7), Some(true), false),
            ((2, 1, 9), None, true),
            ((2, 1, 9), Some(false), false),
        ];
        for (v, enable, want) in cases {
            assert_eq!(injects(v, enable), want, "{v:?} {enable:?}");
        }
    }
}
