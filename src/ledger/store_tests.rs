use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use super::*;

/// A state told apart by one number, `mark`: the claim time of its one pod.
fn marked(v: u64) -> LedgerState {
    let mut state = LedgerState::default();
    set_mark(&mut state, v);
    state
}

fn set_mark(state: &mut LedgerState, v: u64) {
    let pod = crate::ledger::PodRecord {
        pod: crate::ledger::PodRef {
            sandbox_id: "mark".into(),
            ..Default::default()
        },
        claims: Vec::new(),
        claimed_unix: v,
        containers: Default::default(),
        network_owner: None,
        admitted: 0,
    };
    state.pods.insert("mark".into(), pod);
}

fn mark(state: &LedgerState) -> u64 {
    state.pods.get("mark").map_or(0, |p| p.claimed_unix)
}

fn write(store: &Store, state: LedgerState) {
    let mut txn = store.begin().unwrap();
    txn.state = state;
    txn.commit().unwrap();
}

#[test]
fn a_write_by_another_handle_is_seen_despite_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (
        Store::open(dir.path()).unwrap(),
        Store::open(dir.path()).unwrap(),
    );
    write(&ours, marked(7));
    assert_eq!(mark(&ours.begin().unwrap().state), 7);
    write(&theirs, marked(8));
    assert_eq!(mark(&ours.begin().unwrap().state), 8);
}

/// On tmpfs (the default /run/devgate) commits skip the fsyncs; what they
/// write is still what every other handle reads, and nothing is left behind.
#[test]
fn a_store_on_tmpfs_commits_without_fsync() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let (ours, theirs) = (
        Store::open(dir.path()).unwrap(),
        Store::open(dir.path()).unwrap(),
    );
    write(&ours, marked(3));
    let durability = ours.handles.lock().unwrap().as_ref().map(|h| h.durability);
    assert_eq!(durability, Some(Durability::Memory));
    assert_eq!(mark(&theirs.read_unlocked().unwrap()), 3);
    write(&theirs, marked(4));
    assert_eq!(mark(&ours.begin().unwrap().state), 4);
    let mut names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, [LEDGER_FILE, LOCK_FILE]);
}

#[test]
fn a_file_replaced_behind_the_cache_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    write(&store, marked(7));
    // Same length, new inode: what any other writer's rename produces.
    let path = dir.path().join(LEDGER_FILE);
    let text = fs::read_to_string(&path)
        .unwrap()
        .replace("\"claimed_unix\":7", "\"claimed_unix\":9");
    fs::write(dir.path().join("other"), &text).unwrap();
    fs::rename(dir.path().join("other"), &path).unwrap();
    assert_eq!(mark(&store.begin().unwrap().state), 9);
    fs::write(&path, b"{torn").unwrap();
    assert!(matches!(store.begin(), Err(LedgerError::Corrupt { .. })));
    fs::remove_file(&path).unwrap();
    assert_eq!(store.begin().unwrap().state, LedgerState::default());
}

#[test]
fn a_reader_of_a_missing_dir_sees_nothing_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("state");
    assert_eq!(
        crate::ledger::Ledger::read(&missing).unwrap(),
        LedgerState::default()
    );
    assert!(!missing.exists());
}

#[test]
fn an_uncommitted_change_does_not_leak_into_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    write(&store, marked(7));
    let mut txn = store.begin().unwrap();
    set_mark(&mut txn.state, 99);
    drop(txn);
    assert_eq!(mark(&store.begin().unwrap().state), 7);
}

#[test]
fn a_transaction_that_cannot_read_the_document_leaves_the_lock_free() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    fs::write(dir.path().join(LEDGER_FILE), b"{torn").unwrap();
    assert!(matches!(store.begin(), Err(LedgerError::Corrupt { .. })));
    // Another process's view: its own open of the lock file.
    let other = File::open(dir.path().join(LOCK_FILE)).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    let rc = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(
        rc,
        0,
        "the lock is still held: {}",
        std::io::Error::last_os_error()
    );
}

#[test]
fn threads_sharing_one_store_never_lose_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    write(&store, marked(0));
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    let mut txn = store.begin().unwrap();
                    let next = mark(&txn.state) + 1;
                    set_mark(&mut txn.state, next);
                    txn.commit().unwrap();
                }
            });
        }
    });
    assert_eq!(mark(&store.begin().unwrap().state), 200);
}

#[test]
fn a_state_dir_removed_and_made_again_is_locked_and_written_anew() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let store = Store::open(&state).unwrap();
    write(&store, marked(7));
    fs::remove_dir_all(&state).unwrap();
    fs::create_dir(&state).unwrap();
    // Another process locks the new lock file by name: ours must be that file.
    let other = crate::fsutil::lock_exclusive(&state.join(LOCK_FILE)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (starting, started) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            starting.send(()).unwrap();
            let mut txn = store.begin().unwrap();
            tx.send(mark(&txn.state)).unwrap();
            set_mark(&mut txn.state, 8);
            txn.commit().unwrap();
        });
        // The transaction is being begun: it must wait for the other lock,
        // as the kernel's list of blocked lock requests shows.
        started.recv().unwrap();
        let lock = fs::metadata(state.join(LOCK_FILE)).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !crate::ledger::tests::lock_waited_for(&lock) {
            assert!(
                rx.try_recv().is_err(),
                "a transaction ran under another's lock"
            );
            assert!(std::time::Instant::now() < deadline, "no wait for the lock");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            rx.try_recv().is_err(),
            "a transaction ran under another's lock"
        );
        drop(other);
        let fresh = mark(&LedgerState::default());
        assert_eq!(
            rx.recv().unwrap(),
            fresh,
            "the old directory's document is gone"
        );
    });
    let text = fs::read_to_string(state.join(LEDGER_FILE)).unwrap();
    assert!(text.contains("\"claimed_unix\":8"), "{text}");
}

/// (device, inode) of every file this process holds open.
fn open_files() -> Vec<(u64, u64)> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::metadata(e.ok()?.path()).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}

/// ext4 gives a freed inode number to the next file created: a version
/// replaced by another process while cached must keep its number, or a later
/// version of the same size within one mtime tick would pass for it.
#[test]
fn the_cached_version_stays_open_after_another_handle_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (
        Store::open(dir.path()).unwrap(),
        Store::open(dir.path()).unwrap(),
    );
    let path = dir.path().join(LEDGER_FILE);
    let id = |m: std::fs::Metadata| (m.dev(), m.ino());
    write(&ours, marked(7));
    let written = id(std::fs::metadata(&path).unwrap());
    write(&theirs, marked(8));
    assert_ne!(id(std::fs::metadata(&path).unwrap()), written);
    assert!(open_files().contains(&written), "the written version");
    // A version read (not written) is kept open the same way.
    assert_eq!(mark(&ours.read_unlocked().unwrap()), 8);
    let read = id(std::fs::metadata(&path).unwrap());
    write(&theirs, marked(9));
    assert!(open_files().contains(&read), "the read version");
    assert_eq!(mark(&ours.begin().unwrap().state), 9);
}

/// Unlocked reads compare the cache with the files through the kept
/// directory; a directory removed and made again must still be read anew,
/// whether the cache held a document or an empty ledger.
#[test]
fn an_unlocked_read_after_the_state_dir_is_made_again_sees_the_new_one() {
    for cached_document in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let ours = Store::open(&state).unwrap();
        if cached_document {
            write(&ours, marked(7));
        } else {
            drop(ours.begin().unwrap());
        }
        assert!(ours.read_unlocked().is_ok());
        fs::remove_dir_all(&state).unwrap();
        write(&Store::open(&state).unwrap(), marked(8));
        assert_eq!(mark(&ours.read_unlocked().unwrap()), 8, "{cached_document}");
    }
}

/// A document a newer release wrote with a higher version is refused by
/// transactions and lock-free readers alike, naming both versions.
#[test]
fn a_document_of_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    write(&store, marked(1));
    let path = dir.path().join(LEDGER_FILE);
    let newer = crate::ledger::LEDGER_VERSION + 1;
    let text = fs::read_to_string(&path).unwrap().replacen(
        &format!("\"version\":{}", crate::ledger::LEDGER_VERSION),
        &format!("\"version\":{newer}"),
        1,
    );
    fs::write(dir.path().join("next"), text).unwrap();
    fs::rename(dir.path().join("next"), &path).unwrap();
    let err = store.begin().err().expect("refused");
    assert!(
        matches!(err, LedgerError::Newer { version, .. } if version == newer),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("version {newer}, newer than this release reads")),
        "{err}"
    );
    let err = Store::at(dir.path()).read_unlocked().unwrap_err();
    assert!(matches!(err, LedgerError::Newer { .. }), "{err}");
}

/// A document past what every read accepts is never written: the change is
/// refused, and the ledger stays as it was, readable, for every later change.
#[test]
fn a_change_that_would_make_the_ledger_unreadable_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    write(&store, marked(1));
    let mut txn = store.begin().unwrap();
    set_mark(&mut txn.state, 2);
    let pod = txn.state.pods.get_mut("mark").unwrap();
    pod.pod.name = "x".repeat(MAX_LEDGER_BYTES as usize);
    let e = txn.commit().unwrap_err();
    assert!(matches!(e, LedgerError::Full { .. }), "{e}");
    assert!(
        e.to_string().contains("is full: this change would make it"),
        "{e}"
    );
    assert_eq!(mark(&Store::at(dir.path()).read_unlocked().unwrap()), 1);
    write(&store, marked(3));
    assert_eq!(mark(&Store::at(dir.path()).read_unlocked().unwrap()), 3);
}
