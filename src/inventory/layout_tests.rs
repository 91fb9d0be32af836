//! Hosts whose PCI root buses are not the first thing under `sys/devices`.
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use super::discover_tests::absolutize;
use super::*;
use crate::fixture::HostRootBuilder;

/// Where a Hyper-V guest's PCI buses sit (Azure's GPU and InfiniBand VMs).
const VMBUS: &str =
    "sys/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00/f8b3781b-1e82-4818-a1c3-63d806ec15bb";

/// Moves every `sys/devices/pci*` to what `to` makes of its name (a path
/// below the root), links rewritten to follow.
fn move_root_buses(root: &Path, to: fn(&str) -> String) {
    absolutize(root, root).expect("absolutize");
    retarget(root, to);
    for e in fs::read_dir(root.join("sys/devices")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("pci") {
            let dest = root.join(to(&name));
            fs::create_dir_all(dest.parent().unwrap()).unwrap();
            fs::rename(root.join("sys/devices").join(&name), dest).unwrap();
        }
    }
}

fn retarget(dir: &Path, to: fn(&str) -> String) {
    for e in fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let meta = fs::symlink_metadata(&path).unwrap();
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&path).unwrap();
            let Ok(rest) = target.strip_prefix("/sys/devices") else {
                continue;
            };
            let mut parts = rest.components();
            let Some(bus) = parts.next().and_then(|c| c.as_os_str().to_str()) else {
                continue;
            };
            if bus.starts_with("pci") {
                let new = Path::new("/").join(to(bus)).join(parts.as_path());
                fs::remove_file(&path).unwrap();
                symlink(new, &path).unwrap();
            }
        } else if meta.is_dir() {
            retarget(&path, to);
        }
    }
}

#[test]
fn the_pcie_root_is_the_first_root_bus_on_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx()
        .gpus(2)
        .nics(1)
        .build(dir.path())
        .unwrap();
    move_root_buses(dir.path(), |bus| format!("{VMBUS}/{bus}"));
    let inv = discover(fixture.root());
    assert_eq!(inv.warnings, Vec::<String>::new());
    let roots = |i: &Inventory| -> Vec<String> {
        i.gpus
            .iter()
            .map(|g| g.topology.pcie_root.clone())
            .chain(i.rdma.iter().map(|n| n.topology.pcie_root.clone()))
            .collect()
    };
    assert_eq!(roots(&inv), roots(fixture.expected()));
    assert!(
        roots(&inv).iter().all(|r| r.starts_with("pci0000:")),
        "{:?}",
        roots(&inv)
    );
}

/// Devices with no root bus on their path warn: their placement is unknown.
#[test]
fn a_path_without_a_root_bus_warns() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx()
        .gpus(1)
        .nics(0)
        .build(dir.path())
        .unwrap();
    move_root_buses(dir.path(), |bus| {
        format!(
            "sys/devices/platform/soc/bus{}",
            bus.trim_start_matches("pci")
        )
    });
    let inv = discover(fixture.root());
    let gpu = fixture.expected().gpus[0].bus_id.to_string();
    assert!(
        inv.warnings
            .iter()
            .any(|w| w.contains(&gpu) && w.contains("no PCI root bus")),
        "{:?}",
        inv.warnings
    );
    assert_eq!(inv.gpus[0].topology.pcie_root, "");
}
