//! VF attach and detach on a real kernel, with veth pairs standing in for VF
//! netdevs and scratch network namespaces for pods. Needs root; fails without it.
//!
//! Every test uses its own link names, namespaces and state directory, so the
//! tests can run in parallel threads.

#[path = "hook_netns/checks.rs"]
mod checks;
#[path = "hook_netns/net.rs"]
mod net;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use checks::{assert_home, assert_in_pod, stderr};
use devgate::netdev::{self, Netns, NetnsRoots, SavedStore, SysNetEnv, VfOps};
use net::{
    action, hook, hook_unvouched, link, links, ok, records, require_root, state, In, NamedNs,
    Sleeper, Veth,
};

fn nop(_: &'static str) {}

/// Does what the kernel does to a physical netdev whose netns dies: back to the
/// host as `dev<ifindex>` (test-environment.md; veths would die with the netns).
fn return_like_the_kernel(pod: &NamedNs, ifname: &str) -> String {
    let l = link(In::Named(&pod.0), ifname).unwrap();
    let fallback = format!("dev{}", l.ifindex);
    net::sh(&[
        "ip", "-n", &pod.0, "link", "set", ifname, "netns", "1", "name", &fallback,
    ]);
    pod.delete();
    fallback
}

#[test]
fn library_attach_and_detach_in_a_named_netns() {
    require_root();
    let pod = NamedNs::new("dg-lib");
    let v = Veth::new("dgl0v", "dgl0p", "02:00:00:0a:00:01");
    let dir = tempfile::tempdir().unwrap();
    let store = SavedStore::new(dir.path());
    let mut env = SysNetEnv::new(NetnsRoots::default()).unwrap();
    let mut ops = VfOps {
        env: &mut env,
        store: &store,
        checkpoint: &nop,
    };
    let ns = Netns::open(Path::new("/run/netns/dg-lib")).unwrap();
    let a = action(&v, "0000:ee:01.0", "net1", "02:00:00:0b:00:01", 9000);
    netdev::attach_all(&mut ops, "lib1", &ns, None, &[a]).unwrap();
    assert_in_pod(In::Named(&pod.0), "net1", "02:00:00:0b:00:01", 9000);
    assert!(link(In::Host, &v.name).is_none());
    drop(ns);
    let detach = |ops: &mut VfOps| {
        let vfs = store.vfs_of("lib1").unwrap();
        netdev::detach_listed(ops, "lib1", &vfs).unwrap()
    };
    assert_eq!(detach(&mut ops), 1);
    assert_home(&v);
    assert!(link(In::Named(&pod.0), "net1").is_none());
    assert_eq!(detach(&mut ops), 0);
    assert_home(&v);
}

/// A pod can write annotations (CRI-O passes them to the OCI spec): the plugin's
/// annotation without the plugin's ledger record moves and configures nothing.
#[test]
fn a_forged_resolved_annotation_moves_nothing() {
    require_root();
    let pod = Sleeper::new();
    let v = Veth::new("dgfg0v", "dgfg0p", "02:00:00:0a:0f:01");
    let dir = tempfile::tempdir().unwrap();
    let nets = [action(
        &v,
        "0000:ee:0f.0",
        "net1",
        "02:00:00:0b:0f:01",
        9000,
    )];
    let forged = state("forged1", "creating", Some(pod.pid()), &nets);
    let out = hook_unvouched("createRuntime", &forged, dir.path(), &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("devgate-hook: container forged1: annotation devgate.io/resolved")
            && err.contains("pods cannot grant themselves devices"),
        "{err}"
    );
    assert_home(&v);
    assert!(link(In::Pid(pod.pid()), "net1").is_none());
    assert_eq!(records(dir.path()), 0);
    // The same annotation once the plugin's record vouches for it.
    ok(&hook("createRuntime", &forged, dir.path(), &[]));
    assert_in_pod(In::Pid(pod.pid()), "net1", "02:00:00:0b:0f:01", 9000);
    ok(&hook(
        "poststop",
        &state("forged1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    assert_home(&v);
}

#[test]
fn hook_moves_vfs_into_the_container_netns_and_poststop_restores() {
    require_root();
    let pod = Sleeper::new();
    let v1 = Veth::new("dgh0v", "dgh0p", "02:00:00:0a:01:01");
    let v2 = Veth::new("dgh1v", "dgh1p", "02:00:00:0a:01:02");
    let dir = tempfile::tempdir().unwrap();
    let nets = [
        action(&v1, "0000:ee:02.0", "net1", "02:00:00:0b:01:01", 9000),
        action(&v2, "0000:ee:02.1", "net2", "02:00:00:0b:01:02", 4000),
    ];
    let out = hook(
        "createRuntime",
        &state("e2e1", "creating", Some(pod.pid()), &nets),
        dir.path(),
        &[],
    );
    ok(&out);
    assert_in_pod(In::Pid(pod.pid()), "net1", "02:00:00:0b:01:01", 9000);
    assert_in_pod(In::Pid(pod.pid()), "net2", "02:00:00:0b:01:02", 4000);
    assert!(link(In::Host, &v1.name).is_none() && link(In::Host, &v2.name).is_none());
    assert_eq!(records(dir.path()), 2);
    // A second stage for the same container (prestart after createRuntime) changes nothing.
    ok(&hook(
        "prestart",
        &state("e2e1", "creating", Some(pod.pid()), &nets),
        dir.path(),
        &[],
    ));
    assert_in_pod(In::Pid(pod.pid()), "net1", "02:00:00:0b:01:01", 9000);
    assert_in_pod(In::Pid(pod.pid()), "net2", "02:00:00:0b:01:02", 4000);
    assert_eq!(records(dir.path()), 2);
    let log = std::fs::read_to_string(dir.path().join("hook.log")).unwrap();
    assert!(log.contains("hook done"), "{log}");

    ok(&hook(
        "poststop",
        &state("e2e1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    assert_home(&v1);
    assert_home(&v2);
    let pod_links: Vec<String> = links(In::Pid(pod.pid()))
        .into_iter()
        .map(|l| l.ifname)
        .collect();
    assert_eq!(pod_links, ["lo"]);
    assert_eq!(records(dir.path()), 0);
}

#[test]
fn poststop_after_the_netns_is_gone() {
    require_root();
    let pod = NamedNs::new("dg-gone");
    let v = Veth::new("dgg0v", "dgg0p", "02:00:00:0a:02:01");
    let dir = tempfile::tempdir().unwrap();
    let ns = Netns::open(Path::new("/run/netns/dg-gone")).unwrap();
    let store = SavedStore::new(dir.path());
    let mut env = SysNetEnv::new(NetnsRoots::default()).unwrap();
    let mut ops = VfOps {
        env: &mut env,
        store: &store,
        checkpoint: &nop,
    };
    let a = action(&v, "0000:ee:03.0", "net1", "02:00:00:0b:02:01", 9000);
    netdev::attach_all(&mut ops, "gone1", &ns, None, &[a]).unwrap();
    drop(ns);
    let fallback = return_like_the_kernel(&pod, "net1");
    assert!(link(In::Host, &fallback).is_some());
    ok(&hook(
        "poststop",
        &state("gone1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    assert_home(&v);
    assert!(link(In::Host, &fallback).is_none());
    assert_eq!(records(dir.path()), 0);
}

#[test]
fn killed_midway_then_poststop_restores() {
    require_root();
    for (i, checkpoint) in ["save", "move", "configure"].into_iter().enumerate() {
        let pod = Sleeper::new();
        let v = Veth::new(
            &format!("dgk{i}v"),
            &format!("dgk{i}p"),
            "02:00:00:0a:03:01",
        );
        let dir = tempfile::tempdir().unwrap();
        let a = action(&v, "0000:ee:04.0", "net1", "02:00:00:0b:03:01", 9000);
        let fault = format!("abort-after:{checkpoint}");
        let out = hook(
            "createRuntime",
            &state("kill1", "creating", Some(pod.pid()), &[a]),
            dir.path(),
            &[("DEVGATE_HOOK_FAULT", &fault)],
        );
        assert_eq!(out.status.signal(), Some(9), "{checkpoint}: {out:?}");
        assert_eq!(
            records(dir.path()),
            1,
            "{checkpoint}: the record is written before any change"
        );
        let moved = link(In::Pid(pod.pid()), "net1").is_some();
        assert_eq!(moved, checkpoint != "save", "{checkpoint}");
        ok(&hook(
            "poststop",
            &state("kill1", "stopped", None, &[]),
            dir.path(),
            &[],
        ));
        assert_home(&v);
        assert!(link(In::Pid(pod.pid()), "net1").is_none(), "{checkpoint}");
        assert_eq!(records(dir.path()), 0, "{checkpoint}");
    }
}

#[test]
fn a_host_link_already_named_like_the_target_is_left_alone() {
    require_root();
    let squatter = Veth::new("net1", "dgs0q", "02:00:00:0a:04:99");
    let pod = NamedNs::new("dg-squat");
    let v = Veth::new("dgs0v", "dgs0p", "02:00:00:0a:04:01");
    let dir = tempfile::tempdir().unwrap();
    let a = action(&v, "0000:ee:05.0", "net1", "02:00:00:0b:04:01", 9000);
    let pid = Sleeper::in_named(&pod.0);
    ok(&hook(
        "createRuntime",
        &state("squat1", "creating", Some(pid.0.id()), &[a]),
        dir.path(),
        &[],
    ));
    assert_in_pod(In::Named(&pod.0), "net1", "02:00:00:0b:04:01", 9000);
    assert_eq!(
        link(In::Host, "net1").unwrap().address.as_deref(),
        Some(squatter.mac.as_str())
    );
    // The netns goes away; net1 is taken on the host, so the VF would come back as dev<N>.
    drop(pid);
    return_like_the_kernel(&pod, "net1");
    ok(&hook(
        "poststop",
        &state("squat1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    assert_home(&v);
    assert_eq!(
        link(In::Host, "net1").unwrap().address.as_deref(),
        Some(squatter.mac.as_str())
    );
}

/// The pod netns already holds a link named like the VF on the host: the move
/// and the rename are one request (the kernel moves it under the new name,
/// `__dev_change_net_namespace`), so the VF arrives as net1 and the pod's
/// link is left alone, there and when the VF goes home.
#[test]
fn a_pod_link_named_like_the_vf_on_the_host_is_left_alone() {
    require_root();
    let pod = NamedNs::new("dg-hname");
    let v = Veth::new("dgn1v", "dgn1p", "02:00:00:0a:0c:01");
    let pods_own = "02:00:00:0a:0c:99";
    net::sh(&[
        "ip", "-n", &pod.0, "link", "add", "dgn1v", "address", pods_own, "type", "veth", "peer",
        "name", "dgn1w",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let a = action(&v, "0000:ee:0c.0", "net1", "02:00:00:0b:0c:01", 9000);
    let pid = Sleeper::in_named(&pod.0);
    ok(&hook(
        "createRuntime",
        &state("hname1", "creating", Some(pid.0.id()), &[a]),
        dir.path(),
        &[],
    ));
    assert_in_pod(In::Named(&pod.0), "net1", "02:00:00:0b:0c:01", 9000);
    let own = || link(In::Named(&pod.0), "dgn1v").map(|l| l.address);
    assert_eq!(own(), Some(Some(pods_own.to_string())));
    ok(&hook(
        "poststop",
        &state("hname1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    assert_home(&v);
    assert!(link(In::Named(&pod.0), "net1").is_none());
    assert_eq!(
        own(),
        Some(Some(pods_own.to_string())),
        "the pod's own link"
    );
}

#[test]
fn detach_twice_and_detach_without_a_record_change_nothing() {
    require_root();
    let pod = Sleeper::new();
    let v = Veth::new("dgt0v", "dgt0p", "02:00:00:0a:05:01");
    let dir = tempfile::tempdir().unwrap();
    let a = action(&v, "0000:ee:06.0", "net1", "02:00:00:0b:05:01", 9000);
    ok(&hook(
        "poststop",
        &state("twice1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    assert!(!dir.path().join("vf").exists());
    ok(&hook(
        "createRuntime",
        &state("twice1", "creating", Some(pod.pid()), &[a]),
        dir.path(),
        &[],
    ));
    ok(&hook(
        "poststop",
        &state("twice1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    let before = link(In::Host, &v.name).unwrap();
    ok(&hook(
        "poststop",
        &state("twice1", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    ok(&hook(
        "poststop",
        &state("someone-else", "stopped", None, &[]),
        dir.path(),
        &[],
    ));
    let after = link(In::Host, &v.name).unwrap();
    assert_eq!(
        (before.ifindex, before.address, before.mtu),
        (after.ifindex, after.address, after.mtu)
    );
    assert_home(&v);
}
