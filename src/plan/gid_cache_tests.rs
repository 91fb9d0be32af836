use std::fs;
use std::path::Path;

use super::*;

const V4: &str = "0000:0000:0000:0000:0000:ffff:0a00:0001";
const LINK_LOCAL: &str = "fe80:0000:0000:0000:ba3f:d2ff:fe19:0001";

/// Writes `ibdev`'s port 1 table as sysfs lays it out: the class entry a link
/// into `devices/`, a type and a GID file per slot.
fn table(root: &Path, ibdev: &str, slots: &[(u32, &str, &str)]) {
    let dev = root
        .join("sys/devices/pci0000:00/0000:00:01.0/infiniband")
        .join(ibdev);
    let _ = fs::remove_dir_all(&dev);
    let port = dev.join("ports/1");
    fs::create_dir_all(port.join("gid_attrs/types")).expect("mkdir");
    fs::create_dir_all(port.join("gids")).expect("mkdir");
    for (i, gid_type, gid) in slots {
        fs::write(
            port.join(format!("gid_attrs/types/{i}")),
            format!("{gid_type}\n"),
        )
        .expect("type");
        fs::write(port.join(format!("gids/{i}")), format!("{gid}\n")).expect("gid");
    }
    let class = root.join("sys/class/infiniband");
    fs::create_dir_all(&class).expect("mkdir");
    let link = class.join(ibdev);
    if fs::symlink_metadata(&link).is_err() {
        let target = format!("../../devices/pci0000:00/0000:00:01.0/infiniband/{ibdev}");
        std::os::unix::fs::symlink(target, link).expect("symlink");
    }
}

fn with_v4_at(index: u32) -> Vec<(u32, &'static str, &'static str)> {
    vec![
        (0, "IB/RoCE v1", LINK_LOCAL),
        (1, "RoCE v2", LINK_LOCAL),
        (index - 1, "IB/RoCE v1", V4),
        (index, "RoCE v2", V4),
    ]
}

/// A table stays open across lookups, its slots listed and read afresh at each; a table
/// whose directories were removed and made again (the device registered anew)
/// is opened again; clearing closes all.
#[test]
fn tables_stay_open_and_are_opened_again_once_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    table(root, "mlx5_0", &with_v4_at(3));
    let cache = GidCache::new(root);
    assert_eq!(cache.roce_v2_index("mlx5_0", 1, GidFamily::Ipv4), Some(3));
    assert_eq!(cache.len(), 1);

    // A slot rewritten in place (the address went away) is seen at once.
    let port = root.join("sys/devices/pci0000:00/0000:00:01.0/infiniband/mlx5_0/ports/1");
    fs::write(port.join("gids/3"), format!("{LINK_LOCAL}\n")).expect("rewrite");
    assert_eq!(cache.roce_v2_index("mlx5_0", 1, GidFamily::Ipv4), None);
    assert_eq!(cache.len(), 1, "still open");

    // A slot's GID file replaced by another (written aside, renamed over it).
    fs::write(port.join("gids/new"), format!("{V4}\n")).expect("write aside");
    fs::rename(port.join("gids/new"), port.join("gids/3")).expect("replace");
    assert_eq!(cache.roce_v2_index("mlx5_0", 1, GidFamily::Ipv4), Some(3));
    fs::write(port.join("gids/3"), format!("{LINK_LOCAL}\n")).expect("rewrite");
    assert_eq!(cache.roce_v2_index("mlx5_0", 1, GidFamily::Ipv4), None);

    // Slots added to the directory held open (a hand-made tree) are listed.
    fs::write(port.join("gid_attrs/types/7"), "RoCE v2\n").expect("add type");
    fs::write(port.join("gids/7"), format!("{V4}\n")).expect("add gid");
    assert_eq!(cache.roce_v2_index("mlx5_0", 1, GidFamily::Ipv4), Some(7));
    assert_eq!(cache.len(), 1, "still open");

    // The device's directories removed and made again: the held ones are gone.
    table(root, "mlx5_0", &with_v4_at(5));
    assert_eq!(cache.roce_v2_index("mlx5_0", 1, GidFamily::Ipv4), Some(5));
    assert_eq!(cache.len(), 1);

    cache.clear();
    assert_eq!(cache.len(), 0);
    assert_eq!(cache.roce_v2_index("mlx5_0", 1, GidFamily::Ipv4), Some(5));
}

/// Ports without a table, and names that are not plain, are never kept; the
/// number of tables held open is bounded.
#[test]
fn missing_tables_are_not_kept_and_open_tables_are_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let cache = GidCache::new(root);
    assert_eq!(cache.roce_v2_index("mlx5_0", 1, GidFamily::Ipv4), None);
    assert_eq!(cache.roce_v2_index("../mlx5_0", 1, GidFamily::Ipv4), None);
    assert_eq!(cache.len(), 0);
    for n in 0..(MAX_PORTS + 3) {
        table(root, &format!("mlx5_{n}"), &with_v4_at(3));
    }
    for n in 0..(MAX_PORTS + 3) {
        let ibdev = format!("mlx5_{n}");
        assert_eq!(
            cache.roce_v2_index(&ibdev, 1, GidFamily::Ipv4),
            Some(3),
            "{ibdev}"
        );
        assert!(cache.len() <= MAX_PORTS);
    }
}
