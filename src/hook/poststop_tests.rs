//! NRI mode's poststop of a pod's network owner: decided again under the
//! VFs' turns and the ledger's lock, the network given up before the restore.

use super::*;
use crate::ledger::{Claim, ContainerRecord, DeviceId, Ledger, NetworkNeed, PodRef, Share};
use crate::netdev::SavedVf;

const OWNER: &str = "0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e";
const JOIN: &str = "j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0j0";

fn record() -> ContainerRecord {
    crate::ledger::tests::record("c")
}

/// A pod whose network OWNER moved its VF in (its saved record), under
/// `state`, with an empty proc root: no container runs beside the VF.
struct Pod {
    _dir: tempfile::TempDir,
    env: HookEnv,
    ledger: Ledger,
    pod: PodRef,
    vf: Claim,
}

fn pod() -> Pod {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let env = HookEnv {
        host_root: dir.path().join("host"),
        state_dir: state.clone(),
        roots: NetnsRoots {
            proc_root: dir.path().join("proc"),
            ..NetnsRoots::default()
        },
    };
    let mut saved = SavedVf::example(OWNER, "0000:00:10.1");
    // A name no host has: its restore fails at finding it, touching nothing.
    saved.attach.host_netdev = "dgnone9z".into();
    saved.host.name = "dgnone9z".into();
    SavedStore::new(&state).save(&saved).unwrap();
    let pod = PodRef {
        sandbox_id: "sb".into(),
        namespace: "ns".into(),
        name: "p".into(),
        uid: "u".into(),
    };
    let vf = Claim {
        device: DeviceId::Vf(saved.vf()),
        share: Share::Exclusive,
        pf: None,
    };
    let ledger = Ledger::open(&state).unwrap();
    ledger
        .admit(&pod, std::slice::from_ref(&vf), OWNER, record(), true)
        .unwrap();
    Pod {
        _dir: dir,
        env,
        ledger,
        pod,
        vf,
    }
}

fn owner(p: &Pod) -> Option<String> {
    p.ledger.network_owner("sb").unwrap()
}

/// JOIN admitted as the plugin admits a container of a pod whose VFs its
/// network owner moved in: relying on them, moving none.
fn join(p: &Pod) -> Result<crate::ledger::Admission, crate::ledger::LedgerError> {
    p.ledger.admit_or_take_over(
        &p.pod,
        std::slice::from_ref(&p.vf),
        JOIN,
        record(),
        NetworkNeed::InPod,
        &|_| false,
    )
}

/// A container admitted into the pod's network between the poststop's
/// first look and its turns relies on the VF the owner moved in (the plugin
/// moved none for it): the VF stays in the pod, its record and the owner
/// kept, for the pod's stop to restore.
#[test]
fn a_container_that_joined_meanwhile_keeps_the_vfs_in_the_pod() {
    let p = pod();
    assert_eq!(owner(&p).as_deref(), Some(OWNER));
    let join = |at: &'static str| {
        if at == "restore-turns" {
            join(&p).unwrap();
        }
    };
    let stopped =
        State::parse(format!(r#"{{"id":"{OWNER}","status":"stopped"}}"#).as_bytes()).unwrap();
    let out = run(Stage::Poststop, &stopped, &p.env, &join).unwrap();
    assert_eq!(out, Outcome::Nothing);
    assert_eq!(owner(&p).as_deref(), Some(OWNER), "the owner kept");
    let store = SavedStore::new(&p.env.state_dir);
    assert_eq!(
        store.for_container(OWNER).unwrap().len(),
        1,
        "the record stays"
    );
}

/// With no container joined, the owner gives the network up before any VF
/// moves, so a container admitted from then on finds no owner: refused
/// while the VF is not home, the network's new owner once it is. A
/// container that owns nothing gives nothing up.
#[test]
fn the_owner_gives_the_network_up_before_the_restore() {
    let p = pod();
    let vfs = SavedStore::new(&p.env.state_dir).vfs_of(OWNER).unwrap();
    let seen = Ledger::read(&p.env.state_dir)
        .unwrap()
        .pod_of(OWNER)
        .cloned()
        .unwrap();
    // Nothing runs beside the VF (an empty proc root).
    let give_up = |id: &str| {
        let nop = |_: &'static str| {};
        kept_network::give_up_in_turn(&p.ledger, &seen, id, &vfs, &nop, &|_| false).map(|g| g.0)
    };
    let given = give_up(JOIN).unwrap();
    assert_eq!(given, crate::ledger::GiveUp::Given);
    assert_eq!(owner(&p).as_deref(), Some(OWNER), "not JOIN's to give");

    let given = give_up(OWNER).unwrap();
    assert_eq!(given, crate::ledger::GiveUp::Given);
    assert_eq!(owner(&p), None);
    let e = join(&p).unwrap_err();
    assert!(
        matches!(e, crate::ledger::LedgerError::NetworkReturned { .. }),
        "{e}"
    );
}

/// A restore that fails after the owner gave the network up takes it back:
/// the VF may sit in the pod, where the pod's next container relies on it.
#[test]
fn a_failed_restore_takes_the_network_back() {
    let p = pod();
    let stopped =
        State::parse(format!(r#"{{"id":"{OWNER}","status":"stopped"}}"#).as_bytes()).unwrap();
    let nop = |_: &'static str| {};
    let e = run(Stage::Poststop, &stopped, &p.env, &nop).unwrap_err();
    assert!(e.to_string().contains("dgnone9z"), "{e}");
    assert_eq!(owner(&p).as_deref(), Some(OWNER));
    let store = SavedStore::new(&p.env.state_dir);
    assert_eq!(
        store.for_container(OWNER).unwrap().len(),
        1,
        "the record stays"
    );
}
