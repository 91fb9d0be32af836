use std::fs;
use std::os::unix::fs::symlink;

use super::*;
use crate::inventory::hostdir::MAX_HELD;

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    fs::create_dir_all(root.join("sys/devices/pci0000:00/0000:00:01.0")).expect("mkdir");
    fs::write(
        root.join("sys/devices/pci0000:00/0000:00:01.0/class"),
        "0x060400\n",
    )
    .expect("write");
    fs::create_dir_all(root.join("sys/bus/pci/devices")).expect("mkdir");
    dir
}

/// Every check runs with and without `openat2`.
fn hosts(root: &Path) -> [HostFs; 2] {
    [HostFs::new(root), HostFs::new(root).without_openat2()]
}

#[test]
fn relative_links_resolve_like_the_kernel() {
    let dir = tree();
    let link = dir.path().join("sys/bus/pci/devices/0000:00:01.0");
    symlink("../../../devices/pci0000:00/0000:00:01.0", &link).expect("symlink");
    for host in hosts(dir.path()) {
        let real = host
            .resolve("sys/bus/pci/devices/0000:00:01.0")
            .expect("resolve");
        assert_eq!(
            real.as_path(),
            Path::new("sys/devices/pci0000:00/0000:00:01.0")
        );
        assert_eq!(host.read_in(&real, "class").expect("read"), "0x060400\n");
        assert_eq!(real.name(), Some("0000:00:01.0"));
        let via_link = host
            .read("sys/bus/pci/devices/0000:00:01.0/class")
            .expect("read");
        assert_eq!(via_link, "0x060400\n");
    }
}

#[test]
fn absolute_links_stay_inside_the_root() {
    let dir = tree();
    let link = dir.path().join("sys/bus/pci/devices/0000:00:01.0");
    symlink("/sys/devices/pci0000:00/0000:00:01.0", &link).expect("symlink");
    // A leaf link with an absolute target, and `..` past the root.
    symlink(
        "/sys/devices/pci0000:00/0000:00:01.0/class",
        dir.path().join("abs-class"),
    )
    .expect("symlink");
    symlink("../../../../../sys", dir.path().join("sys/bus/up")).expect("symlink");
    // Outside the root, `/etc/hostname` exists; inside it does not.
    symlink("/etc/hostname", dir.path().join("escape")).expect("symlink");
    for host in hosts(dir.path()) {
        let read = host
            .read("sys/bus/pci/devices/0000:00:01.0/class")
            .expect("read");
        assert_eq!(read, "0x060400\n");
        assert_eq!(host.read("abs-class").expect("read"), "0x060400\n");
        let up = host.resolve("sys/bus/up").expect("resolve");
        assert_eq!(up.as_path(), Path::new("sys"));
        assert_eq!(
            host.read("sys/bus/up/bus/up/devices/pci0000:00/0000:00:01.0/class")
                .ok()
                .as_deref(),
            Some("0x060400\n")
        );
        assert!(host.read("escape").is_err_and(|e| e.is_not_found()));
    }
}

#[test]
fn loops_dangling_links_and_odd_files_are_errors() {
    let dir = tree();
    let root = dir.path();
    symlink("b", root.join("a")).expect("symlink");
    symlink("a", root.join("b")).expect("symlink");
    symlink("nowhere", root.join("dangling")).expect("symlink");
    let fifo = std::ffi::CString::new(root.join("fifo").into_os_string().into_encoded_bytes())
        .expect("cstring");
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    fs::write(root.join("big"), vec![b'x'; MAX_FILE_BYTES as usize + 1]).expect("write");
    fs::write(root.join("bin"), [0xff, 0xfe]).expect("write");
    for host in hosts(root) {
        assert!(matches!(
            host.read("a/x"),
            Err(InventoryError::SymlinkLoop { .. })
        ));
        assert!(matches!(
            host.read("a"),
            Err(InventoryError::SymlinkLoop { .. })
        ));
        assert!(matches!(
            host.resolve("a"),
            Err(InventoryError::SymlinkLoop { .. })
        ));
        assert!(host.read("dangling").is_err_and(|e| e.is_not_found()));
        // A FIFO without a writer reads as empty instead of blocking.
        assert_eq!(host.read("fifo").expect("fifo"), "");
        assert!(matches!(host.read("sys"), Err(InventoryError::Io { .. })));
        assert!(matches!(
            host.read("big"),
            Err(InventoryError::TooLarge { .. })
        ));
        assert!(matches!(
            host.read("bin"),
            Err(InventoryError::NotUtf8 { .. })
        ));
        assert!(host.read("big/x").is_err());
        assert!(host.list_optional("missing").expect("list").is_empty());
        assert!(host.list_optional("big").is_err());
    }
}

#[test]
fn link_names_and_listing() {
    let dir = tree();
    let dev = dir.path().join("sys/devices/pci0000:00/0000:00:01.0");
    symlink("../../../bus/pci/drivers/pcieport", dev.join("driver")).expect("symlink");
    for host in hosts(dir.path()) {
        let real = host
            .resolve("sys/devices/pci0000:00/0000:00:01.0")
            .expect("resolve");
        assert_eq!(
            host.link_name_in(&real, "driver").expect("link"),
            "pcieport"
        );
        assert!(host.exists_in(&real, "driver"));
        assert!(!host.exists_in(&real, "physfn"));
        assert_eq!(host.list_in(&real, "").expect("list"), ["class", "driver"]);
    }
}

#[test]
fn a_missing_root_is_an_error_not_a_panic() {
    for host in hosts(Path::new("/nonexistent/devgate-root")) {
        assert!(host.read("proc/devices").is_err_and(|e| e.is_not_found()));
        assert!(host
            .list_optional("sys/class/infiniband")
            .expect("empty")
            .is_empty());
    }
}

/// A directory held open reads its own files by plain name only: a name with a
/// separator or a dot name is refused, and a slot that is a symlink (here to a
/// file outside the root) is not followed.
#[test]
fn a_held_directory_reads_only_its_own_files() {
    let dir = tree();
    let types = dir
        .path()
        .join("sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types");
    fs::create_dir_all(&types).expect("mkdir");
    fs::write(types.join("0"), "IB/RoCE v1\n").expect("write");
    symlink("/etc/hostname", types.join("1")).expect("symlink");
    for host in hosts(dir.path()) {
        let held = host
            .open_dir("sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types")
            .expect("open");
        assert_eq!(held.list().expect("list"), ["0", "1"]);
        assert_eq!(held.reread("0").expect("read"), "IB/RoCE v1\n");
        assert!(
            held.reread("1").is_err(),
            "a symlinked slot is not followed"
        );
        for bad in ["", ".", "..", "../types/0", "/etc/hostname"] {
            assert!(held.reread(bad).is_err(), "{bad:?} refused");
        }
        assert!(host
            .open_dir("sys/class/infiniband/mlx5_0/ports/9")
            .is_err());
    }
}

/// A file read through a held directory stays open and is read again from the
/// start: an edit in place shows at once; a file replaced by another shows once
/// the held ones are forgotten; a file removed is read by name, and is gone.
#[test]
fn held_files_are_read_again_from_the_start() {
    let dir = tree();
    let types = dir.path().join("sys/types");
    fs::create_dir_all(&types).expect("mkdir");
    for i in 0..12 {
        fs::write(types.join(i.to_string()), format!("type {i}\n")).expect("write");
    }
    let held = HostFs::new(dir.path()).open_dir("sys/types").expect("open");
    for i in 0..12 {
        assert_eq!(
            held.reread(&i.to_string()).expect("read"),
            format!("type {i}\n")
        );
    }
    assert_eq!(held.held_count(), MAX_HELD, "at most {MAX_HELD} kept open");

    fs::write(types.join("0"), "RoCE v2\n").expect("edit in place");
    assert_eq!(held.reread("0").expect("read"), "RoCE v2\n");

    fs::write(types.join("new"), "IB/RoCE v1\n").expect("write");
    fs::rename(types.join("new"), types.join("1")).expect("replace");
    assert_eq!(held.reread("1").expect("read"), "type 1\n", "the held file");
    held.forget_held();
    assert_eq!(held.reread("1").expect("read"), "IB/RoCE v1\n");

    fs::remove_file(types.join("2")).expect("remove");
    held.forget_held();
    assert!(held.reread("2").is_err_and(|e| e.is_not_found()));
}
