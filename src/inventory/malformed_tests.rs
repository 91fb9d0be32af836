//! Damaged host roots: discovery returns what it can read and one warning per problem, and
//! never panics.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::*;
use crate::fixture::{Fixture, HostRootBuilder};

fn small() -> (tempfile::TempDir, Fixture) {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = HostRootBuilder::hgx()
        .gpus(2)
        .nics(2)
        .vfs_per_pf(1)
        .intel_rdma(false);
    let fixture = b.build(dir.path()).expect("fixture");
    (dir, fixture)
}

fn has_warning(inv: &Inventory, needle: &str) -> bool {
    inv.warnings.iter().any(|w| w.contains(needle))
}

fn replace_with_link(path: &Path, target: &str) {
    if path.is_dir() && !path.is_symlink() {
        fs::remove_dir_all(path).expect("remove dir");
    } else {
        fs::remove_file(path).expect("remove file");
    }
    symlink(target, path).expect("symlink");
}

/// The GPUs' procfs directories, in bus order.
fn gpu_dirs(root: &Path) -> Vec<PathBuf> {
    let dir = root.join("proc/driver/nvidia/gpus");
    let mut dirs: Vec<PathBuf> = fs::read_dir(dir)
        .expect("gpus")
        .map(|e| e.expect("entry").path())
        .collect();
    dirs.sort();
    dirs
}

/// Sets the value of the `field` line of a GPU's information file.
fn set_info_line(gpu: &Path, field: &str, value: &str) {
    let path = gpu.join("information");
    let text = fs::read_to_string(&path).expect("read");
    let text: Vec<String> = text
        .lines()
        .map(|l| match l.starts_with(&format!("{field}:")) {
            true => format!("{field}: \t {value}"),
            false => l.to_string(),
        })
        .collect();
    fs::write(path, text.join("\n") + "\n").expect("write");
}

/// Each case damages a fresh fixture; the check says what discovery still found, and the
/// needle is a piece of the expected warning.
#[test]
fn damage_yields_warnings() {
    type Damage = fn(&Path, &Fixture);
    type Check = fn(&Inventory) -> bool;
    let cases: Vec<(&str, Damage, Check, &str)> = vec![
        (
            "missing information file",
            |root, _| {
                fs::remove_file(root.join("proc/driver/nvidia/gpus/0000:18:00.0/information"))
                    .expect("rm")
            },
            |inv| inv.gpus.len() == 1,
            "proc/driver/nvidia/gpus/0000:18:00.0/information",
        ),
        (
            "information without a minor",
            |root, _| {
                fs::write(
                    root.join("proc/driver/nvidia/gpus/0000:18:00.0/information"),
                    "Model: X\nGPU UUID: GPU-1\n",
                )
                .expect("write")
            },
            |inv| inv.gpus.len() == 1,
            "\"Device Minor\"",
        ),
        (
            "placeholder uuid of a gpu whose init failed",
            |root, _| {
                let p = root.join("proc/driver/nvidia/gpus/0000:18:00.0/information");
                let text = fs::read_to_string(&p).expect("read");
                let uuid = text
                    .lines()
                    .find_map(|l| l.strip_prefix("GPU UUID:"))
                    .expect("uuid line")
                    .trim()
                    .to_string();
                let text = text.replace(&uuid, "GPU-????????-????-????-????-????????????");
                fs::write(p, text).expect("write");
            },
            |inv| inv.gpus.len() == 1 && inv.gpus[0].bus_id.to_string() != "0000:18:00.0",
            "GPU UUID: unexpected value \"GPU-????????",
        ),
        (
            "two gpus that report one minor",
            |root, _| {
                for gpu in gpu_dirs(root) {
                    set_info_line(&gpu, "Device Minor", "7");
                }
            },
            |inv| inv.gpus.is_empty(),
            "device minor 7 is also the gpu's at",
        ),
        (
            "two gpus that report one uuid",
            |root, _| {
                for gpu in gpu_dirs(root) {
                    set_info_line(&gpu, "GPU UUID", "GPU-8beb1b46-e182-bed9-588e-9531af0df695");
                }
            },
            |inv| inv.gpus.is_empty(),
            "uuid GPU-8beb1b46-e182-bed9-588e-9531af0df695 is also the gpu's at",
        ),
        (
            "a gpu that reports nvidiactl's minor",
            |root, _| set_info_line(&gpu_dirs(root)[0], "Device Minor", "255"),
            |inv| inv.gpus.len() == 1,
            "device minor 255 is a control device's: left out",
        ),
        (
            "bus location disagrees",
            |root, _| {
                let p = root.join("proc/driver/nvidia/gpus/0000:18:00.0/information");
                let text = fs::read_to_string(&p)
                    .expect("read")
                    .replace("0000:18:00.0", "0000:99:00.0");
                fs::write(p, text).expect("write");
            },
            |inv| inv.gpus.len() == 2,
            "bus location",
        ),
        (
            "dangling driver link",
            |root, _| {
                replace_with_link(
                    &root.join("sys/bus/pci/drivers/nvidia/0000:18:00.0"),
                    "../../../../devices/gone",
                )
            },
            |inv| inv.gpus.len() == 1,
            "sys/devices/gone",
        ),
        (
            "symlink loop",
            |root, _| {
                replace_with_link(
                    &root.join("sys/bus/pci/drivers/nvidia/0000:18:00.0"),
                    "0000:18:00.0",
                )
            },
            |inv| inv.gpus.len() == 1,
            "symbolic links",
        ),
        (
            "garbage numa node",
            |root, f| {
                fs::write(
                    root.join("sys/devices")
                        .join(&f.expected().gpus[0].topology.sysfs_path)
                        .join("numa_node"),
                    "lots\n",
                )
                .expect("write")
            },
            |inv| inv.gpus.len() == 2 && inv.gpus[0].topology.numa_node.is_none(),
            "numa_node: unexpected value \"lots\"",
        ),
        (
            "garbage bridge class",
            |root, _| {
                fs::write(
                    root.join("sys/devices/pci0000:15/0000:15:01.0/class"),
                    "bridge\n",
                )
                .expect("write")
            },
            |inv| inv.gpus[0].topology.pci_path.len() == 3,
            "0000:15:01.0/class",
        ),
        (
            "no proc/devices",
            |root, _| fs::remove_file(root.join("proc/devices")).expect("rm"),
            |inv| inv.nvidia_majors == NvidiaMajors::default() && inv.gpus.len() == 2,
            "proc/devices",
        ),
        (
            "proc/devices too large",
            |root, _| fs::write(root.join("proc/devices"), "x".repeat(70_000)).expect("write"),
            |inv| inv.nvidia_majors.nvidia.is_none(),
            "larger than",
        ),
        (
            "garbage port state",
            |root, _| {
                fs::write(
                    root.join("sys/class/infiniband/mlx5_0/ports/1/state"),
                    "active\n",
                )
                .expect("write")
            },
            |inv| {
                inv.rdma[0].rdma.ports.is_empty() && !matches!(inv.rdma[0].health, Health::Healthy)
            },
            "ports/1/state",
        ),
        (
            "garbage dev file",
            |root, _| {
                fs::write(root.join("sys/class/infiniband_verbs/uverbs0/dev"), "231\n")
                    .expect("write")
            },
            |inv| inv.rdma[0].rdma.char_devs.len() == 2,
            "uverbs0/dev",
        ),
        (
            "dangling infiniband class link",
            |root, _| {
                replace_with_link(
                    &root.join("sys/class/infiniband/mlx5_1"),
                    "/sys/devices/none",
                )
            },
            |inv| inv.rdma.len() == 1,
            "sys/devices/none",
        ),
        (
            "no uverbs class",
            |root, _| fs::remove_dir_all(root.join("sys/class/infiniband_verbs")).expect("rm"),
            |inv| inv.rdma.len() == 2 && inv.rdma[0].rdma.char_devs.len() == 2,
            "sys/class/infiniband_verbs",
        ),
        (
            "no rdma_cm",
            |root, _| {
                fs::remove_file(root.join("sys/devices/virtual/misc/rdma_cm/dev")).expect("rm")
            },
            |inv| inv.rdma_cm.is_none(),
            "rdma_cm/dev",
        ),
        (
            "virtfn link lost",
            |root, f| {
                let pf = root
                    .join("sys/devices")
                    .join(&f.expected().rdma[0].topology.sysfs_path);
                fs::remove_file(pf.join("virtfn0")).expect("rm");
            },
            |inv| inv.rdma[0].vfs.is_empty(),
            "is not listed by any PF",
        ),
        (
            "garbage sriov count",
            |root, _| {
                fs::write(
                    root.join("sys/bus/pci/devices/0000:19:00.0/sriov_totalvfs"),
                    "-3\n",
                )
                .expect("write")
            },
            |inv| inv.rdma[0].sriov_total_vfs == 0 && inv.rdma[0].sriov_num_vfs == 1,
            "sriov_totalvfs",
        ),
        (
            "fifo as an attribute",
            |root, _| {
                let p = root.join("sys/class/infiniband/mlx5_0/ports/1/state");
                fs::remove_file(&p).expect("rm");
                let c = std::ffi::CString::new(p.into_os_string().into_encoded_bytes())
                    .expect("cstring");
                // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            },
            |inv| inv.rdma[0].rdma.ports.is_empty(),
            "ports/1/state: unexpected value \"\"",
        ),
    ];
    for (name, damage, check, needle) in cases {
        let (dir, fixture) = small();
        damage(dir.path(), &fixture);
        for inv in [
            discover(fixture.root()),
            discover_without_openat2(fixture.root()),
        ] {
            assert!(check(&inv), "{name}: {inv:#?}");
            assert!(
                has_warning(&inv, needle),
                "{name}: want {needle:?} in {:#?}",
                inv.warnings
            );
        }
    }
}

/// Every file overwritten with garbage, then every link turned into a loop: no panic.
#[test]
fn wholesale_damage_never_panics() {
    let garbage = [
        "",
        "\u{0}\u{0}",
        "-1",
        "4294967296:1\n",
        "0x\n",
        "9: \n",
        "\u{7f}ELF",
        "Key: \n:\n",
    ];
    let (dir, fixture) = small();
    for (i, file) in walk(dir.path()).iter().filter(|p| p.is_file()).enumerate() {
        fs::write(file, garbage[i % garbage.len()]).expect("write");
    }
    let inv = discover(fixture.root());
    assert!(!inv.warnings.is_empty());

    let (dir, fixture) = small();
    for link in walk(dir.path()).iter().filter(|p| p.is_symlink()) {
        let name = link.file_name().map(PathBuf::from).unwrap_or_default();
        replace_with_link(link, &name.to_string_lossy());
    }
    let inv = discover(fixture.root());
    assert!(inv.gpus.is_empty() && inv.rdma.is_empty());
    assert!(!inv.warnings.is_empty());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        out.push(path.clone());
        if is_dir {
            out.extend(walk(&path));
        }
    }
    out
}
