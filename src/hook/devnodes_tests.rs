//! Device nodes in a scratch rootfs: made with the planned numbers and mode,
//! idempotent, and never outside the rootfs whatever symlinks it holds. mknod
//! needs root, as in CI.

use std::os::fd::AsFd;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};

use super::super::inroot::tests::with_openat2_refused;
use super::*;

/// Both resolvers: the kernel's `openat2` and the walk kernels before 5.6 get.
const RESOLVERS: [Resolver; 2] = [Resolver::Kernel, Resolver::Walk];

fn node(path: &str, major: u32, minor: u32) -> DeviceNode {
    DeviceNode::char(path, major, minor, 0o666)
}

fn nodes() -> Vec<DeviceNode> {
    vec![
        node("/dev/nvidia3", 195, 3),
        node("/dev/nvidiactl", 195, 255),
        node("/dev/infiniband/uverbs3", 231, 195),
    ]
}

fn rootfs() -> (tempfile::TempDir, OwnedFd) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("dev")).unwrap();
    let fd = File::open(dir.path()).unwrap().into();
    (dir, fd)
}

fn assert_node(path: &Path, major: u32, minor: u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    assert!(meta.file_type().is_char_device(), "{path:?}");
    assert_eq!(meta.rdev(), libc::makedev(major, minor), "{path:?}");
    assert_eq!(meta.permissions().mode() & 0o777, 0o666, "{path:?}");
}

#[test]
fn nodes_are_made_with_their_numbers_and_mode_once() {
    let (dir, fd) = rootfs();
    assert_eq!(make_nodes(fd.as_fd(), &nodes()).unwrap(), 3);
    assert_node(&dir.path().join("dev/nvidia3"), 195, 3);
    assert_node(&dir.path().join("dev/nvidiactl"), 195, 255);
    assert_node(&dir.path().join("dev/infiniband/uverbs3"), 231, 195);
    // A second stage finds them in place.
    assert_eq!(make_nodes(fd.as_fd(), &nodes()).unwrap(), 0);
    assert_eq!(make_nodes(fd.as_fd(), &[]).unwrap(), 0);
}

/// A runtime started from a shell with umask 077 (podman) passes it to the
/// hook: the directory made for nodes still opens to every user, as the nodes
/// in it do. The umask is set on a thread with a filesystem context of its
/// own (`unshare(CLONE_FS)`), so that other tests keep theirs.
#[test]
fn a_strict_umask_leaves_the_directories_made_open() {
    let (dir, fd) = rootfs();
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).expect("unshare fs");
        nix::sys::stat::umask(Mode::from_bits_truncate(0o077));
        assert_eq!(make_nodes(fd.as_fd(), &nodes()).unwrap(), 3);
    })
    .join()
    .unwrap();
    let sub = std::fs::metadata(dir.path().join("dev/infiniband")).unwrap();
    assert_eq!(sub.permissions().mode() & 0o777, 0o755);
    assert_node(&dir.path().join("dev/infiniband/uverbs3"), 231, 195);
}

/// A node already there (the host's, bind-mounted with `--device`) keeps its
/// mode: changing it would change the host's node.
#[test]
fn a_node_already_there_keeps_its_mode() {
    let (dir, fd) = rootfs();
    let path = dir.path().join("dev/nvidia3");
    nix::sys::stat::mknod(
        &path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o600),
        libc::makedev(195, 3),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        make_nodes(fd.as_fd(), &[node("/dev/nvidia3", 195, 3)]).unwrap(),
        0
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_different_file_under_the_name_is_refused() {
    let (dir, fd) = rootfs();
    std::fs::write(dir.path().join("dev/nvidia3"), "x").unwrap();
    let e = make_nodes(fd.as_fd(), &nodes()).unwrap_err();
    assert!(matches!(e, NodeError::Occupied { .. }), "{e}");
    let (_dir2, fd2) = rootfs();
    make_nodes(fd2.as_fd(), &[node("/dev/nvidia3", 195, 3)]).unwrap();
    let e = make_nodes(fd2.as_fd(), &[node("/dev/nvidia3", 195, 4)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/dev/nvidia3 already exists in the container and is not char device 195:4"
    );
}

#[test]
fn symlinks_in_the_image_cannot_lead_outside() {
    for resolver in RESOLVERS {
        no_escape(resolver);
    }
}

/// The kernel resolver where `openat2` is refused, as on RHEL 8 (4.18): the
/// public entry points take the walk, make the nodes, and stop the escapes.
#[test]
fn nodes_are_made_where_openat2_is_refused() {
    with_openat2_refused(|| {
        no_escape(Resolver::Kernel);
        let (dir, fd) = rootfs();
        assert_eq!(make_nodes(fd.as_fd(), &nodes()).unwrap(), 3);
        assert_node(&dir.path().join("dev/infiniband/uverbs3"), 231, 195);
        rootfs_in_process_root(Resolver::Kernel);
    });
}

fn no_escape(resolver: Resolver) {
    let make_nodes =
        |fd: BorrowedFd<'_>, nodes: &[DeviceNode]| make_nodes_with(resolver, fd, nodes);
    let outside = tempfile::tempdir().unwrap();
    let out = outside.path().to_str().unwrap().to_string();
    // /dev an absolute link to a host directory: resolved inside the rootfs, where it does not exist.
    let dir = tempfile::tempdir().unwrap();
    symlink(&out, dir.path().join("dev")).unwrap();
    let fd: OwnedFd = File::open(dir.path()).unwrap().into();
    assert!(make_nodes(fd.as_fd(), &nodes()).is_err());
    // /dev/infiniband a relative link climbing out: no symlinks below /dev.
    let (dir, fd) = rootfs();
    symlink(format!("../../..{out}"), dir.path().join("dev/infiniband")).unwrap();
    let e = make_nodes(fd.as_fd(), &[node("/dev/infiniband/uverbs3", 231, 195)]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("open /dev/infiniband in the container"),
        "{e}"
    );
    // A dangling node link pointing out: mknod does not follow it.
    let (dir, fd) = rootfs();
    symlink(format!("{out}/x"), dir.path().join("dev/nvidia3")).unwrap();
    assert!(matches!(
        make_nodes(fd.as_fd(), &[node("/dev/nvidia3", 195, 3)]),
        Err(NodeError::Occupied { .. })
    ));
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

/// A link at the node's name to a host file (what a process sharing the
/// directory could rename there): refused, and the file keeps its mode.
#[test]
fn a_link_under_the_name_is_refused_and_its_target_keeps_its_mode() {
    for resolver in RESOLVERS {
        link_under_the_name(resolver);
    }
}

fn link_under_the_name(resolver: Resolver) {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("shadow");
    std::fs::write(&target, "secret").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (dir, fd) = rootfs();
    symlink(&target, dir.path().join("dev/nvidia3")).unwrap();
    let e = make_nodes_with(resolver, fd.as_fd(), &[node("/dev/nvidia3", 195, 3)]).unwrap_err();
    assert!(matches!(e, NodeError::Occupied { .. }), "{e}");
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

/// `/dev/<sub>` a volume of its own (a hostPath `/dev/infiniband`): nodes
/// already there with the planned numbers are kept, new ones made in it.
#[test]
fn a_subdirectory_that_is_a_mount_takes_its_nodes() {
    let (dir, fd) = rootfs();
    let sub = dir.path().join("dev/infiniband");
    std::fs::create_dir(&sub).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &sub,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .expect("mount a tmpfs (root, as in CI)");
    let made = make_nodes(fd.as_fd(), &[node("/dev/infiniband/uverbs3", 231, 195)]);
    let meta = std::fs::symlink_metadata(sub.join("uverbs3"));
    nix::mount::umount(&sub).unwrap();
    assert_eq!(made.unwrap(), 1);
    assert!(meta.unwrap().file_type().is_char_device());
}

#[test]
fn only_plain_dev_paths_are_accepted() {
    assert_eq!(split("/dev/nvidia0"), Some((None, "nvidia0")));
    assert_eq!(
        split("/dev/infiniband/uverbs1"),
        Some((Some("infiniband"), "uverbs1"))
    );
    for bad in [
        "/dev/",
        "/dev/../etc/passwd",
        "/dev/a/b/c",
        "/etc/x",
        "dev/x",
        "/dev//x",
        "/dev/a b",
        "/dev/./x",
    ] {
        assert_eq!(split(bad), None, "{bad}");
    }
    let (_dir, fd) = rootfs();
    let e = make_nodes(fd.as_fd(), &[node("/dev/../x", 1, 3)]).unwrap_err();
    assert!(matches!(e, NodeError::BadPath { .. }), "{e}");
}

/// The rootfs path itself comes from the bundle (`super::bundle` tests).
#[test]
fn the_rootfs_resolves_in_the_process_root() {
    for resolver in RESOLVERS {
        rootfs_in_process_root(resolver);
    }
}

fn rootfs_in_process_root(resolver: Resolver) {
    // A fake /proc/<pid>/root whose /var/lib is an absolute link: followed inside it.
    let proc = tempfile::tempdir().unwrap();
    let root = proc.path().join("42/root");
    std::fs::create_dir_all(root.join("data/c/merged/dev")).unwrap();
    std::fs::create_dir_all(root.join("var")).unwrap();
    symlink("/data", root.join("var/lib")).unwrap();
    let fd = open_rootfs_with(resolver, proc.path(), 42, Path::new("/var/lib/c/merged")).unwrap();
    make_nodes_with(resolver, fd.as_fd(), &[node("/dev/nvidia0", 195, 0)]).unwrap();
    assert_node(&root.join("data/c/merged/dev/nvidia0"), 195, 0);
    assert!(open_rootfs_with(resolver, proc.path(), 43, Path::new("/x")).is_err());
    // The rootfs path's own links stay inside the process root too.
    symlink("/data", root.join("escape")).unwrap();
    let e =
        open_rootfs_with(resolver, proc.path(), 42, Path::new("/escape/../../etc")).unwrap_err();
    assert!(
        matches!(
            e,
            NodeError::Open {
                source: Errno::ENOENT,
                ..
            }
        ),
        "{e}"
    );
}

/// A process in a user namespace of its own (podman --userns=auto, a pod
/// with hostUsers: false) is refused before any node is made; one in this
/// process's namespace is not.
#[test]
fn a_container_in_its_own_user_namespace_is_refused() {
    let proc_root = Path::new("/proc");
    check_user_ns(proc_root, std::process::id()).unwrap();
    let mut child = std::process::Command::new("unshare")
        .args(["--user", "sleep", "30"])
        .spawn()
        .expect("unshare --user");
    // The namespace exists once unshare has exec'd sleep.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut result = check_user_ns(proc_root, child.id());
    while result.is_ok() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        result = check_user_ns(proc_root, child.id());
    }
    let _ = child.kill();
    let _ = child.wait();
    let e = result.unwrap_err();
    assert!(matches!(e, NodeError::UserNamespace), "{e}");
    assert!(e.to_string().contains("use NRI or CDI"), "{e}");
}
