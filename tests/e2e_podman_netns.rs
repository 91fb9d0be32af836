//! Hooks-only mode with podman 4.3 and the namespaces the hook runs beside.
//! On a kernel in exclusive RDMA netns mode a PF used whole keeps its RDMA
//! device in the host's network namespace, so it goes to a container on the
//! host's network (`--network host`, or joining a host-network container's
//! namespace by path, as the containers of a podman pod of `--network host`
//! join its infra container's), and a container with a network namespace of
//! its own is refused with nothing claimed. Stage `auto` listed at
//! createContainer too, which runs in the container's namespaces, fails the
//! container there. Needs root; fails without it.
mod support;

#[path = "e2e_podman/harness.rs"]
mod harness;

use devgate::allocation::DEVICE_ALLOCATED;
use devgate::config::RdmaNetnsMode;
use devgate::fixture::HostRootBuilder;
use harness::{annotation_arg, hook_log, hooks_only, ledger_pods, ULIMITS};
use support::{require_root, WORKLOAD_IMAGE};

#[test]
fn a_whole_pf_on_an_exclusive_kernel_goes_only_to_host_network_containers() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx()
        .rdma_netns_mode(Some(RdmaNetnsMode::Exclusive))
        .build(&dir.path().join("host"))
        .unwrap();
    let nic = &fixture.expected().rdma[1];
    let uverbs = &nic.rdma.char_devs[0].name;
    let alloc = format!(r#"{{"rdma":[{{"minor":1,"id":"{}"}}]}}"#, nic.bus_id);
    let (podman, state, _config) = hooks_only(dir.path(), fixture.root(), None);
    let annotation = annotation_arg(DEVICE_ALLOCATED, &alloc);
    let run = |placement: &[&str]| {
        let mut args = vec!["run", "--rm"];
        args.extend_from_slice(placement);
        args.extend(ULIMITS);
        args.extend([
            "--annotation",
            &annotation,
            WORKLOAD_IMAGE,
            "ls",
            "/dev/infiniband",
        ]);
        podman.cmd(&args)
    };
    let log = || hook_log(&state);
    // The hook opens the ledger before it plans: a refusal finds it there.
    let claims = || ledger_pods(&state);

    // `--network none`: a namespace of its own, with nothing in it.
    let own = run(&["--network", "none"]);
    assert!(
        !own.status.success(),
        "a container in its own netns started"
    );
    let refusal = format!(
        "rdma[0]: pf {} is used without vfs, so its rdma device stays in the host network namespace",
        nic.bus_id
    );
    assert!(log().contains(&refusal), "{}", log());
    assert_eq!(claims(), 0, "a refused container left a claim");

    let host = run(&["--network", "host"]);
    let out = String::from_utf8_lossy(&host.stdout);
    assert!(
        host.status.success() && out.contains(uverbs.as_str()),
        "--network host: {out}{}\n{}",
        String::from_utf8_lossy(&host.stderr),
        log()
    );

    // A container joining another's namespace by path, the host's here, as
    // the containers of a podman pod of `--network host` join its infra
    // container's: its spec lists a `network` namespace.
    let mut sleeper = vec!["run", "--detach", "--name", "dgpnhost", "--network", "host"];
    sleeper.extend(ULIMITS);
    sleeper.extend([WORKLOAD_IMAGE, "sleep", "300"]);
    podman.ok(&sleeper);
    let joined = run(&["--network", "container:dgpnhost"]);
    let out = String::from_utf8_lossy(&joined.stdout);
    assert!(
        joined.status.success() && out.contains(uverbs.as_str()),
        "a container in a host-network container's namespace: {out}{}\n{}",
        String::from_utf8_lossy(&joined.stderr),
        log()
    );
}

/// The hooks.d file listing `auto` at createContainer as well: that run is
/// inside the container, with a creation's status and the init's pid as the
/// container numbers it (1, the host's init here; the init's host pid under
/// `--pid host`, where it is the hook's parent), so it is refused with the
/// fix in its message and the container does not start; the shipped stages
/// start it, in either pid namespace, and the claim the createRuntime run
/// left for a container never created is reaped by the next create.
#[test]
fn stage_auto_refuses_a_run_inside_the_container() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .unwrap();
    let gpu = &fixture.expected().gpus[0];
    let alloc = format!(r#"{{"gpu":[{{"minor":{}}}]}}"#, gpu.minor);
    let (podman, state, _config) = hooks_only(dir.path(), fixture.root(), None);
    let annotation = annotation_arg(DEVICE_ALLOCATED, &alloc);
    let node = format!("/dev/nvidia{}", gpu.minor);
    let run = |pid_ns: &[&str]| {
        let mut args = vec!["run", "--rm"];
        args.extend_from_slice(pid_ns);
        args.extend(ULIMITS);
        args.extend(["--annotation", &annotation, WORKLOAD_IMAGE, "ls", &node]);
        let out = podman.cmd(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let log = || hook_log(&state);
    let claims = || ledger_pods(&state);
    let reason = "runs in the container's namespaces, as createContainer or startContainer hooks \
                  do (";
    let fix = "list devgate-hook at createRuntime (or prestart) and poststop only";
    let pid_nss: [&[&str]; 2] = [&[], &["--pid", "host"]];
    for pid_ns in pid_nss {
        let (ok, out) = run(pid_ns);
        assert!(ok, "the shipped stages, {pid_ns:?}: {out}\n{}", log());
    }
    assert!(!log().contains(reason), "{}", log());

    let file = podman.hooks.join("devgate.json");
    let shipped = std::fs::read_to_string(&file).unwrap();
    let mut hook: serde_json::Value = serde_json::from_str(&shipped).unwrap();
    hook["stages"] = serde_json::json!(["createRuntime", "createContainer", "poststop"]);
    std::fs::write(&file, hook.to_string()).unwrap();
    // Told by the hook's pid namespace, and under `--pid host` by its parent.
    let whys = [
        "/proc numbers this hook apart from its own pid namespace",
        "the container's init is this hook's parent",
    ];
    for (pid_ns, why) in pid_nss.into_iter().zip(whys) {
        let refusals = || {
            log()
                .lines()
                .filter(|l| l.contains(reason) && l.contains(why) && l.contains(fix))
                .count()
        };
        let before = refusals();
        let (ok, out) = run(pid_ns);
        assert!(!ok, "started, {pid_ns:?}: {out}\n{}", log());
        assert_eq!(refusals(), before + 1, "{pid_ns:?}: {out}\n{}", log());
        // The createRuntime run before it claimed, and podman runs no
        // poststop for a container it never created: a later create reaps
        // the exited container's pod (the run before's, here).
        assert_eq!(claims(), 1, "{pid_ns:?}: {}", log());
    }
    std::fs::write(&file, shipped).unwrap();
    let (ok, out) = run(&[]);
    assert!(ok, "the shipped stages again: {out}\n{}", log());
    assert_eq!(claims(), 0, "a claim left: {}", log());
}
