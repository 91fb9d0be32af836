//! Tests of `fsutil`.
use super::*;

/// The mode is the file's from the start: whoever reads it after the
/// rename can, whatever the umask.
#[test]
fn a_replaced_file_has_its_mode_before_the_rename() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spec.json");
    fs::write(&path, "old").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    replace_file_mode(&path, b"new", 0o644).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o644);
    assert_eq!(fs::read(&path).unwrap(), b"new");
    replace_file(&path, b"private").unwrap();
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

/// A symbolic link planted as the temporary name is refused, and what it
/// points at is left alone; a bare file name's directory is `.`.
#[test]
fn a_planted_link_is_never_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("precious");
    fs::write(&target, "keep").unwrap();
    let path = dir.path().join("health.json");
    std::os::unix::fs::symlink(&target, dir.path().join("health.json.tmp")).unwrap();
    assert!(replace_file(&path, b"new").is_err());
    assert_eq!(fs::read(&target).unwrap(), b"keep");
    assert!(!path.exists());
    assert_eq!(parent_dir(Path::new("spec.json")), Path::new("."));
    assert_eq!(parent_dir(Path::new("/run/x.json")), Path::new("/run"));
}

/// tmpfs (the default state directory, /run) needs no fsync; anything
/// else, or anything that cannot be told, gets it.
#[test]
fn only_memory_filesystems_skip_the_fsync() {
    let shm = File::open("/dev/shm").unwrap();
    assert_eq!(Durability::of_dir(&shm), Durability::Memory);
    let proc = File::open("/proc").unwrap();
    assert_eq!(Durability::of_dir(&proc), Durability::Sync);
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let open = File::open(dir.path()).unwrap();
    let (meta, _) = replace_in(&open, dir.path(), "f", b"x", Durability::Memory).unwrap();
    assert_eq!(meta.len(), 1);
    assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"x");
}

/// An unlocked writer (`cdi generate`) uses a temporary name of its own: a
/// second writer's temporary file, half written, is neither truncated nor
/// renamed into place by it.
#[test]
fn an_unlocked_replace_leaves_another_writers_temporary_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("devgate.io-gpu.json");
    let other = dir.path().join("devgate.io-gpu.json.tmp");
    fs::write(&other, "half of another writer's spec").unwrap();
    replace_file_mode(&path, b"whole", 0o644).unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"whole");
    assert_eq!(fs::read(&other).unwrap(), b"half of another writer's spec");
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "no temporary file of its own left: {names:?}"
    );
}

#[test]
fn replace_leaves_only_the_new_content() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    replace_file(&path, b"old").unwrap();
    replace_file(&path, b"new").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"new");
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["state.json"]);
}

#[test]
fn bounded_reads_stop_one_byte_past_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    fs::write(&path, b"1234").unwrap();
    assert_eq!(read_file_bounded(&path, 4).unwrap(), b"1234");
    let e = read_file_bounded(&path, 3).unwrap_err();
    assert!(matches!(e, BoundedError::TooLarge { limit: 3 }), "{e}");
    let io = std::io::Error::from(e);
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(io.to_string(), "larger than 3 bytes");
    let missing = read_file_bounded(&dir.path().join("none"), 4).unwrap_err();
    assert!(missing.is_not_found());
    assert_eq!(
        std::io::Error::from(missing).kind(),
        std::io::ErrorKind::NotFound
    );
    fs::write(&path, [0xff, 0xfe]).unwrap();
    let e = std::io::Error::from(read_text_bounded(&path, 4).unwrap_err());
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
}

#[test]
fn errors_name_the_path() {
    let err = replace_file(Path::new("/nonexistent-dir/x.json"), b"x").unwrap_err();
    assert!(
        err.to_string().starts_with("/nonexistent-dir/x.json.tmp: "),
        "{err}"
    );
}

/// The read syscalls this thread has made (proc(5) `/proc/<pid>/io`, `syscr`),
/// counted by the kernel.
fn reads_so_far() -> u64 {
    let io = fs::read_to_string("/proc/thread-self/io").unwrap();
    let line = io.lines().find(|l| l.starts_with("syscr:")).unwrap();
    line["syscr:".len()..].trim().parse().unwrap()
}

/// A stat line is taken in one read and its end found with a second, where
/// `read_to_string` probes 32 bytes at a time; a file longer than the first
/// room is still read whole, and one past the limit is refused.
#[test]
fn proc_files_are_read_in_two_reads_and_bounded() {
    let between = |f: &dyn Fn()| {
        let before = reads_so_far();
        f();
        reads_so_far() - before
    };
    let idle = between(&|| {});
    let stat = || {
        let text = read_proc_text(Path::new("/proc/thread-self/stat"), 4096).unwrap();
        assert!(text.ends_with('\n') && text.contains(") "), "{text}");
    };
    assert_eq!(between(&stat) - idle, 2);
    let std_reads = between(&|| {
        fs::read_to_string("/proc/thread-self/stat").unwrap();
    }) - idle;
    assert!(std_reads > 2, "read_to_string took {std_reads} reads");

    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("long");
    fs::write(&long, "x".repeat(5000)).unwrap();
    assert_eq!(read_proc_text(&long, 5000).unwrap().len(), 5000);
    assert!(matches!(
        read_proc_text(&long, 4999),
        Err(BoundedError::TooLarge { limit: 4999 })
    ));
    fs::write(&long, b"\xff").unwrap();
    let err = std::io::Error::from(read_proc_text(&long, 10).unwrap_err());
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}
