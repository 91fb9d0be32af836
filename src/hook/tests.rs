//! Stage parsing, and what the hook does with and without a vouched annotation.
use super::*;

/// A resolved annotation moving one VF, as the plugin writes it.
const ONE_VF: &str = r#"{"version":1,"networks":[{"vf_index":0,"vf_bus_id":"0000:00:10.1","host_netdev":"veth0","container_ifname":"net1"}]}"#;

#[test]
fn stages_parse_and_unknown_ones_fail() {
    for s in ["prestart", "createRuntime", "createContainer", "poststop"] {
        assert_eq!(s.parse::<Stage>().unwrap().to_string(), s);
    }
    for s in ["startContainer", "poststart", "", "PRESTART"] {
        assert!(
            matches!(s.parse::<Stage>(), Err(HookError::Stage(_))),
            "{s}"
        );
    }
}

#[test]
fn auto_stage_follows_the_status() {
    assert_eq!(
        Stage::from_status("creating").unwrap(),
        Stage::CreateRuntime
    );
    assert_eq!(
        Stage::from_status("created").unwrap(),
        Stage::CreateRuntime,
        "crun's status at createRuntime and prestart"
    );
    assert_eq!(Stage::from_status("stopped").unwrap(), Stage::Poststop);
    for s in ["running", "paused", ""] {
        assert!(
            matches!(Stage::from_status(s), Err(HookError::AutoStage(_))),
            "{s}"
        );
    }
}

fn env(dir: &std::path::Path) -> HookEnv {
    HookEnv {
        host_root: PathBuf::from("/"),
        state_dir: dir.to_path_buf(),
        roots: NetnsRoots::default(),
    }
}

#[test]
fn without_the_annotation_or_records_there_is_nothing_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let nop = |_: &'static str| {};
    let create = State::parse(br#"{"id":"c1","status":"creating","pid":1}"#).unwrap();
    for stage in [
        Stage::Prestart,
        Stage::CreateRuntime,
        Stage::CreateContainer,
    ] {
        assert_eq!(
            run(stage, &create, &env(dir.path()), &nop).unwrap(),
            Outcome::Nothing
        );
    }
    let stop = State::parse(br#"{"id":"c1","status":"stopped"}"#).unwrap();
    assert_eq!(
        run(Stage::Poststop, &stop, &env(dir.path()), &nop).unwrap(),
        Outcome::Nothing
    );
    assert!(
        !dir.path().join("vf").exists(),
        "poststop must not create state"
    );
}

#[test]
fn an_annotation_the_ledger_does_not_vouch_for_moves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let nop = |_: &'static str| {};
    let value = ONE_VF;
    let state = State::parse(
        serde_json::json!({"id": "c1", "status": "creating", "pid": 5,
            "annotations": {RESOLVED_ANNOTATION: value}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let e = run(Stage::CreateRuntime, &state, &env(dir.path()), &nop).unwrap_err();
    assert!(matches!(e, HookError::Unvouched { .. }), "{e}");
    assert!(e
        .to_string()
        .starts_with("container c1: annotation devgate.io/resolved"));
    assert!(
        !dir.path().join("vf").exists(),
        "nothing saved, nothing moved"
    );
}

#[test]
fn attach_needs_a_creating_container_with_a_pid() {
    let dir = tempfile::tempdir().unwrap();
    let nop = |_: &'static str| {};
    let value = ONE_VF;
    let state = |status: &str, pid: &str| {
        let json = serde_json::json!({"id": "c1", "status": status, "pid": serde_json::from_str::<serde_json::Value>(pid).unwrap(),
            "annotations": {RESOLVED_ANNOTATION: value}});
        State::parse(json.to_string().as_bytes()).unwrap()
    };
    let e = run(
        Stage::CreateRuntime,
        &state("creating", "0"),
        &env(dir.path()),
        &nop,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "createRuntime: the container state has no pid"
    );
    let e = run(
        Stage::Prestart,
        &state("running", "5"),
        &env(dir.path()),
        &nop,
    )
    .unwrap_err();
    assert!(e.to_string().contains("status is \"running\""), "{e}");
    // crun's status at createRuntime, and a state without one, pass the
    // status check and reach the next one: the ledger's word.
    for status in ["created", ""] {
        let e = run(
            Stage::CreateRuntime,
            &state(status, "5"),
            &env(dir.path()),
            &nop,
        )
        .unwrap_err();
        assert!(matches!(e, HookError::Unvouched { .. }), "{status}: {e}");
    }
}

/// A teardown that says when it runs and returns once let go: a release
/// caught between its teardown and its commit.
struct Gate {
    entered: std::sync::mpsc::Sender<()>,
    go: std::sync::mpsc::Receiver<()>,
}

impl crate::ledger::Teardown for Gate {
    fn teardown(&self, _: &crate::ledger::PodRecord) -> Result<(), crate::ledger::Unclean> {
        self.entered.send(()).unwrap();
        self.go.recv().unwrap();
        Ok(())
    }
}

/// A release of the pod that found no VF moved (its teardown done, its commit
/// to come) holds the VF's turn: the hook waits for the commit and then finds
/// the ledger no longer vouching, rather than moving the VF into a pod whose
/// claims are about to go.
#[test]
fn an_attach_during_its_pods_release_waits_for_it_and_moves_nothing() {
    use crate::ledger::{Claim, ContainerRecord, DeviceId, Ledger, Share};
    let dir = tempfile::tempdir().unwrap();
    let pod = crate::ledger::tests::pod("sb");
    let vf = Claim {
        device: DeviceId::Vf("0000:00:10.1".parse().unwrap()),
        share: Share::Exclusive,
        pf: None,
    };
    let record = ContainerRecord {
        resolved: Some(ONE_VF.into()),
        ..crate::ledger::tests::record("main")
    };
    let ledger = Ledger::open(dir.path()).unwrap();
    ledger.admit(&pod, &[vf], "c1", record, true).unwrap();
    // The host's own netns: an attach that got past the ledger would fail
    // there, before moving anything, with another error than the refusal.
    let state = State::parse(
        serde_json::json!({"id": "c1", "status": "creating", "pid": std::process::id(),
            "annotations": {RESOLVED_ANNOTATION: ONE_VF}})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        // Dropped by a failing assertion below, so the release ends rather
        // than wait for it and hang the test.
        let go = go;
        let release = s.spawn(|| {
            let gate = Gate {
                entered: entered_tx,
                go: go_rx,
            };
            ledger.release_pod("sb", &gate).unwrap()
        });
        entered.recv().unwrap();
        let hook = s.spawn(|| {
            let nop = |_: &'static str| {};
            run(Stage::CreateRuntime, &state, &env(dir.path()), &nop)
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!hook.is_finished(), "the hook waits for the release");
        go.send(()).unwrap();
        assert_eq!(release.join().unwrap().pods, std::slice::from_ref(&pod));
        let e = hook.join().unwrap().unwrap_err();
        assert!(matches!(e, HookError::Unvouched { .. }), "{e}");
    });
    assert!(
        !dir.path().join("vf").exists(),
        "nothing saved, nothing moved"
    );
}

/// The owner's VFs stay in the pod only while another container the ledger
/// records for the pod runs in their namespace, and only when every move was
/// whole: a VF an attach or restore left part way is restored at poststop.
/// Staying, poststop changes nothing: the record and the owner are kept.
#[test]
fn vfs_stay_for_a_running_sibling_only_when_whole() {
    use crate::ledger::{ContainerRecord, Ledger, PodRef};
    const OWNER: &str = "0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e";
    const SIDE: &str = "51de51de51de51de51de51de51de51de51de51de51de51de51de51de51de51de";
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let proc = dir.path().join("proc");
    let mut env = env(&state);
    env.roots.proc_root = proc.clone();
    let mut rec = crate::netdev::SavedVf::example(OWNER, "0000:00:10.1");
    let store = SavedStore::new(&state);
    store.save(&rec).unwrap();
    let runs_on =
        |rec: &crate::netdev::SavedVf| pod_runs_on(&env, OWNER, std::slice::from_ref(rec));
    assert_eq!(runs_on(&rec), None, "no pod in the ledger");

    let pod = PodRef {
        sandbox_id: "sb".into(),
        namespace: "ns".into(),
        name: "p".into(),
        uid: "u".into(),
    };
    let ledger = Ledger::open(&state).unwrap();
    let record = || ContainerRecord {
        name: "c".into(),
        devices: Vec::new(),
        applied_unix: 0,
        init: None,
        cgroups: Vec::new(),
        resolved: None,
        resolved_sha256: None,
        hooks_only: false,
    };
    let gpu = crate::ledger::Claim {
        device: crate::ledger::DeviceId::Gpu("GPU-0".into()),
        share: crate::ledger::Share::Exclusive,
        pf: None,
    };
    for id in [OWNER, SIDE] {
        ledger
            .admit(&pod, std::slice::from_ref(&gpu), id, record(), false)
            .unwrap();
    }
    assert!(Ledger::read(&state).unwrap().pod_of(SIDE).is_some());
    assert_eq!(runs_on(&rec), None, "the sibling does not run");

    // The sibling's process, in the VF's namespace and its own cgroup.
    let side = proc.join("77");
    std::fs::create_dir_all(side.join("ns")).unwrap();
    let ns = format!("net:[{}]", rec.netns.id.ino);
    std::os::unix::fs::symlink(ns, side.join("ns/net")).unwrap();
    std::fs::write(side.join("cgroup"), format!("0::/k8s.io/{SIDE}\n")).unwrap();
    assert_eq!(runs_on(&rec), Some(("sb".to_string(), 77)));

    let owner_state =
        State::parse(format!(r#"{{"id":"{OWNER}","status":"stopped"}}"#).as_bytes()).unwrap();
    let nop = |_: &'static str| {};
    let out = run(Stage::Poststop, &owner_state, &env, &nop).unwrap();
    assert_eq!(out, Outcome::Nothing);
    assert_eq!(
        store.for_container(OWNER).unwrap().len(),
        1,
        "the record stays"
    );
    rec.attaching = true;
    assert_eq!(runs_on(&rec), None, "a cut attach is finished");
    rec.attaching = false;
    rec.restoring = true;
    assert_eq!(runs_on(&rec), None, "a cut restore is finished");
}
