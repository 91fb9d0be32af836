use std::sync::{Arc, Barrier};

use std::collections::HashSet;

use super::*;

pub(crate) fn pod(id: &str) -> PodRef {
    PodRef {
        sandbox_id: id.to_string(),
        namespace: "ns".to_string(),
        name: format!("pod-{id}"),
        uid: format!("uid-{id}"),
    }
}

/// The record of container `name`, given the first GPU's node.
pub(crate) fn record(name: &str) -> ContainerRecord {
    ContainerRecord {
        name: name.to_string(),
        devices: vec!["/dev/nvidia0".to_string()],
        applied_unix: 1,
        init: None,
        cgroups: Vec::new(),
        resolved: None,
        resolved_sha256: None,
        hooks_only: false,
    }
}

pub(super) fn gpu(uuid: &str, share: Share) -> Claim {
    Claim {
        device: DeviceId::Gpu(uuid.to_string()),
        share,
        pf: None,
    }
}

fn shared(core: u32, mem: u32) -> Share {
    Share::Shared {
        core,
        memory_ratio: mem,
    }
}

pub(super) fn ledger() -> (tempfile::TempDir, Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open(dir.path()).unwrap();
    (dir, l)
}

#[test]
fn exclusive_has_one_holder_until_released() {
    let (_d, l) = ledger();
    l.claim(&pod("a"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap();
    let err = l
        .claim(&pod("b"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap_err();
    assert_eq!(err.to_string(), "gpu GPU-1 is held by pod ns/pod-a");
    let err = l
        .claim(&pod("b"), &[gpu("GPU-1", shared(10, 10))])
        .unwrap_err();
    assert!(matches!(err, LedgerError::Held { .. }), "{err}");
    let rel = l.release_pod("a", &NoTeardown).unwrap();
    assert_eq!(rel.pods, vec![pod("a")]);
    l.claim(&pod("b"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap();
}

#[test]
fn shares_sum_to_at_most_100() {
    let (_d, l) = ledger();
    l.claim(&pod("a"), &[gpu("GPU-1", shared(50, 50))]).unwrap();
    l.claim(&pod("b"), &[gpu("GPU-1", shared(50, 50))]).unwrap();
    let err = l
        .claim(&pod("c"), &[gpu("GPU-1", shared(1, 0))])
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::Overcommitted { core: 101, .. }),
        "{err}"
    );
    let err = l
        .claim(&pod("c"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap_err();
    assert!(matches!(err, LedgerError::Held { .. }), "{err}");
}

/// The first share of a GPU is held to 100 too: the ledger keeps its rule
/// whatever its callers checked, and claims nothing.
#[test]
fn a_first_share_over_100_is_refused() {
    let (_d, l) = ledger();
    let err = l
        .claim(&pod("a"), &[gpu("GPU-1", shared(150, 10))])
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::Overcommitted { core: 150, .. }),
        "{err}"
    );
    assert!(l.snapshot().unwrap().devices.is_empty());
    l.claim(&pod("a"), &[gpu("GPU-1", shared(100, 100))])
        .unwrap();
}

#[test]
fn claims_are_all_or_nothing_and_idempotent_per_pod() {
    let (_d, l) = ledger();
    l.claim(&pod("a"), &[gpu("GPU-2", Share::Exclusive)])
        .unwrap();
    let set = [
        gpu("GPU-1", Share::Exclusive),
        gpu("GPU-2", Share::Exclusive),
    ];
    assert!(l.claim(&pod("b"), &set).is_err());
    let snap = l.snapshot().unwrap();
    assert!(
        !snap.devices.contains_key("gpu GPU-1"),
        "partial claim left behind"
    );
    assert!(!snap.pods.contains_key("b"));
    // Same pod, same set: a second container of the pod.
    l.claim(&pod("a"), &[gpu("GPU-2", Share::Exclusive)])
        .unwrap();
    let err = l
        .claim(&pod("a"), &[gpu("GPU-3", Share::Exclusive)])
        .unwrap_err();
    assert!(matches!(err, LedgerError::ClaimMismatch { .. }), "{err}");
    // The message names the device that differs, and how.
    assert!(
        err.to_string()
            .contains("gpu GPU-3 is asked and not among them"),
        "{err}"
    );
    let both = [
        gpu("GPU-2", Share::Exclusive),
        gpu("GPU-4", Share::Exclusive),
    ];
    let err = l.claim(&pod("a"), &both).unwrap_err();
    assert!(err.to_string().contains("gpu GPU-4 is asked"), "{err}");
    let pair = [
        gpu("GPU-5", Share::Exclusive),
        gpu("GPU-6", Share::Exclusive),
    ];
    l.claim(&pod("c"), &pair).unwrap();
    let err = l.claim(&pod("c"), &pair[..1]).unwrap_err();
    assert!(
        err.to_string()
            .contains("gpu GPU-6 is among them and not asked now"),
        "{err}"
    );
}

#[test]
fn state_survives_reopen_and_reconcile_drops_dead_pods() {
    let (d, l) = ledger();
    l.claim(&pod("a"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap();
    l.claim(&pod("b"), &[gpu("GPU-2", Share::Exclusive)])
        .unwrap();
    l.record_container(
        "a",
        "ctr1",
        ContainerRecord {
            devices: vec!["/dev/nvidia3".into()],
            ..record("main")
        },
    )
    .unwrap();
    drop(l);
    let l = Ledger::open(d.path()).unwrap();
    let snap = l.snapshot().unwrap();
    assert_eq!(snap.pods["a"].containers["ctr1"].name, "main");
    let live = ["a".to_string()].into_iter().collect();
    let stale = l.stale_pods(&live).unwrap();
    let rel = l.release_pods(&stale, &NoTeardown).unwrap();
    assert_eq!(rel.pods, vec![pod("b")]);
    let snap = l.snapshot().unwrap();
    assert!(snap.pods.contains_key("a") && !snap.pods.contains_key("b"));
    assert!(!snap.devices.contains_key("gpu GPU-2"));
}

/// Synchronize chooses the gone pods when it runs; releasing them later
/// touches no pod admitted in between.
#[test]
fn stale_pods_are_chosen_once_and_released_exactly() {
    let (_d, l) = ledger();
    l.claim(&pod("live"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap();
    l.claim(&pod("gone"), &[gpu("GPU-2", Share::Exclusive)])
        .unwrap();
    let live = ["live".to_string()].into_iter().collect();
    let stale = l.stale_pods(&live).unwrap();
    assert_eq!(
        stale,
        super::gone(&["gone"])
            .into_keys()
            .map(|id| (id, Some(0)))
            .collect()
    );
    // Admitted after the runtime's list was taken: not in `live`, kept.
    l.claim(&pod("new"), &[gpu("GPU-3", Share::Exclusive)])
        .unwrap();
    let rel = l.release_pods(&stale, &NoTeardown).unwrap();
    assert_eq!(rel.pods, vec![pod("gone")]);
    let snap = l.snapshot().unwrap();
    let held: Vec<&str> = snap.pods.keys().map(String::as_str).collect();
    assert_eq!(held, ["live", "new"]);
}

/// A podman container admitted by the hooks.d hook into the same ledger is no
/// pod of the NRI runtime: a Synchronize must not release it.
#[test]
fn hooks_only_pods_are_never_stale_to_the_plugin() {
    let (_d, l) = ledger();
    let record = |hooks_only: bool| ContainerRecord {
        name: "main".into(),
        devices: Vec::new(),
        applied_unix: 1,
        init: hooks_only.then_some(InitProcess {
            pid: 1,
            start_ticks: 1,
        }),
        cgroups: Vec::new(),
        resolved: None,
        resolved_sha256: None,
        hooks_only,
    };
    let claim = |uuid: &str| [gpu(uuid, Share::Exclusive)];
    l.admit(&pod("podman"), &claim("GPU-1"), "c1", record(true), false)
        .unwrap();
    l.admit(&pod("k8s"), &claim("GPU-2"), "c2", record(false), false)
        .unwrap();
    // CRI-O with both: one container admitted by the hook while the plugin
    // was down, the next by the plugin. The plugin's, or nobody's.
    l.admit(&pod("mixed"), &claim("GPU-3"), "c3", record(true), false)
        .unwrap();
    l.admit(&pod("mixed"), &claim("GPU-3"), "c4", record(false), false)
        .unwrap();
    let stale = l.stale_pods(&HashSet::new()).unwrap();
    let mut ids: Vec<&String> = stale.keys().collect();
    ids.sort();
    assert_eq!(ids, ["k8s", "mixed"]);
    assert_eq!((stale["k8s"], stale["mixed"]), (Some(1), Some(2)));
}

/// A pod admitted by a release of devgate that counted its shares otherwise
/// (a memory-only GPU entry with core 100, now 0): its further containers are
/// admitted against the recorded claims, not refused as a mismatch.
#[test]
fn a_pod_whose_shares_are_counted_otherwise_now_keeps_its_claims() {
    let (_d, l) = ledger();
    let share = |core| Share::Shared {
        core,
        memory_ratio: 50,
    };
    l.claim(&pod("a"), &[gpu("GPU-1", share(100))]).unwrap();
    l.claim(&pod("a"), &[gpu("GPU-1", share(0))]).unwrap();
    let snap = l.snapshot().unwrap();
    assert_eq!(snap.pods["a"].claims[0].share, share(100));
    let e = l.claim(&pod("a"), &[gpu("GPU-2", share(0))]).unwrap_err();
    assert!(matches!(e, LedgerError::ClaimMismatch { .. }), "{e}");
}

#[test]
fn concurrent_claims_never_share_an_exclusive_gpu() {
    let (d, _l) = ledger();
    let threads = 16;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let dir = d.path().to_path_buf();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                // A separate Ledger per thread: the flock, not shared memory, must decide.
                let l = Ledger::open(&dir).unwrap();
                barrier.wait();
                l.claim(
                    &pod(&format!("p{i}")),
                    &[gpu(&format!("GPU-{}", i % 4), Share::Exclusive)],
                )
                .is_ok()
            })
        })
        .collect();
    let wins = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|won| *won)
        .count();
    assert_eq!(wins, 4, "one winner per gpu");
    let snap = Ledger::open(d.path()).unwrap().snapshot().unwrap();
    assert_eq!(snap.pods.len(), 4);
    assert_eq!(snap.devices.len(), 4, "each gpu held");
    for rec in snap.devices.values() {
        assert_eq!(rec.holders.len(), 1);
    }
}

#[test]
fn corrupt_ledger_is_an_error_not_a_reset() {
    let (d, l) = ledger();
    std::fs::write(d.path().join("ledger.json"), b"{not json").unwrap();
    let err = l
        .claim(&pod("a"), &[gpu("GPU-1", Share::Exclusive)])
        .unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
}

#[test]
fn a_new_state_directory_is_root_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("run/devgate");
    Ledger::open(&state).unwrap();
    for d in [&state, &dir.path().join("run")] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
}

/// A shared GPU whose release is running (its last holder's teardown may
/// reset it) takes no new pod until the release commits; a pod already
/// holding it is admitted as before.
#[test]
fn a_shared_gpu_being_released_takes_no_new_pod() {
    let (d, l) = ledger();
    let half = shared(50, 50);
    l.claim(&pod("a"), &[gpu("GPU-1", half)]).unwrap();
    l.claim(&pod("b"), &[gpu("GPU-1", half)]).unwrap();
    struct TriesToJoin<'a>(&'a Ledger, std::cell::RefCell<Vec<String>>);
    impl Teardown for TriesToJoin<'_> {
        fn teardown(&self, _pod: &PodRecord) -> Result<(), crate::ledger::Unclean> {
            let joined = self.0.claim(&pod("c"), &[gpu("GPU-1", shared(10, 10))]);
            self.1.borrow_mut().push(match joined {
                Ok(_) => "joined".to_string(),
                Err(e) => e.to_string(),
            });
            // The holder still admits further containers meanwhile.
            self.0
                .claim(&pod("b"), &[gpu("GPU-1", shared(50, 50))])
                .unwrap();
            Ok(())
        }
    }
    let other = Ledger::open(d.path()).unwrap();
    let td = TriesToJoin(&other, Default::default());
    l.release_pod("a", &td).unwrap();
    assert_eq!(
        *td.1.borrow(),
        ["gpu GPU-1 is being released: the teardown of a pod that held it is running"]
    );
    l.claim(&pod("c"), &[gpu("GPU-1", shared(10, 10))])
        .expect("joins once the release committed");
}

#[test]
fn a_record_vouches_for_its_annotation_by_text_or_by_digest() {
    // FIPS 180-2, appendix B.1.
    assert_eq!(
        resolved_digest("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let annotation = r#"{"version":1,"networks":[]}"#;
    let by_text = ContainerRecord {
        resolved: Some(annotation.to_string()),
        ..record("a")
    };
    let mut by_digest = ContainerRecord {
        resolved_sha256: Some(resolved_digest(annotation)),
        ..record("b")
    };
    for (rec, value, vouched) in [
        (&by_text, annotation, true),
        (&by_text, "{}", false),
        (&by_digest, annotation, true),
        (&by_digest, &format!("{annotation} "), false),
        (&by_digest, "", false),
        (&record("c"), annotation, false),
        (&record("c"), "", false),
    ] {
        assert_eq!(rec.vouches_for(value), vouched, "{rec:?} {value:?}");
    }
    by_digest.forget_resolved();
    assert!(!by_digest.vouches_for(annotation));
    // Records of either form read back as written.
    for rec in [&by_text, &by_digest] {
        let text = serde_json::to_string(rec).unwrap();
        assert_eq!(
            &serde_json::from_str::<ContainerRecord>(&text).unwrap(),
            rec
        );
    }
}

/// A teardown's question whether its pod is a GPU's last holder is answered
/// under the ledger's lock: a claim of the GPU being made (its transaction
/// open, as another process's) is waited for and then named, where a read
/// without the lock would answer from before it.
#[test]
fn holders_now_waits_for_a_claim_being_made() {
    let (dir, l) = ledger();
    let device = DeviceId::Gpu("GPU-1".to_string());
    let other = Ledger::open(dir.path()).unwrap();
    let mut txn = other.store.begin().unwrap();
    std::thread::scope(|s| {
        let asked = s.spawn(|| l.holders_now(&device).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!asked.is_finished(), "waits for the lock");
        assert!(l.snapshot().unwrap().devices.is_empty(), "unlocked: before");
        txn.state.devices.insert(
            device.to_string(),
            DeviceRecord {
                device: device.clone(),
                holders: vec![Holder {
                    sandbox_id: "b".to_string(),
                    share: shared(50, 50),
                }],
                quarantine: None,
            },
        );
        txn.commit().unwrap();
        assert_eq!(asked.join().unwrap(), ["b"]);
    });
    // The read changed nothing and left the ledger to the next transaction.
    assert_eq!(l.holders_now(&device).unwrap(), ["b"]);
    l.claim(&pod("c"), &[gpu("GPU-1", shared(50, 50))]).unwrap();
    assert_eq!(l.holders_now(&device).unwrap(), ["b", "c"]);
}

/// Whether /proc/locks lists a blocked request (`->`, fs/locks.c
/// `lock_get_status`) of this process for the file `meta` describes, which
/// it names as `major:minor:inode` (hex device numbers).
pub(crate) fn lock_waited_for(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let dev = meta.dev();
    let file = format!(
        "{:02x}:{:02x}:{}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev),
        meta.ino()
    );
    let pid = std::process::id().to_string();
    let locks = std::fs::read_to_string("/proc/locks").expect("/proc/locks");
    locks.lines().any(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        // "N: -> FLOCK ADVISORY WRITE <pid> <maj:min:ino> 0 EOF"
        fields.get(1) == Some(&"->")
            && fields.get(5) == Some(&pid.as_str())
            && fields.get(6) == Some(&file.as_str())
    })
}
