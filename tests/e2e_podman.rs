//! Hooks-only mode end to end with podman 4.3 and runc: the shipped hooks.d
//! file (pointed at the built `devgate-hook` and a simulated HGX host root)
//! gives a container with the Koordinator annotation its device nodes, device
//! cgroup rules and VF, with no NRI plugin anywhere. Needs root; fails without it.
//!
//! podman runs with private storage under a temp dir, so tests never share a
//! container or image store.
mod support;

#[path = "e2e_podman/harness.rs"]
mod harness;
#[path = "hook_netns/net.rs"]
mod net;

use std::path::PathBuf;
use std::process::Output;

use devgate::allocation::DEVICE_ALLOCATED;
use devgate::fixture::HostRootBuilder;
use devgate::ledger::Ledger;
use harness::{annotation_arg, hook_log, hooks_dir, hooks_only, Podman, ULIMITS};
use net::{link, In, NamedNs, Veth};
use support::node::{allocation, gpu_entry, vf_entry};
use support::{require_root, wait_for, SLOW, WORKLOAD_IMAGE};

/// A simulated HGX host with a veth stand-in for one VF, podman with the
/// hooks file, and a pinned netns for the container; names start with `tag`.
struct Setup {
    // Dropped in this order: podman's containers before the netns and the
    // stand-in, the temp dir with podman's store last.
    podman: Podman,
    pod_ns: NamedNs,
    _stand_in: Veth,
    fixture: devgate::fixture::Fixture,
    state: PathBuf,
    config: PathBuf,
    host_name: String,
    alloc: String,
    _dir: tempfile::TempDir,
}

const VF_MAC: &str = "02:00:00:de:0b:01";

fn setup(tag: &str, fault: Option<&str>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx()
        .vf_netdev_prefix(tag)
        .build(&dir.path().join("host"))
        .unwrap();
    let inv = fixture.expected();
    let gpu = &inv.gpus[0];
    let (pf, vf) = (&inv.rdma[0], &inv.rdma[0].vfs[1]);
    let host_name = vf.netdev.clone().expect("fixture vf netdev");
    let stand_in = Veth::new(&host_name, &format!("{tag}peer"), VF_MAC);
    let alloc = allocation(
        &[gpu_entry(gpu.minor, &gpu.uuid)],
        &[vf_entry(0, pf.bus_id, vf.bus_id)],
    );
    let (podman, state, config) = hooks_only(dir.path(), fixture.root(), fault);
    // The container's own netns, pinned like a pod's: a veth stand-in would die
    // with an unpinned one (a real VF returns to the host), leaving nothing to restore.
    let pod_ns = NamedNs::new(tag);
    Setup {
        podman,
        pod_ns,
        _stand_in: stand_in,
        fixture,
        state,
        config,
        host_name,
        alloc,
        _dir: dir,
    }
}

impl Setup {
    /// `podman run --detach` of `sleep 300` named `name` with the annotation.
    fn run(&self, name: &str) -> Output {
        self.run_in(name, None)
    }

    /// [`Setup::run`] in the podman pod `pod`, when given: podman writes
    /// CRI-O's `io.kubernetes.cri-o.SandboxID`, the pod's id, into the spec
    /// of each of its containers.
    fn run_in(&self, name: &str, pod: Option<&str>) -> Output {
        let netns = format!("ns:/run/netns/{}", self.pod_ns.0);
        let annotation = annotation_arg(DEVICE_ALLOCATED, &self.alloc);
        let mut args = vec!["run", "--detach", "--name", name];
        if let Some(pod) = pod {
            args.extend(["--pod", pod]);
        }
        args.extend(["--network", &netns]);
        args.extend(ULIMITS);
        args.extend(["--annotation", &annotation, WORKLOAD_IMAGE, "sleep", "300"]);
        self.podman.cmd(&args)
    }

    fn log(&self) -> String {
        hook_log(&self.state)
    }

    /// The VF is back on the host under its name and MAC, the ledger holds
    /// nothing and nothing is quarantined.
    fn assert_all_back(&self) {
        let back = wait_for("vf back on the host", SLOW, || {
            link(In::Host, &self.host_name)
        });
        assert_eq!(back.address.as_deref(), Some(VF_MAC));
        wait_for("claims released", SLOW, || {
            let l = Ledger::open(&self.state).ok()?.snapshot().ok()?;
            l.pods.is_empty().then_some(())
        });
        // Released clean: a failed teardown would have left quarantined devices.
        let after = Ledger::open(&self.state).unwrap().snapshot().unwrap();
        let quarantined: Vec<_> = after
            .devices
            .values()
            .filter(|d| d.quarantine.is_some())
            .collect();
        assert!(quarantined.is_empty(), "{quarantined:?}\n{}", self.log());
        assert!(after.devices.is_empty(), "{after:?}");
    }
}

#[test]
fn podman_container_gets_its_devices_and_vf_from_the_hooks_file() {
    require_root();
    let s = setup("dgpm", None);
    let inv = s.fixture.expected();
    let (gpu, other_gpu) = (&inv.gpus[0], &inv.gpus[1]);
    let vf = &inv.rdma[0].vfs[1];
    let uverbs = vf.rdma.as_ref().expect("vf rdma").char_devs[0].name.clone();
    let (podman, state, host_name) = (&s.podman, &s.state, &s.host_name);
    let out = s.run("dgpm");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    let gpu_node = format!("/dev/nvidia{}", gpu.minor);
    let (code, out) = podman.exec(
        "dgpm",
        &format!("stat -c '%n %t %T' {gpu_node} /dev/nvidiactl /dev/infiniband/{uverbs}"),
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("{gpu_node} c3 {:x}", gpu.minor)),
        "{out}"
    );
    assert!(out.contains("/dev/nvidiactl c3 ff"), "{out}");
    // Allowed by the device cgroup, no driver behind it.
    let (_, out) = podman.exec("dgpm", &format!("cat {gpu_node}"));
    assert!(out.contains("No such device or address"), "{out}");
    let (code, out) = podman.exec("dgpm", &format!("ls /dev/nvidia{}", other_gpu.minor));
    assert_ne!(code, 0, "an ungranted gpu node is there: {out}");
    let (code, out) = podman.exec(
        "dgpm",
        "ip -o link show net1 && cat /proc/sys/net/ipv4/conf/net1/arp_notify",
    );
    assert_eq!(code, 0, "net1 missing in the container: {out}");
    assert!(out.contains(VF_MAC) && out.ends_with("1\n"), "{out}");
    assert!(
        link(In::Host, host_name).is_none(),
        "the VF is still on the host"
    );
    let held = Ledger::open(state).unwrap().snapshot().unwrap();
    assert_eq!(held.pods.len(), 1, "{held:?}");
    // The container's own cgroup is recorded for the GPU teardown: podman's
    // paths carry no pod UID.
    let id = podman.ok(&["inspect", "--format", "{{.Id}}", "dgpm"]);
    let record = &held.pods[id.trim()].containers[id.trim()];
    assert!(
        record
            .cgroups
            .iter()
            .any(|c| c.ends_with(&format!("libpod-{}", id.trim()))),
        "{record:?}"
    );

    podman.ok(&["stop", "--time", "1", "dgpm"]);
    podman.ok(&["rm", "dgpm"]);
    s.assert_all_back();
    assert!(s.log().contains("hook done"), "{}", s.log());
}

#[test]
fn a_hook_killed_midway_is_undone_by_the_next_create() {
    require_root();
    // SIGKILL right after the VF moved into the container's netns.
    let mut s = setup("dgpk", Some("abort-after:move"));
    let out = s.run("dgpk1");
    assert!(!out.status.success(), "the container started: {}", s.log());
    assert!(link(In::Host, &s.host_name).is_none(), "the vf never moved");
    // podman runs poststop hooks itself, at the removal of a container the
    // runtime created (libpod `postDeleteHooks`); one whose create failed
    // gets none. Its init is gone, so the next create releases it.
    let dir = s.podman.dir.clone();
    s.podman.hooks = hooks_dir(&dir, s.fixture.root(), &s.state, &s.config, None);
    let out = s.run("dgpk2");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    assert!(s.log().contains("stale pod released"), "{}", s.log());
    let held = Ledger::open(&s.state).unwrap().snapshot().unwrap();
    assert_eq!(held.pods.len(), 1, "{held:?}");
    let (code, out) = s.podman.exec("dgpk2", "ip -o link show net1");
    assert_eq!(code, 0, "net1 missing in the container: {out}");
    s.podman.ok(&["stop", "--time", "1", "dgpk2"]);
    s.podman.ok(&["rm", "dgpk2"]);
    s.assert_all_back();
}

/// A podman pod of two containers in one network namespace (a pod without
/// an infra container, each joining the pinned namespace): the first moves
/// the VF in as `net1`; its removal (podman runs poststop hooks there)
/// leaves the VF to the second, still running. A third created then finds
/// it in the pod and keeps it past the second's removal; the last removal
/// brings it home and releases the pod.
#[test]
fn a_pods_first_container_leaves_the_vf_to_the_one_still_running() {
    require_root();
    let s = setup("dgpp", None);
    s.podman
        .ok(&["pod", "create", "--infra=false", "--name", "dgpp"]);
    for name in ["dgpp1", "dgpp2"] {
        let out = s.run_in(name, Some("dgpp"));
        assert!(
            out.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            s.log()
        );
    }
    let held = Ledger::open(&s.state).unwrap().snapshot().unwrap();
    assert_eq!(held.pods.len(), 1, "one pod: {held:?}");
    let pod = held.pods.values().next().unwrap();
    assert_eq!(pod.containers.len(), 2, "{pod:?}");
    let first = s.podman.ok(&["inspect", "--format", "{{.Id}}", "dgpp1"]);
    assert_eq!(pod.network_owner.as_deref(), Some(first.trim()));
    let net1 = |name: &str, what: &str| {
        let (code, out) = s.podman.exec(name, "ip -o link show net1");
        assert_eq!(
            code,
            0,
            "{what}: net1 missing in {name}: {out}\n{}",
            s.log()
        );
        assert!(out.contains(VF_MAC), "{what}: {out}");
    };
    let remove = |name: &str| {
        s.podman.ok(&["stop", "--time", "1", name]);
        s.podman.ok(&["rm", name]);
    };
    net1("dgpp2", "both running");

    remove("dgpp1");
    assert!(s.log().contains("vfs stay in the pod"), "{}", s.log());
    net1("dgpp2", "the owner removed");
    assert!(link(In::Host, &s.host_name).is_none(), "the VF came home");
    let held = Ledger::open(&s.state).unwrap().snapshot().unwrap();
    assert_eq!(
        held.pods.len(),
        1,
        "the pod still holds its devices: {held:?}"
    );

    // A container created in the pod now finds the VF there, and keeps it
    // past the removal of the one before it.
    let out = s.run_in("dgpp3", Some("dgpp"));
    assert!(out.status.success(), "{}", s.log());
    net1("dgpp3", "created after the owner went");
    remove("dgpp2");
    net1("dgpp3", "the second removed");

    remove("dgpp3");
    let restored = "vfs an exited container kept for its pod restored";
    assert!(s.log().contains(restored), "{}", s.log());
    s.assert_all_back();
    s.podman.ok(&["pod", "rm", "dgpp"]);
}
