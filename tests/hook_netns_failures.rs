//! The hook's VF attach and detach when something fails, on a real kernel:
//! rollback, a host-netns container, a restore left to the pod's next owner,
//! bad input and a broken config. veth pairs stand in for VF netdevs and
//! scratch network namespaces for pods. Needs root; fails without it.
//!
//! Every test uses its own link names, namespaces and state directory, so the
//! tests can run in parallel threads.

#[path = "hook_netns/checks.rs"]
mod checks;
#[path = "hook_netns/net.rs"]
mod net;

use std::path::Path;

use checks::{assert_home, assert_in_pod, stderr};
use net::{
    action, fails_with, hook, hook_in_pod, hook_program_args, hook_unvouched, link, links, ok,
    records, require_root, state, In, Sleeper, Veth,
};

#[test]
fn a_failing_later_step_rolls_everything_back() {
    require_root();
    let pod = Sleeper::new();
    let v1 = Veth::new("dgf0v", "dgf0p", "02:00:00:0a:06:01");
    let v2 = Veth::new("dgf1v", "dgf1p", "02:00:00:0a:06:02");
    let dir = tempfile::tempdir().unwrap();
    // RDMA netlink does not exist on this kernel: the move of the RDMA device, the
    // last step, fails after the netdev was moved, renamed, configured and brought up.
    let mut rdma = action(&v2, "0000:ee:07.1", "net2", "02:00:00:0b:06:02", 9000);
    rdma.rdma_device = Some("mlx5_9".to_string());
    rdma.move_rdma = true;
    let first = action(&v1, "0000:ee:07.0", "net1", "02:00:00:0b:06:01", 9000);
    let out = hook(
        "createRuntime",
        &state("fail1", "creating", Some(pod.pid()), &[first, rdma]),
        dir.path(),
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("devgate-hook: vf 0000:ee:07.1 (dgf1v): open rdma netlink"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());
    assert_home(&v1);
    assert_home(&v2);
    assert_eq!(links(In::Pid(pod.pid())).len(), 1);
    assert_eq!(records(dir.path()), 0);

    let missing = {
        let mut a = action(&v2, "0000:ee:07.1", "net2", "02:00:00:0b:06:02", 9000);
        a.host_netdev = "dgf9v".to_string();
        a
    };
    let first = action(&v1, "0000:ee:07.0", "net1", "02:00:00:0b:06:01", 9000);
    let out = hook(
        "createRuntime",
        &state("fail2", "creating", Some(pod.pid()), &[first, missing]),
        dir.path(),
        &[],
    );
    assert!(
        stderr(&out).contains("find host netdev: host netdev dgf9v not found"),
        "{}",
        stderr(&out)
    );
    assert_home(&v1);
    assert_eq!(records(dir.path()), 0);
}

/// A hostNetwork pod's container shares the host's netns, where the kernel
/// would skip the move and the rename and settings would land on the host:
/// createRuntime fails, and the stand-in stays as it was, under its own name.
#[test]
fn a_container_in_the_host_netns_gets_no_vf() {
    require_root();
    let pod = Sleeper::on_host();
    let v = Veth::new("dgn0v", "dgn0p", "02:00:00:0a:05:01");
    let dir = tempfile::tempdir().unwrap();
    let nets = [action(
        &v,
        "0000:ee:05.0",
        "net1",
        "02:00:00:0b:05:01",
        9000,
    )];
    let out = hook(
        "createRuntime",
        &state("hostnet1", "creating", Some(pod.pid()), &nets),
        dir.path(),
        &[],
    );
    fails_with(
        &out,
        "check pod netns: the pod has no network namespace of its own",
    );
    assert_home(&v);
    assert!(link(In::Host, "net1").is_none());
    assert_eq!(records(dir.path()), 0);
}

/// A poststop whose restore fails (the stand-in's host name taken meanwhile)
/// leaves the VF in the pod with its record, and the owner keeps the network.
/// Once the owner is gone and the plugin made another container of the pod
/// its owner, that container's hook finishes the earlier restore and moves
/// the VF in again, rather than being refused as if another pod held it.
#[test]
fn the_pods_next_owner_finishes_a_restore_an_earlier_owner_left() {
    require_root();
    let pod = Sleeper::new();
    let v = Veth::new("dgo0v", "dgo0p", "02:00:00:0a:07:01");
    let dir = tempfile::tempdir().unwrap();
    let run =
        |stage: &str, st: &str| hook_in_pod(stage, st, dir.path(), "shared", &["0000:ee:08.0"]);
    let first = [action(
        &v,
        "0000:ee:08.0",
        "net1",
        "02:00:00:0b:07:01",
        9000,
    )];
    ok(&run(
        "createRuntime",
        &state("own1", "creating", Some(pod.pid()), &first),
    ));
    assert_in_pod(In::Pid(pod.pid()), "net1", "02:00:00:0b:07:01", 9000);

    // Something on the host took the stand-in's name: it cannot come home.
    let squatter = Veth::new(&v.name, "dgo0q", "02:00:00:0a:07:02");
    let out = run("poststop", &state("own1", "stopped", None, &[]));
    drop(squatter);
    fails_with(&out, "is taken by another link");
    assert_eq!(records(dir.path()), 1);
    assert_in_pod(In::Pid(pod.pid()), "net1", "02:00:00:0b:07:01", 9000);
    let ledger = devgate::ledger::Ledger::open(dir.path()).unwrap();
    let pods = ledger.snapshot().unwrap().pods;
    assert_eq!(pods["sb-shared"].network_owner.as_deref(), Some("own1"));
    // own1's ownership gone (a ledger from before a removal kept an owner
    // whose VFs are away): the next container owns the network.
    ledger
        .remove_container("sb-shared", "own1", &|_| false)
        .unwrap();

    let again = [action(
        &v,
        "0000:ee:08.0",
        "net1",
        "02:00:00:0b:07:02",
        4000,
    )];
    ok(&run(
        "createRuntime",
        &state("own2", "creating", Some(pod.pid()), &again),
    ));
    assert_in_pod(In::Pid(pod.pid()), "net1", "02:00:00:0b:07:02", 4000);
    assert_eq!(records(dir.path()), 1);
    ok(&run("poststop", &state("own2", "stopped", None, &[])));
    assert_home(&v);
    assert_eq!(records(dir.path()), 0);
}

/// A container whose attach fails while a VF an earlier container of its pod
/// moved in is still saved (that container forgotten, its restore not done)
/// does not release the pod's claims: nothing would be left to restore it.
#[test]
fn a_failed_attach_keeps_the_claims_while_a_vf_of_the_pod_is_saved() {
    require_root();
    let pod = Sleeper::new();
    let v = Veth::new("dgkc0v", "dgkc0p", "02:00:00:0a:08:01");
    let dir = tempfile::tempdir().unwrap();
    let nets = [action(
        &v,
        "0000:ee:09.0",
        "net1",
        "02:00:00:0b:08:01",
        9000,
    )];
    let run = |stage: &str, st: &str| hook_in_pod(stage, st, dir.path(), "kept", &["0000:ee:09.0"]);
    ok(&run(
        "createRuntime",
        &state("k1", "creating", Some(pod.pid()), &nets),
    ));
    // k1 is removed without its poststop: its record stays.
    let ledger = devgate::ledger::Ledger::open(dir.path()).unwrap();
    ledger
        .remove_container("sb-kept", "k1", &|_| false)
        .unwrap();
    // k2's takeover cannot restore it: the stand-in's host name is taken.
    let squatter = Veth::new(&v.name, "dgk0q", "02:00:00:0a:08:02");
    let out = run(
        "createRuntime",
        &state("k2", "creating", Some(pod.pid()), &nets),
    );
    drop(squatter);
    fails_with(&out, "is taken by another link");
    assert_eq!(records(dir.path()), 1);
    let snapshot = devgate::ledger::Ledger::read(dir.path()).unwrap();
    assert!(snapshot.pods.contains_key("sb-kept"), "claims kept");
    // k1's poststop, late, restores the VF.
    ok(&hook_unvouched(
        "poststop",
        &state("k1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    assert_home(&v);
    assert_eq!(records(dir.path()), 0);
}

/// A failed attach releases its pod's claims only where its container was
/// the only one ever recorded in the pod: a live pod whose earlier container
/// ran and was removed (kubelet removes a dead container while its pod lives
/// on) keeps them, for the teardown at its sandbox's stop.
#[test]
fn a_failed_attach_releases_only_a_pod_no_earlier_container_ran_in() {
    require_root();
    let pod = Sleeper::new();
    let v = Veth::new("dgra0v", "dgra0p", "02:00:00:0a:09:01");
    let dir = tempfile::tempdir().unwrap();
    let vf = "0000:ee:0a.0";
    let good = [action(&v, vf, "net1", "02:00:00:0b:09:01", 9000)];
    let mut gone = good.clone();
    gone[0].host_netdev = "dgra9v".to_string();
    let create = |id: &str, key: &str, nets: &[_]| {
        let st = state(id, "creating", Some(pod.pid()), nets);
        hook_in_pod("createRuntime", &st, dir.path(), key, &[vf])
    };
    let held = |key: &str| {
        let snapshot = devgate::ledger::Ledger::read(dir.path()).unwrap();
        snapshot.pods.contains_key(&format!("sb-{key}"))
    };

    fails_with(&create("o1", "once", &gone), "dgra9v");
    assert!(!held("once"), "its only container never ran");

    ok(&create("t1", "twice", &good));
    ok(&hook_unvouched(
        "poststop",
        &state("t1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    assert_home(&v);
    devgate::ledger::Ledger::open(dir.path())
        .unwrap()
        .remove_container("sb-twice", "t1", &|_| false)
        .unwrap();
    fails_with(&create("t2", "twice", &gone), "dgra9v");
    assert!(held("twice"), "t1 ran on the pod's devices");
    assert_eq!(records(dir.path()), 0);
}

#[test]
fn bad_input_fails_with_one_line() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // A stage is part of the command line: a usage error, exit 2.
        (
            "startContainer",
            state("x", "created", Some(1), &[]),
            "unknown stage",
            2,
        ),
        (
            "createRuntime",
            "{not json".to_string(),
            "parse the container state",
            1,
        ),
        (
            "createRuntime",
            state("x", "creating", Some(1), &[]).replace(
                "\"annotations\":{",
                "\"annotations\":{\"devgate.io/resolved\":\"{}\",",
            ),
            "annotation devgate.io/resolved",
            1,
        ),
    ];
    for (stage, input, want, code) in cases {
        let out = hook(stage, &input, dir.path(), &[]);
        assert_eq!(out.status.code(), Some(code), "{stage}");
        let err = stderr(&out);
        assert!(
            err.starts_with("devgate-hook: ") && err.contains(want),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn an_unreadable_config_still_gives_the_vfs_back_at_poststop() {
    require_root();
    let pod = Sleeper::new();
    let v = Veth::new("dgcf0v", "dgcf0p", "02:00:00:0a:09:01");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.toml");
    std::fs::write(&bad, "bogus_key_of_a_newer_release = 1\n").unwrap();
    let bad_env = [("DEVGATE_CONFIG", bad.to_str().unwrap())];
    let nets = [action(
        &v,
        "0000:ee:07.0",
        "net1",
        "02:00:00:0b:09:01",
        9000,
    )];
    let creating = state("cfg1", "creating", Some(pod.pid()), &nets);
    let stopped = state("cfg1", "stopped", None, &[]);

    // NRI mode acts on what the plugin resolved and never reads the config.
    ok(&hook("createRuntime", &creating, dir.path(), &bad_env));
    assert_in_pod(In::Pid(pod.pid()), "net1", "02:00:00:0b:09:01", 9000);
    ok(&hook("poststop", &stopped, dir.path(), &bad_env));
    assert_home(&v);

    // Hooks-only mode needs it, and fails. A container the plugin admitted
    // is left to the plugin's own hook, config or not.
    ok(&hook("createRuntime", &creating, dir.path(), &[]));
    assert_in_pod(In::Pid(pod.pid()), "net1", "02:00:00:0b:09:01", 9000);
    let bin = Path::new(env!("CARGO_BIN_EXE_devgate-hook"));
    let args = ["poststop", "--hooks-only"];
    let stop_without_config = || {
        let out = hook_program_args(bin, &args, &stopped, dir.path(), &bad_env);
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert!(err.contains("bogus_key_of_a_newer_release"), "{err}");
    };
    stop_without_config();
    assert_in_pod(In::Pid(pod.pid()), "net1", "02:00:00:0b:09:01", 9000);
    // One the hooks.d hook admitted has its VF back first.
    let ledger = devgate::ledger::Ledger::open(dir.path()).unwrap();
    let state = ledger.snapshot().unwrap();
    let mut record = state.pods["sb-cfg1"].containers["cfg1"].clone();
    record.hooks_only = true;
    ledger.record_container("sb-cfg1", "cfg1", record).unwrap();
    stop_without_config();
    assert_home(&v);
    assert_eq!(records(dir.path()), 0);
}
