//! The CDI spec check: specs written by `generate` pass; a stale, missing,
//! doubly named or unreadable one fails the container's devices.
use std::path::{Path, PathBuf};

use super::*;
use crate::allocation::{Allocation, GpuEntry, PodDevices};
use crate::cdi::{generate, node, Class, Spec, DEFAULT_CDI_VERSION};
use crate::config::Config;
use crate::fixture::HostRootBuilder;
use crate::inventory::Inventory;

struct Node {
    _dir: tempfile::TempDir,
    inv: Inventory,
    gpu_spec: Spec,
    dirs: Vec<PathBuf>,
}

fn node_with_dirs() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx()
        .build(&dir.path().join("root"))
        .unwrap();
    let inv = crate::inventory::discover(fixture.root());
    let g = generate(&inv, &Config::default(), &[Class::Gpu], DEFAULT_CDI_VERSION).unwrap();
    let dirs = vec![dir.path().join("etc-cdi"), dir.path().join("run-cdi")];
    for d in &dirs {
        std::fs::create_dir(d).unwrap();
    }
    Node {
        _dir: dir,
        inv,
        gpu_spec: g.specs.into_iter().next().unwrap().1,
        dirs,
    }
}

fn write(dir: &Path, name: &str, spec: &Spec) {
    std::fs::write(dir.join(name), serde_json::to_vec(spec).unwrap()).unwrap();
}

/// The CDI names and the plan's nodes for a container given GPUs `idx`.
fn wanted(n: &Node, idx: &[usize]) -> (Vec<String>, Vec<DeviceNode>) {
    let gpus = idx.iter().map(|&i| &n.inv.gpus[i]);
    let pod = PodDevices {
        allocation: Allocation {
            gpus: gpus
                .clone()
                .map(|g| GpuEntry {
                    minor: g.minor,
                    uuid: None,
                    resources: Default::default(),
                })
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    let plan = crate::plan::build(&n.inv, &pod, "c", &Config::default()).unwrap();
    let names = gpus.map(|g| Class::Gpu.qualified(&g.uuid)).collect();
    (names, plan.devices.iter().map(node).collect())
}

/// `spec` with GPU `uuid`'s node given another minor.
fn with_minor(spec: &Spec, uuid: &str, minor: i64) -> Spec {
    let mut stale = spec.clone();
    let dev = stale.devices.iter_mut().find(|d| d.name == uuid).unwrap();
    dev.container_edits.device_nodes[0].minor = minor;
    stale
}

#[test]
fn a_spec_as_generated_gives_what_the_plan_does() {
    let n = node_with_dirs();
    write(&n.dirs[0], "devgate.io-gpu.json", &n.gpu_spec);
    let (names, want) = wanted(&n, &[1, 3]);
    assert_eq!(
        SpecDirs::default().check(&n.dirs, &names, &want).unwrap(),
        ()
    );
}

#[test]
fn a_stale_spec_names_the_device_and_the_numbers() {
    let n = node_with_dirs();
    let gpu = n.inv.gpus[3].clone();
    let stale = with_minor(&n.gpu_spec, &gpu.uuid, i64::from(n.inv.gpus[2].minor));
    write(&n.dirs[0], "devgate.io-gpu.json", &stale);
    let (names, want) = wanted(&n, &[1, 3]);
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert_eq!(err.device_name(), Some(names[1].as_str()));
    let text = err.to_string();
    let nvidia = n.inv.nvidia_majors.nvidia.unwrap();
    let want_text = format!(
        "is stale for {}: it gives /dev/nvidia{} as c {nvidia}:{} mode 666 rw, the plan c {nvidia}:{} mode 666 rw",
        names[1], gpu.minor, n.inv.gpus[2].minor, gpu.minor
    );
    assert!(text.contains(&want_text), "{text}");

    // A spec without the spec-wide nodes leaves the plan's out.
    let mut bare = n.gpu_spec.clone();
    bare.container_edits.device_nodes.clear();
    write(&n.dirs[0], "devgate.io-gpu.json", &bare);
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("/dev/nvidiactl, which no device named gives"),
        "{err}"
    );
}

#[test]
fn a_later_directory_wins_and_two_specs_of_one_directory_resolve_to_neither() {
    let n = node_with_dirs();
    let (names, want) = wanted(&n, &[0]);
    let stale = with_minor(&n.gpu_spec, &n.inv.gpus[0].uuid, 99);
    // Stale in the lower directory, fresh in the higher: the runtime takes
    // the higher's.
    write(&n.dirs[0], "devgate.io-gpu.json", &stale);
    write(&n.dirs[1], "devgate.io-gpu.json", &n.gpu_spec);
    SpecDirs::default().check(&n.dirs, &names, &want).unwrap();
    // The other way round it gives the stale one.
    write(&n.dirs[0], "devgate.io-gpu.json", &n.gpu_spec);
    write(&n.dirs[1], "devgate.io-gpu.json", &stale);
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert!(matches!(err, CdiError::Stale { .. }), "{err}");
    // Two in one directory.
    write(&n.dirs[1], "devgate.io-gpu.json", &n.gpu_spec);
    write(&n.dirs[1], "copy.json", &n.gpu_spec);
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert!(matches!(err, CdiError::Conflict { .. }), "{err}");
}

#[test]
fn no_spec_or_one_that_cannot_be_read_fails() {
    let n = node_with_dirs();
    let (names, want) = wanted(&n, &[0]);
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert!(matches!(err, CdiError::Unresolved { .. }), "{err}");
    let yaml = "cdiVersion: 0.6.0\nkind: devgate.io/gpu\ndevices: []\n";
    std::fs::write(n.dirs[0].join("gpu.yaml"), yaml).unwrap();
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert!(matches!(err, CdiError::Unchecked { .. }), "{err}");
    assert!(err.to_string().contains("gpu.yaml"), "{err}");
    // One converted to YAML by hand is read as YAML.
    let converted = serde_yaml_ng::to_string(&n.gpu_spec).unwrap();
    std::fs::write(n.dirs[0].join("gpu.yaml"), converted).unwrap();
    SpecDirs::default().check(&n.dirs, &names, &want).unwrap();
    // Other vendors' specs are not devgate's to read.
    std::fs::remove_file(n.dirs[0].join("gpu.yaml")).unwrap();
    std::fs::write(n.dirs[0].join("vendor.yaml"), "kind: vendor.com/x\n").unwrap();
    write(&n.dirs[0], "devgate.io-gpu.json", &n.gpu_spec);
    SpecDirs::default().check(&n.dirs, &names, &want).unwrap();
}

/// The specs are kept between creations and read again once a file changes,
/// in place or by a rename into the directory.
#[test]
fn a_spec_changed_after_a_check_is_read_again() {
    let n = node_with_dirs();
    let (names, want) = wanted(&n, &[0]);
    let specs = SpecDirs::default();
    let path = n.dirs[0].join("devgate.io-gpu.json");
    write(&n.dirs[0], "devgate.io-gpu.json", &n.gpu_spec);
    specs.check(&n.dirs, &names, &want).unwrap();
    let stale = with_minor(&n.gpu_spec, &n.inv.gpus[0].uuid, 99);
    // In place: same inode, other size or mtime.
    std::fs::write(&path, serde_json::to_vec_pretty(&stale).unwrap()).unwrap();
    assert!(specs.check(&n.dirs, &names, &want).is_err());
    // Replaced by a rename, as devgate cdi generate writes.
    let tmp = n.dirs[0].join(".tmp");
    std::fs::write(&tmp, serde_json::to_vec(&n.gpu_spec).unwrap()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    specs.check(&n.dirs, &names, &want).unwrap();
}

/// What the runtime may read and this cannot (a link it cannot follow, a
/// spec CDI would drop as invalid, too many files) leaves no device trusted.
#[test]
fn a_spec_file_that_cannot_be_checked_fails_every_device() {
    let n = node_with_dirs();
    let (names, want) = wanted(&n, &[0]);
    write(&n.dirs[1], "devgate.io-gpu.json", &n.gpu_spec);
    let link = n.dirs[0].join("elsewhere.json");
    std::os::unix::fs::symlink("/nonexistent/host-only.json", &link).unwrap();
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert!(
        matches!(err, CdiError::Unchecked { ref path, .. } if *path == link),
        "{err}"
    );
    std::fs::remove_file(&link).unwrap();

    let mut invalid = n.gpu_spec.clone();
    invalid.cdi_version = "9.9.9".into();
    write(&n.dirs[0], "old.json", &invalid);
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert!(err.to_string().contains("unknown cdiVersion"), "{err}");
    std::fs::remove_file(n.dirs[0].join("old.json")).unwrap();

    for i in 0..=1024 {
        std::fs::write(n.dirs[0].join(format!("x{i}.json")), "{}").unwrap();
    }
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert!(
        err.to_string().contains("more than 1024 spec files"),
        "{err}"
    );
}

/// A node the plan gives and no spec does is said of a device of its kind.
#[test]
fn a_node_missing_from_the_specs_is_said_of_its_kind() {
    let n = node_with_dirs();
    let g = generate(
        &n.inv,
        &Config::default(),
        &[Class::Rdma],
        DEFAULT_CDI_VERSION,
    )
    .unwrap();
    let mut rdma = g.specs.into_iter().next().unwrap().1;
    write(&n.dirs[0], "devgate.io-gpu.json", &n.gpu_spec);
    let pf = rdma.devices[0].clone();
    let (mut names, mut want) = wanted(&n, &[0]);
    names.push(Class::Rdma.qualified(&pf.name));
    want.extend(pf.container_edits.device_nodes.iter().cloned());
    want.extend(rdma.container_edits.device_nodes.iter().cloned());
    let rdma_cm = rdma.container_edits.device_nodes.clone();
    assert_eq!(rdma_cm[0].path, "/dev/infiniband/rdma_cm");
    rdma.container_edits.device_nodes.clear();
    write(&n.dirs[0], "devgate.io-rdma.json", &rdma);
    let err = SpecDirs::default()
        .check(&n.dirs, &names, &want)
        .unwrap_err();
    assert_eq!(err.device_name(), Some(names[1].as_str()), "{err}");
    assert!(err.to_string().contains("devgate.io-rdma.json"), "{err}");
}

/// A rewrite of the same size in the same clock tick keeps size and mtime:
/// a spec changed that recently is read again whatever its stamp says.
#[test]
fn a_same_size_rewrite_is_read_again() {
    let n = node_with_dirs();
    let (names, want) = wanted(&n, &[0]);
    let specs = SpecDirs::default();
    let uuid = n.inv.gpus[0].uuid.clone();
    let path = n.dirs[0].join("devgate.io-gpu.json");
    // Minors 98 and 99 print the same width: the same size.
    write(
        &n.dirs[0],
        "devgate.io-gpu.json",
        &with_minor(&n.gpu_spec, &uuid, 98),
    );
    assert!(specs.check(&n.dirs, &names, &want).is_err());
    let before = std::fs::metadata(&path).unwrap();
    write(
        &n.dirs[0],
        "devgate.io-gpu.json",
        &with_minor(&n.gpu_spec, &uuid, 99),
    );
    // The same size and, as within one clock tick, the same mtime.
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(before.modified().unwrap()).unwrap();
    let after = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (after.len(), after.modified().unwrap()),
        (before.len(), before.modified().unwrap())
    );
    let err = specs.check(&n.dirs, &names, &want).unwrap_err();
    assert!(err.to_string().contains(":99 mode"), "{err}");
}
