//! The walk against the kernel's own resolution, case by case on one tree,
//! and the fallback taken where `openat2` is refused.

use std::fs::File;
use std::os::unix::fs::{symlink, MetadataExt};

use super::*;

/// Runs `f` on a thread where `openat2` fails with ENOSYS, as on a kernel
/// before 5.6: a seccomp filter on that thread alone (no `TSYNC`), so other
/// tests keep theirs.
pub(in crate::hook) fn with_openat2_refused<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            refuse_openat2();
            f()
        })
        .join()
        .unwrap()
    })
}

fn refuse_openat2() {
    // seccomp_data.nr is at offset 0 (include/uapi/linux/seccomp.h).
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let program = [
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_openat2 as u32,
        },
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: plain prctl calls; `prog` outlives them and the kernel copies the filter.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        let set = libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        );
        assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    }
    let how = OpenHow::new().flags(OFlag::O_PATH);
    assert_eq!(openat2(libc::AT_FDCWD, "/", how), Err(Errno::ENOSYS));
}

/// root/
///   a/b/            dirs
///   f               a file
///   abs -> /a       absolute: from the root
///   up -> ../../../../a/b     climbs past the root, which stops it
///   a/rel -> b      relative to the link's own directory
///   a/back -> ../a/b
///   out -> <a directory outside>   absolute, so looked for inside
///   loop1 -> loop2, loop2 -> loop1
///   tofile -> f
fn tree() -> (tempfile::TempDir, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("a/b")).unwrap();
    std::fs::write(r.join("f"), "").unwrap();
    symlink("/a", r.join("abs")).unwrap();
    symlink("../../../../a/b", r.join("up")).unwrap();
    symlink("b", r.join("a/rel")).unwrap();
    symlink("../a/b", r.join("a/back")).unwrap();
    symlink(outside.path(), r.join("out")).unwrap();
    symlink("loop2", r.join("loop1")).unwrap();
    symlink("loop1", r.join("loop2")).unwrap();
    symlink("f", r.join("tofile")).unwrap();
    (root, outside)
}

/// The inode a resolution ended at, or its errno.
fn outcome(resolver: Resolver, root: &File, path: &str) -> Result<u64, Errno> {
    let fd = open_dir_in_root(resolver, root.as_fd(), Path::new(path))?;
    Ok(fstat(fd.as_raw_fd()).unwrap().st_ino)
}

#[test]
fn the_walk_resolves_as_the_kernel_does() {
    let (root, _outside) = tree();
    let r = root.path();
    let ino = |p: &str| std::fs::metadata(r.join(p)).unwrap().ino();
    let dir = File::open(r).unwrap();
    let table: [(&str, Result<u64, Errno>); 17] = [
        ("", Ok(ino(""))),
        ("a/b", Ok(ino("a/b"))),
        ("/a/b", Ok(ino("a/b"))),
        ("a/./b/", Ok(ino("a/b"))),
        ("abs/b", Ok(ino("a/b"))),
        ("up", Ok(ino("a/b"))),
        ("a/rel", Ok(ino("a/b"))),
        ("a/back", Ok(ino("a/b"))),
        ("../../a", Ok(ino("a"))),
        ("a/b/../../..", Ok(ino(""))),
        ("out", Err(Errno::ENOENT)),
        ("missing/a", Err(Errno::ENOENT)),
        ("loop1", Err(Errno::ELOOP)),
        ("f", Err(Errno::ENOTDIR)),
        ("f/a", Err(Errno::ENOTDIR)),
        ("tofile", Err(Errno::ENOTDIR)),
        ("a/rel/../rel", Ok(ino("a/b"))),
    ];
    for (path, want) in table {
        assert_eq!(outcome(Resolver::Walk, &dir, path), want, "walk {path:?}");
        assert_eq!(
            outcome(Resolver::Kernel, &dir, path),
            want,
            "openat2 {path:?}"
        );
    }
}

/// A link on procfs is refused by both; `/proc/self/root` is a magic link.
#[test]
fn procfs_links_are_refused() {
    let slash = File::open("/").unwrap();
    for resolver in [Resolver::Walk, Resolver::Kernel] {
        let got = open_dir_in_root(resolver, slash.as_fd(), Path::new("proc/self/root"));
        assert_eq!(got.err(), Some(Errno::ELOOP), "{resolver:?}");
    }
    // The walk refuses the plain `/proc/self` too; the kernel follows it.
    let walk = open_dir_in_root(Resolver::Walk, slash.as_fd(), Path::new("proc/self"));
    assert_eq!(walk.err(), Some(Errno::ELOOP));
}

#[test]
fn an_entry_is_never_followed() {
    let (root, _outside) = tree();
    let dir = File::open(root.path()).unwrap();
    for resolver in [Resolver::Walk, Resolver::Kernel] {
        let entry = |name: &str, want_dir| {
            open_entry(resolver, dir.as_fd(), name, want_dir)
                .map(|fd| fstat(fd.as_raw_fd()).unwrap().st_ino)
        };
        let a = std::fs::metadata(root.path().join("a")).unwrap().ino();
        let f = std::fs::metadata(root.path().join("f")).unwrap().ino();
        assert_eq!(entry("a", true), Ok(a), "{resolver:?}");
        assert_eq!(entry("f", false), Ok(f), "{resolver:?}");
        assert_eq!(entry("f", true), Err(Errno::ENOTDIR), "{resolver:?}");
        assert_eq!(entry("abs", true), Err(Errno::ELOOP), "{resolver:?}");
        assert_eq!(entry("tofile", false), Err(Errno::ELOOP), "{resolver:?}");
        assert_eq!(entry("missing", false), Err(Errno::ENOENT), "{resolver:?}");
        for bad in ["", ".", "..", "a/b"] {
            assert_eq!(entry(bad, true), Err(Errno::EINVAL), "{resolver:?} {bad:?}");
        }
    }
}

/// Where `openat2` is refused, the kernel resolver takes the walk: the same
/// answers, the escapes still stopped.
#[test]
fn a_refused_openat2_falls_back_to_the_walk() {
    let (root, _outside) = tree();
    let r = root.path().to_path_buf();
    with_openat2_refused(|| {
        let dir = File::open(&r).unwrap();
        let b = std::fs::metadata(r.join("a/b")).unwrap().ino();
        assert_eq!(outcome(Resolver::Kernel, &dir, "abs/b"), Ok(b));
        assert_eq!(outcome(Resolver::Kernel, &dir, "up"), Ok(b));
        assert_eq!(outcome(Resolver::Kernel, &dir, "out"), Err(Errno::ENOENT));
        let got = open_entry(Resolver::Kernel, dir.as_fd(), "abs", true);
        assert_eq!(got.err(), Some(Errno::ELOOP));
    });
}
