//! `devgate plan`'s warnings and notes: what the plan would meet at admission.
use super::*;

use devgate::ledger::{Claim, DeviceId, Ledger, PodRef, Share};

/// `holder` (pod `ml/<name>`) holds `gpu` whole and the first VF of the
/// fixture's first NIC, which the plans below ask for whole.
fn holds(state: &Path, fx: &Fixture, name: &str, uid: &str, gpu: &str) -> Ledger {
    let holder = PodRef {
        sandbox_id: format!("s-{uid}"),
        namespace: "ml".into(),
        name: name.into(),
        uid: uid.into(),
    };
    let gpu = Claim {
        device: DeviceId::Gpu(gpu.to_string()),
        share: Share::Exclusive,
        pf: None,
    };
    let nic = &fx.expected().rdma[0];
    let vf = Claim {
        device: DeviceId::Vf(nic.vfs[0].bus_id),
        share: Share::Exclusive,
        pf: Some(nic.bus_id),
    };
    let ledger = Ledger::open(state).unwrap();
    ledger.claim(&holder, &[gpu, vf]).unwrap();
    ledger
}

/// The plan of `annotation` against the ledger in `state`, which must
/// succeed, and the warnings `want` among its warnings.
fn warns(fx: &Fixture, state: &Path, annotation: &str, want: &[String]) {
    let out = plan_cmd_with_state(
        fx.root(),
        allocated(annotation).to_string().as_bytes(),
        state,
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let warnings = plan["warnings"].as_array().unwrap();
    for want in want {
        assert!(warnings.iter().any(|w| w == &json!(want)), "{want}: {plan}");
    }
}

/// The warning of a VF that pod `holder` holds of the NIC asked for whole.
fn pf_vf_warning(fx: &Fixture, holder: &str) -> String {
    let nic = &fx.expected().rdma[0];
    format!(
        "pf {} conflicts with vf {}, held by pod {holder}: a pf used whole excludes its vfs from other pods",
        nic.bus_id, nic.vfs[0].bus_id
    )
}

/// With `--state-dir`, devices another pod holds are warnings in the plan; the
/// ledger is read, never written.
#[test]
fn devices_held_by_other_pods_are_warnings() {
    let (dir, fx) = fixture();
    let gpu = &fx.expected().gpus[2];
    let state = dir.path().join("state");
    holds(&state, &fx, "other", "u1", &gpu.uuid);
    let before = std::fs::read(state.join("ledger.json")).unwrap();
    let nic = &fx.expected().rdma[0];
    let annotation = format!(
        r#"{{"gpu":[{{"minor":{},"id":"{}","resources":{{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}}}],"rdma":[{{"minor":0,"id":"{}","resources":{{"koordinator.sh/rdma":"100"}}}}]}}"#,
        gpu.minor, gpu.uuid, nic.bus_id
    );
    let held = format!("gpu {} is held by ml/other (exclusive)", gpu.uuid);
    warns(
        &fx,
        &state,
        &annotation,
        &[held, pf_vf_warning(&fx, "ml/other")],
    );
    assert_eq!(std::fs::read(state.join("ledger.json")).unwrap(), before);
}

/// The plan reads GPU health where the node config keeps it, as the plugin
/// does: an unhealthy GPU shows as a warning.
#[test]
fn unhealthy_gpus_are_warnings() {
    let (dir, fx) = fixture();
    let gpu = &fx.expected().gpus[1];
    let health = dir.path().join("health");
    devgate::gpu::HealthStore::new(&health)
        .mark(&gpu.uuid, &[devgate::gpu::health::Fault::DoubleBitEcc], 1)
        .unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[gpu]\nhealth_dir = \"{}\"\n", health.display()),
    )
    .unwrap();
    let annotation = format!(r#"{{"gpu":[{{"minor":{}}}]}}"#, gpu.minor);
    let plan = plan_ok(
        fx.root(),
        &allocated(&annotation),
        &["--config", config.to_str().unwrap()],
    );
    let warnings = plan["warnings"].to_string();
    assert!(
        warnings.contains(&format!("gpu[0]: gpu minor {} is unhealthy", gpu.minor)),
        "{plan}"
    );
}

/// A VF whose netdev moves into the pod takes its addresses, and so its GID
/// slots, from the pod: no index from the host's table, a note rather than a
/// warning, shown under NOTES by the table.
#[test]
fn a_moved_vf_without_a_host_gid_is_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let fx = HostRootBuilder::hgx()
        .build(&dir.path().join("root"))
        .unwrap();
    let inv = fx.expected();
    let nic = &inv.rdma[1];
    let vf = &nic.vfs[0];
    let ann = format!(
        r#"{{"rdma":[{{"minor":1,"id":"{}","extension":{{"vfs":[{{"busID":"{}"}}]}}}}]}}"#,
        nic.bus_id, vf.bus_id
    );
    let p = allocated(&ann);
    let plan = plan_ok(fx.root(), &p, &[]);
    assert!(plan["env"].get("NCCL_IB_GID_INDEX").is_none(), "{plan}");
    assert_eq!(plan["warnings"], json!([]));
    let notes = plan["notes"].to_string();
    assert!(
        notes.contains("NCCL_IB_GID_INDEX not set") && notes.contains("moves into the pod"),
        "{plan}"
    );

    let text = plan_table(fx.root(), &p, &[]);
    assert!(
        text.contains("\nNOTES\ncomm_env: NCCL_IB_GID_INDEX not set"),
        "{text}"
    );
    assert!(!text.contains("WARNINGS"), "{text}");
}

/// A quarantined GPU, and a GPU and a VF an earlier pod of the same name
/// (another UID: a StatefulSet's pod made again) still holds, are
/// warnings: the plugin refuses these claims.
#[test]
fn quarantined_devices_and_earlier_pods_of_the_same_name_are_warnings() {
    let (dir, fx) = fixture();
    let (quarantined, held) = (&fx.expected().gpus[0], &fx.expected().gpus[1]);
    let state = dir.path().join("state");
    let ledger = holds(&state, &fx, "train-0", "old-uid", &held.uuid);
    ledger
        .quarantine(
            &DeviceId::Gpu(quarantined.uuid.clone()),
            "still open in pid 42 outside the pod",
        )
        .unwrap();
    let nic = &fx.expected().rdma[0];
    let annotation = format!(
        r#"{{"gpu":[{{"minor":{}}},{{"minor":{}}}],"rdma":[{{"minor":0,"id":"{}","resources":{{"koordinator.sh/rdma":"100"}}}}]}}"#,
        quarantined.minor, held.minor, nic.bus_id
    );
    let want = [
        format!(
            "gpu {} is quarantined: still open in pid 42 outside the pod",
            quarantined.uuid
        ),
        format!("gpu {} is held by ml/train-0 (exclusive)", held.uuid),
        pf_vf_warning(&fx, "ml/train-0"),
    ];
    warns(&fx, &state, &annotation, &want);
}
