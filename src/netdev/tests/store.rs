//! The saved-state store and the settings types.

use std::fs;

use crate::netdev::saved::{SavedStore, SavedVf};
use crate::netdev::settings::{HwAddr, VfSettings};

fn record(container: &str, bdf: &str) -> SavedVf {
    SavedVf::example(container, bdf)
}

#[test]
fn records_round_trip_and_filter_by_container() {
    let dir = tempfile::tempdir().unwrap();
    let store = SavedStore::new(dir.path());
    assert!(
        store.all().unwrap().is_empty(),
        "a missing directory is no records"
    );
    let a = record("c1", "0000:00:10.1");
    let b = record("c2", "0000:00:10.2");
    store.save(&a).unwrap();
    store.save(&b).unwrap();
    assert_eq!(store.load(a.vf()).unwrap(), Some(a.clone()));
    assert_eq!(store.for_container("c1").unwrap(), vec![a.clone()]);
    // A temp file from a crash in the middle of a save is not a record.
    fs::write(dir.path().join("vf/0000:00:10.3.json.tmp"), b"{").unwrap();
    assert_eq!(store.all().unwrap().len(), 2);
    store.remove(a.vf()).unwrap();
    store.remove(a.vf()).unwrap();
    assert_eq!(store.all().unwrap(), vec![b]);
}

#[test]
fn corrupt_or_foreign_records_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = SavedStore::new(dir.path());
    let rec = record("c1", "0000:00:10.1");
    store.save(&rec).unwrap();
    let path = dir.path().join("vf/0000:00:10.1.json");
    fs::write(&path, b"{\"version\": 1").unwrap();
    assert!(store
        .load(rec.vf())
        .unwrap_err()
        .to_string()
        .contains("is corrupt"));
    let mut text = serde_json::to_value(&rec).unwrap();
    text["version"] = 99.into();
    fs::write(&path, text.to_string()).unwrap();
    assert!(store.all().unwrap_err().to_string().contains("version 99"));
    fs::write(&path, vec![b' '; 300 * 1024]).unwrap();
    assert!(store
        .load(rec.vf())
        .unwrap_err()
        .to_string()
        .contains("larger than"));
}

#[test]
fn an_unreadable_record_is_skipped_for_other_containers_only_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = SavedStore::new(dir.path());
    store.save(&record("c1", "0000:00:10.1")).unwrap();
    store.save(&record("c2", "0000:00:10.2")).unwrap();
    fs::write(dir.path().join("vf/0000:00:10.9.json"), b"garbage").unwrap();
    assert!(store.all().is_err(), "all() stays strict");
    // What `devgate status` shows: every readable record, and the bad one's error.
    let (records, bad) = store.readable().unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(bad.len(), 1);
    assert!(
        bad[0].to_string().contains("0000:00:10.9.json"),
        "{}",
        bad[0]
    );
    let c1 = store.for_container("c1").unwrap();
    assert_eq!(c1.len(), 1);
    assert_eq!(c1[0].container_id, "c1");
    let scan = store.scan_container("c3").unwrap();
    assert!(scan.records.is_empty());
    assert_eq!(scan.unreadable.len(), 1);
    assert!(scan.unreadable[0].to_string().contains("0000:00:10.9"));
}

#[test]
fn the_lock_is_exclusive_across_open_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = SavedStore::new(dir.path());
    let vf = "0000:00:10.1".parse().unwrap();
    let held = store.lock(vf).unwrap();
    let path = dir.path().join("vf/0000:00:10.1.lock");
    let other = fs::File::open(&path).unwrap();
    let try_lock = nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock);
    assert!(try_lock.is_err());
    drop(held);
    let other = fs::File::open(&path).unwrap();
    assert!(nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok());
}

#[test]
fn hwaddr_parses_only_hex_pairs() {
    let table = [
        ("02:00:00:00:00:11", Some("02:00:00:00:00:11")),
        ("02:AB:cd:00:00:11", Some("02:ab:cd:00:00:11")),
        ("2:00:00:00:00:11", None),
        ("02-00-00-00-00-11", None),
        ("", None),
        ("zz:00", None),
    ];
    for (input, want) in table {
        let got = input.parse::<HwAddr>().ok().map(|m| m.to_string());
        assert_eq!(got.as_deref(), want, "{input:?}");
    }
    let long = vec!["aa"; 33].join(":");
    assert!(long.parse::<HwAddr>().is_err());
}

#[test]
fn settings_validate_like_sriov_cni() {
    let ok = |json: &str| serde_json::from_str::<VfSettings>(json).unwrap().validate();
    assert!(ok(r#"{"vlan": 100, "qos": 7, "vlan_proto": "802.1ad"}"#).is_ok());
    assert!(ok(r#"{"vlan_proto": "802.1Q", "spoofchk": true, "link_state": "disable"}"#).is_ok());
    for (json, field) in [
        (r#"{"vlan": 4095}"#, "vlan"),
        (r#"{"qos": 1}"#, "qos"),
        (r#"{"vlan": 5, "qos": 8}"#, "qos"),
        (r#"{"vlan_proto": "802.1ad"}"#, "vlan_proto"),
        (r#"{"mac": "01:00:00:00:00:01"}"#, "mac"),
        (r#"{"mac": "00:00:00:00:00:00"}"#, "mac"),
        (r#"{"min_tx_rate": 10, "max_tx_rate": 5}"#, "min_tx_rate"),
        (r#"{"mtu": 67}"#, "mtu"),
    ] {
        let e = ok(json).unwrap_err().to_string();
        assert!(e.starts_with(field), "{json}: {e}");
    }
    assert!(serde_json::from_str::<VfSettings>(r#"{"vlna": 1}"#).is_err());
    assert!(serde_json::from_str::<VfSettings>(r#"{"link_state": "up"}"#).is_err());
}

#[test]
fn saved_vf_states_keep_the_booleans_every_version_reads() {
    use crate::netdev::vfinfo::VfState;
    /// The flags as the release before reads them.
    #[derive(serde::Deserialize)]
    struct Before {
        spoofchk: bool,
        trust: bool,
    }
    let text = |flags: &str| {
        format!(
            r#"{{"vf": 3, "mac": "02:00:00:00:00:11",
                "vlan": {{"vlan": 0, "qos": 0, "proto": "802.1Q"}},
                "rate": {{"min": 0, "max": 0}}, "link_state": "auto"{flags}}}"#
        )
    };
    let read = |flags: &str| {
        let s: VfState = serde_json::from_str(&text(flags)).unwrap();
        (s.spoofchk, s.trust)
    };
    // Records of the release before: plain booleans.
    assert_eq!(
        read(r#", "spoofchk": true, "trust": false"#),
        (Some(true), Some(false))
    );
    assert_eq!(
        read(r#", "spoofchk": false, "trust": true, "unreported": ["trust"]"#),
        (Some(false), None)
    );
    // What a later version may add to the list is read and left alone.
    assert_eq!(
        read(r#", "spoofchk": false, "trust": true, "unreported": ["trust", "rss_query"]"#),
        (Some(false), None)
    );
    assert_eq!(
        read(r#", "spoofchk": false, "trust": true, "unreported": null"#),
        (Some(false), Some(true))
    );
    assert_eq!(read(r#", "spoofchk": null"#), (None, None));
    // Settings not reported are saved as the restrictive value, which the
    // release before, knowing no `unreported`, reads and restores.
    let mut state: VfState =
        serde_json::from_str(&text(r#", "spoofchk": false, "trust": true"#)).unwrap();
    (state.spoofchk, state.trust) = (None, None);
    let saved = serde_json::to_string(&state).unwrap();
    let before: Before = serde_json::from_str(&saved).unwrap();
    assert_eq!((before.spoofchk, before.trust), (true, false), "{saved}");
    assert_eq!(serde_json::from_str::<VfState>(&saved).unwrap(), state);
    state.spoofchk = Some(false);
    let saved = serde_json::to_value(&state).unwrap();
    assert_eq!(saved["spoofchk"], false);
    assert_eq!(saved["unreported"], serde_json::json!(["trust"]));
    (state.spoofchk, state.trust) = (Some(false), Some(true));
    let saved = serde_json::to_value(&state).unwrap();
    assert!(saved.get("unreported").is_none(), "{saved}");
}

/// Records written before the `attaching` mark read as finished attaches,
/// as they were taken then; a finished attach's record is written without
/// it, so the release before reads every record of this one.
#[test]
fn records_before_the_attaching_mark_read_as_finished() {
    let mut rec = record("c1", "0000:00:10.1");
    let whole = serde_json::to_value(&rec).unwrap();
    assert!(whole.get("attaching").is_none(), "{whole}");
    let read: SavedVf = serde_json::from_value(whole).unwrap();
    assert!(!read.attaching && !read.cut());
    rec.attaching = true;
    let cut = serde_json::to_value(&rec).unwrap();
    assert_eq!(cut["attaching"], true);
    assert!(serde_json::from_value::<SavedVf>(cut).unwrap().cut());
}

/// A container's records among a pod's VFs are left part way when one is
/// cut, or when a VF of the pod is on the host (its netdev there, or no
/// record) beside one of them away.
#[test]
fn records_left_part_way() {
    let vfs: Vec<crate::inventory::PciAddr> = ["0000:00:10.1", "0000:00:10.2"]
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
    // Each VF's record: none, a whole one of c1, a cut one of c1, another
    // container's, or an unreadable file.
    #[derive(Clone, Copy, Debug)]
    enum R {
        None,
        Whole,
        Cut,
        Other,
        Unreadable,
    }
    // With each VF's netdev on the host or not.
    const AWAY: [bool; 2] = [false, false];
    for (records, home, want) in [
        ([R::Whole, R::Whole], AWAY, false),
        ([R::Whole, R::Whole], [true, true], false),
        ([R::None, R::None], [true, true], false),
        ([R::Other, R::None], [false, true], false),
        ([R::Other, R::Other], AWAY, false),
        ([R::Whole, R::Other], AWAY, false),
        ([R::Whole, R::Unreadable], AWAY, false),
        ([R::Whole, R::Unreadable], [false, true], true),
        ([R::Cut, R::Whole], AWAY, true),
        ([R::Cut, R::Unreadable], AWAY, true),
        ([R::Whole, R::None], [false, true], true),
        ([R::None, R::Cut], [true, false], true),
        // Another's record on the host (its restore failed after the
        // netdev came home), or one's own netdev made anew there.
        ([R::Whole, R::Other], [false, true], true),
        ([R::Whole, R::Whole], [true, false], true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = SavedStore::new(dir.path());
        for (vf, r) in vfs.iter().zip(records) {
            let mut rec = record("c1", &vf.to_string());
            match r {
                R::None => continue,
                R::Whole => {}
                R::Cut => rec.attaching = true,
                R::Other => rec.container_id = "c0".into(),
                R::Unreadable => {
                    fs::create_dir_all(dir.path().join("vf")).unwrap();
                    fs::write(dir.path().join(format!("vf/{vf}.json")), b"{").unwrap();
                    continue;
                }
            }
            store.save(&rec).unwrap();
        }
        let at_home = |vf| home[vfs.iter().position(|v| *v == vf).unwrap()];
        let got = store.left_part_way("c1", &vfs, at_home, false);
        assert_eq!(got, want, "{records:?} {home:?}");
        // With the pod's network given up, any of c1's VFs away is left.
        let away = vfs
            .iter()
            .zip(records)
            .any(|(vf, r)| matches!(r, R::Whole | R::Cut) && !at_home(*vf));
        let given_up = store.left_part_way("c1", &vfs, at_home, true);
        assert_eq!(given_up, want || away, "given up: {records:?} {home:?}");
    }
}

/// A record's removal is done once the unlink returns: a directory that then
/// fails to sync is no failed removal (its VF is home, and a failed restore
/// would quarantine it).
#[test]
fn a_removal_whose_directory_fails_to_sync_still_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let store = SavedStore::new(dir.path());
    let rec = record("c1", "0000:3b:02.3");
    store.save(&rec).unwrap();
    crate::netdev::saved::FAIL_NEXT_DIR_SYNC.set(true);
    store.remove(rec.vf()).unwrap();
    assert!(
        !crate::netdev::saved::FAIL_NEXT_DIR_SYNC.get(),
        "the sync was tried"
    );
    assert!(!store.has_record(rec.vf()));
}
