//! The hook's cgroup v2 device rules against the real kernel (needs root and a
//! cgroup2 hierarchy: /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified
//! on a hybrid one such as the CI host).
//!
//! A cgroup gets a deny-most device program like runc's; processes in it are
//! refused a 195:N node with EPERM. After the hook's v2 code the granted node
//! opens as far as the driver (ENXIO: no driver behind major 195 here), an
//! ungranted one is still EPERM, and /dev/null, allowed before, still opens.
//! Probes also join the root of the v1 devices hierarchy of a hybrid host, which allows
//! everything, so only the BPF program decides.

#[path = "common/cgroup_join.rs"]
mod cgroup_join;

use std::ffi::CString;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use cgroup_join::join;
use devgate::hook::cgroup_v2::{self, BpfSys, SysBpf};
use devgate::plan::{DeviceKind, DeviceNode};
use nix::errno::Errno;
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// The cgroup2 hierarchy: the whole of /sys/fs/cgroup on a unified host, its
/// `unified` directory on a hybrid one. Asserts root and that there is one.
fn v2_root() -> PathBuf {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the cgroup tests need root (they make cgroups and attach device programs)"
    );
    let fs = Path::new(CGROUP_FS);
    if fs.join("cgroup.controllers").exists() {
        return fs.to_path_buf();
    }
    let unified = fs.join("unified");
    assert!(
        unified.join("cgroup.controllers").exists(),
        "no cgroup2 hierarchy at {CGROUP_FS} or {}",
        unified.display()
    );
    unified
}

/// The v1 devices hierarchy of a hybrid host, whose root allows every device.
fn v1_devices_root() -> Option<PathBuf> {
    let root = Path::new(CGROUP_FS).join("devices");
    root.join("cgroup.procs").exists().then_some(root)
}
const RUNTIME_SPEC: &str =
    r#"{"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]}}}"#;

/// A cgroup removed (with its process) on drop.
struct Cgroup {
    dir: PathBuf,
    child: Option<Child>,
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn procs(cg: &Path) -> Vec<CString> {
    std::iter::once(cg.join("cgroup.procs"))
        .chain(v1_devices_root().map(|root| root.join("cgroup.procs")))
        .map(|p| CString::new(p.as_os_str().as_encoded_bytes()).unwrap())
        .collect()
}

/// Opens `node` from a new process in `cg`; the errno, or None when it opened.
fn probe(cg: &Path, node: &Path, flags: libc::c_int) -> Option<Errno> {
    let procs = procs(cg);
    let path = CString::new(node.as_os_str().as_encoded_bytes()).unwrap();
    let mut cmd = Command::new("/bin/true");
    // SAFETY: the closure only makes raw syscalls on prepared buffers.
    unsafe {
        cmd.pre_exec(move || {
            join(&procs)?;
            let fd = libc::open(path.as_ptr(), flags | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            Ok(())
        });
    }
    match cmd.spawn() {
        Ok(mut child) => {
            assert!(child.wait().unwrap().success());
            None
        }
        Err(e) => Some(Errno::from_raw(e.raw_os_error().expect("an os error"))),
    }
}

fn node(minor: u32) -> DeviceNode {
    DeviceNode {
        path: format!("/dev/nvidia{minor}"),
        kind: DeviceKind::Char,
        major: 195,
        minor,
        file_mode: 0o666,
    }
}

#[test]
fn the_hook_grants_exactly_the_planned_node_on_cgroup_v2() {
    let dir = v2_root().join(format!("devgate-test-{}", std::process::id()));
    std::fs::create_dir(&dir).unwrap();
    let mut cg = Cgroup {
        dir: dir.clone(),
        child: None,
    };

    // runc's program: the spec's deny-all plus its defaults, ALLOW_MULTI.
    let spec: cgroup_v2::Spec = serde_json::from_str(RUNTIME_SPEC).unwrap();
    let insns = cgroup_v2::generate(&cgroup_v2::ruleset(&spec, &[]).unwrap()).unwrap();
    let mut bpf = SysBpf;
    let runc_prog = bpf.load(&insns, cgroup_v2::LICENSE).unwrap();
    let cg_fd = std::fs::File::open(&dir).unwrap();
    bpf.attach(cg_fd.as_fd(), runc_prog.as_fd(), None).unwrap();
    let before = bpf.query(cg_fd.as_fd()).unwrap();
    assert_eq!(before.len(), 1);

    // The container's init, for the hook to find the cgroup by.
    let join_procs = procs(&dir);
    let mut sleep = Command::new("sleep");
    sleep.arg("1000");
    // SAFETY: the closure only makes raw syscalls on prepared buffers.
    unsafe { sleep.pre_exec(move || join(&join_procs)) };
    let child = sleep.spawn().unwrap();
    let pid = child.id();
    cg.child = Some(child);

    let nodes = tempfile::tempdir().unwrap();
    let granted = nodes.path().join("nvidia250");
    let other = nodes.path().join("nvidia251");
    for (p, minor) in [(&granted, 250), (&other, 251)] {
        mknod(
            p,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(195, minor),
        )
        .unwrap();
    }
    let null = Path::new("/dev/null");
    assert_eq!(probe(&dir, &granted, libc::O_RDONLY), Some(Errno::EPERM));
    assert_eq!(probe(&dir, &other, libc::O_RDONLY), Some(Errno::EPERM));
    assert_eq!(probe(&dir, null, libc::O_RDWR), None);

    let bundle = tempfile::tempdir().unwrap();
    // The rules as the hook reads them: from the bundle's config.json.
    let config = RUNTIME_SPEC.replacen('{', r#"{"root":{"path":"rootfs"},"#, 1);
    std::fs::write(bundle.path().join("config.json"), config).unwrap();
    let proc_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let rel = proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 entry");
    let found = cgroup_v2::cgroup_dir(&v2_root(), rel).unwrap();
    assert_eq!(found, dir);
    let spec = devgate::hook::bundle::Bundle::read(bundle.path())
        .unwrap()
        .spec;
    let replaced = cgroup_v2::allow(&mut bpf, &found, &spec, &[node(250)]).unwrap();
    assert_eq!(replaced.old, 1);

    let after = bpf.query(cg_fd.as_fd()).unwrap();
    assert_eq!(
        after.len(),
        1,
        "the runtime's program was replaced, not joined"
    );
    assert_ne!(after, before);
    assert_eq!(probe(&dir, &granted, libc::O_RDWR), Some(Errno::ENXIO));
    assert_eq!(probe(&dir, &other, libc::O_RDONLY), Some(Errno::EPERM));
    assert_eq!(probe(&dir, null, libc::O_RDWR), None);
    drop(cg);
}

/// crun with the systemd driver: the device program sits on the container's
/// scope and its init in `<scope>/container`. The kernel runs the scope's
/// program too, so the grant must replace it there, not add one below.
#[test]
fn the_hook_grants_through_a_program_on_the_containers_parent_cgroup() {
    let scope = v2_root().join(format!("devgate-test-scope-{}", std::process::id()));
    std::fs::create_dir(&scope).unwrap();
    let _scope = Cgroup {
        dir: scope.clone(),
        child: None,
    };
    let leaf = scope.join("container");
    std::fs::create_dir(&leaf).unwrap();
    let mut cg = Cgroup {
        dir: leaf.clone(),
        child: None,
    };
    let spec: cgroup_v2::Spec = serde_json::from_str(RUNTIME_SPEC).unwrap();
    let insns = cgroup_v2::generate(&cgroup_v2::ruleset(&spec, &[]).unwrap()).unwrap();
    let mut bpf = SysBpf;
    let crun_prog = bpf.load(&insns, cgroup_v2::LICENSE).unwrap();
    let scope_fd = std::fs::File::open(&scope).unwrap();
    bpf.attach(scope_fd.as_fd(), crun_prog.as_fd(), None)
        .unwrap();
    let join_procs = procs(&leaf);
    let mut sleep = Command::new("sleep");
    sleep.arg("1000");
    // SAFETY: the closure only makes raw syscalls on prepared buffers.
    unsafe { sleep.pre_exec(move || join(&join_procs)) };
    cg.child = Some(sleep.spawn().unwrap());

    let nodes = tempfile::tempdir().unwrap();
    let granted = nodes.path().join("nvidia252");
    mknod(
        &granted,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(195, 252),
    )
    .unwrap();
    assert_eq!(probe(&leaf, &granted, libc::O_RDONLY), Some(Errno::EPERM));
    let replaced = cgroup_v2::allow_in(&mut bpf, &scope, &leaf, &spec, &[node(252)]).unwrap();
    assert_eq!(replaced.len(), 1, "{replaced:?}");
    assert_eq!(replaced[0].cgroup, scope);
    let leaf_fd = std::fs::File::open(&leaf).unwrap();
    assert!(
        bpf.query(leaf_fd.as_fd()).unwrap().is_empty(),
        "none added below"
    );
    assert_eq!(probe(&leaf, &granted, libc::O_RDWR), Some(Errno::ENXIO));
    assert_eq!(probe(&leaf, Path::new("/dev/null"), libc::O_RDWR), None);
    drop(cg);
}

/// The unified hierarchy is told by its filesystem type, as runtimes tell it;
/// the v1 devices hierarchy beside it is not one.
#[test]
fn the_unified_hierarchy_is_told_by_statfs() {
    use devgate::hook::cgroup::is_unified;
    assert!(is_unified(&v2_root()));
    match v1_devices_root() {
        Some(v1) => assert!(!is_unified(&v1)),
        // A unified host has no v1 hierarchy to tell apart: a procfs is not one.
        None => assert!(!is_unified(Path::new("/proc"))),
    }
}
