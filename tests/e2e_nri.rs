//! The NRI foundation against a real containerd (1.7.24 and 2.1.9: the suite
//! runs under both): registration, the
//! `devgate.io/probe` adjustment seen from inside a container, and recovery
//! from a plugin crash, a runtime restart, and runtime-launched mode.
//!
//! The probe contract: a pod annotated `devgate.io/probe=<value>` gets
//! `DEVGATE_PROBE=<value>` in every container's environment; other pods don't.
mod support;

use std::time::{Duration, Instant};

use support::{
    require_root, ContainerSpec, Containerd, Cri, DevgatePlugin, Pod, PodSpec, Runtime, SLOW,
};

const PROBE_ANNOTATION: &str = "devgate.io/probe";

/// What `DEVGATE_PROBE` is inside a new container of `pod` ("unset" if absent).
fn probe_from_inside(cri: &Cri, pod: &Pod, name: &str) -> String {
    let spec = ContainerSpec::shell(name, r#"echo "DEVGATE_PROBE=${DEVGATE_PROBE-unset}""#);
    let run = cri.run_container(pod, &spec).expect("run probe container");
    assert_eq!(run.exit_code, 0, "probe container failed: {}", run.log);
    run.log
        .lines()
        .find_map(|l| l.strip_prefix("DEVGATE_PROBE="))
        .unwrap_or_else(|| {
            panic!(
                "probe container printed no DEVGATE_PROBE line: {:?}",
                run.log
            )
        })
        .to_string()
}

fn probe_pod(cri: &Cri, name: &str, value: &str) -> Pod {
    cri.run_pod(&PodSpec::new(name).annotation(PROBE_ANNOTATION, value))
        .expect("RunPodSandbox")
}

/// The environment containerd put into the container's OCI spec.
fn spec_env(cri: &Cri, id: &str) -> Vec<String> {
    let spec = cri.runtime_spec(id).expect("verbose ContainerStatus");
    let env = spec["process"]["env"]
        .as_array()
        .expect("spec has process.env");
    env.iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

/// Creates containers in `pod` until one carries the probe env; returns how
/// long that took from `since`. Containers created before the plugin is back
/// are removed: they only show that creation does not wait for the plugin.
fn time_until_probe_applied(cri: &Cri, pod: &Pod, value: &str, since: Instant) -> Duration {
    let want = format!("DEVGATE_PROBE={value}");
    let mut attempt = 0;
    loop {
        let spec = ContainerSpec::shell(&format!("retry{attempt}"), "true");
        let id = cri.create_container(pod, &spec).expect("CreateContainer");
        let applied = spec_env(cri, &id).contains(&want);
        cri.remove_container(&id).expect("RemoveContainer");
        if applied {
            return since.elapsed();
        }
        assert!(since.elapsed() < SLOW, "probe env never came back");
        attempt += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn plugin_registers_with_containerd() {
    require_root();
    let ctrd = Containerd::launch();
    let mark = ctrd.log_mark();
    let _plugin = DevgatePlugin::launch(&ctrd, &[]);
    let log = &ctrd.log()[mark..];
    assert!(
        log.contains(r#"registered as \"10-devgate\""#),
        "log: {log}"
    );
    assert!(
        log.contains(r#"#1: \"10-devgate\" (external:10-devgate["#),
        "not in the invocation order: {log}"
    );
    // --name and --idx name the plugin and place it in the order.
    let mark = ctrd.log_mark();
    let _second = DevgatePlugin::launch(&ctrd, &["--name", "gpu-gate", "--idx", "42"]);
    let log = &ctrd.log()[mark..];
    assert!(
        log.contains(r#"registered as \"42-gpu-gate\""#),
        "log: {log}"
    );
    assert!(
        log.contains(r#"#2: \"42-gpu-gate\" (external:42-gpu-gate["#),
        "not second in the invocation order: {log}"
    );
}

#[test]
fn sigterm_ends_the_plugin_and_its_connection() {
    require_root();
    let ctrd = Containerd::launch();
    let mut plugin = DevgatePlugin::launch(&ctrd, &[]);
    let mark = ctrd.log_mark();
    let status = plugin
        .signal_and_wait(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(5))
        .expect("devgate nri ends on SIGTERM");
    assert!(status.success(), "exit status {status}");
    let output = plugin.output();
    assert!(
        output.contains("exiting signal=SIGTERM"),
        "output: {output}"
    );
    // This instance has no devgate.toml: said, since a mistyped path reads so.
    assert!(
        output.contains("no config file there: the defaults apply"),
        "output: {output}"
    );
    ctrd.wait_for_log(mark, r#"connection to plugin \"10-devgate\" closed"#, SLOW);
}

#[test]
fn probe_annotation_reaches_the_container_environment() {
    require_root();
    let ctrd = Containerd::launch();
    let _plugin = DevgatePlugin::launch(&ctrd, &[]);
    let cri = ctrd.cri();

    let annotated = probe_pod(&cri, "annotated", "hello-42");
    assert_eq!(probe_from_inside(&cri, &annotated, "probe"), "hello-42");

    let plain = cri.run_pod(&PodSpec::new("plain")).expect("RunPodSandbox");
    assert_eq!(probe_from_inside(&cri, &plain, "probe"), "unset");
}

/// `devgate ready` for the instance's plugin: whether it succeeded, and its output.
fn ready(ctrd: &Containerd) -> (bool, String) {
    let out = std::process::Command::new(support::DEVGATE)
        .arg("ready")
        .arg("--state-dir")
        .arg(ctrd.path("devgate-state"))
        .output()
        .expect("run devgate ready");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// After a SIGKILL, containers still start (without the plugin), and a
/// restarted plugin applies the probe again. `devgate ready` (the
/// DaemonSet's readiness probe) follows: ready, not ready once the plugin is
/// gone, ready again once the new process is configured. The 2 s bound runs from the moment
/// the new process is spawned to a CreateContainer whose spec has the env: it
/// covers process start, connect, register, configure and synchronize.
#[test]
fn plugin_recovers_from_kill_within_two_seconds() {
    require_root();
    let ctrd = Containerd::launch();
    let mut plugin = DevgatePlugin::launch(&ctrd, &[]);
    let cri = ctrd.cri();
    let pod = probe_pod(&cri, "crash", "after-crash");
    assert_eq!(probe_from_inside(&cri, &pod, "before"), "after-crash");
    let (ok, said) = ready(&ctrd);
    assert!(ok && said.contains("configured by containerd"), "{said}");

    let mark = ctrd.log_mark();
    plugin.kill();
    ctrd.wait_for_log(mark, r#"connection to plugin \"10-devgate\" closed"#, SLOW);
    assert_eq!(probe_from_inside(&cri, &pod, "without"), "unset");
    let (ok, said) = ready(&ctrd);
    assert!(!ok && said.contains("is no longer that plugin"), "{said}");

    let respawned = Instant::now();
    plugin.respawn(&ctrd);
    let elapsed = time_until_probe_applied(&cri, &pod, "after-crash", respawned);
    eprintln!("probe applied {elapsed:?} after the plugin was respawned");
    assert!(
        elapsed <= Duration::from_secs(2),
        "probe applied {elapsed:?} after restart"
    );
    assert_eq!(probe_from_inside(&cri, &pod, "after"), "after-crash");
    let (ok, said) = ready(&ctrd);
    assert!(ok, "{said}");
}

/// containerd never reconnects to external plugins: the running devgate must
/// notice the closed connection and dial again (backoff 100 ms to 5 s), and be
/// back within 2 s of containerd serving again, however long it was down: the
/// backoff's wait ends when containerd creates its socket. `devgate ready`
/// says not ready while no runtime holds the plugin, and ready once back.
#[test]
fn plugin_reconnects_after_containerd_restart() {
    require_root();
    let mut ctrd = Containerd::launch();
    let mut plugin = DevgatePlugin::launch(&ctrd, &[]);
    let mark = ctrd.log_mark();
    ctrd.kill();
    // Long enough for the backoff to reach its 5 s cap.
    std::thread::sleep(Duration::from_secs(7));
    // Meanwhile the readiness probe says the runtime dropped the plugin.
    let (ok, said) = ready(&ctrd);
    assert!(!ok && said.contains("closed its connection"), "{said}");
    ctrd.start();
    let serving = Instant::now();
    plugin.wait_registered_after(&ctrd, mark, SLOW);
    let elapsed = serving.elapsed();
    assert!(
        elapsed <= Duration::from_secs(2),
        "registered {elapsed:?} after containerd served again"
    );
    assert!(
        plugin.is_running(),
        "devgate exited instead of reconnecting"
    );

    let cri = ctrd.cri();
    let pod = probe_pod(&cri, "restarted", "after-restart");
    assert_eq!(probe_from_inside(&cri, &pod, "probe"), "after-restart");
    let (ok, said) = ready(&ctrd);
    assert!(ok, "{said}");
}

/// Runtime-launched ("pre-installed") mode: containerd starts
/// `<plugin_path>/10-devgate` itself, with only NRI_PLUGIN_NAME/IDX/SOCKET in
/// the environment and the connection on fd 3, and sends `10-devgate.conf`
/// as the Configure payload, whose `failure_policy` the plugin then follows;
/// the plugin logs to `nri.log` in its state directory.
#[test]
fn preinstalled_plugin_applies_the_probe() {
    require_root();
    let mut ctrd = Containerd::prepare();
    let installed = ctrd.plugin_dir().join("10-devgate");
    // containerd starts the plugin without arguments, which would mean the
    // host's /run/devgate, / and /var/lib/devgate: a wrapper gives it this
    // instance's own, keeping fd 3 and the environment through the exec.
    let state = ctrd.path("devgate-state");
    let host = ctrd.path("host");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(
        &installed,
        format!(
            "#!/bin/sh\nexec {} nri --state-dir {} --host-root {} \"$@\"\n",
            support::DEVGATE,
            state.display(),
            host.display()
        ),
    )
    .expect("install devgate as a pre-installed plugin");
    std::fs::set_permissions(
        &installed,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(
        ctrd.plugin_config_dir().join("10-devgate.conf"),
        format!(
            "failure_policy = \"ignore\"\nlog_format = \"json\"\n[gpu]\nhealth_dir = \"{}\"\n",
            ctrd.path("gpu-health").display()
        ),
    )
    .expect("write plugin config");
    let mark = ctrd.log_mark();
    ctrd.start();
    ctrd.wait_for_log(
        mark,
        r#"#1: \"10-devgate\" (pre-connected:10-devgate["#,
        SLOW,
    );

    let cri = ctrd.cri();
    let pod = probe_pod(&cri, "preinstalled", "launched");
    assert_eq!(probe_from_inside(&cri, &pod, "probe"), "launched");
    // The drop-in file reached the plugin: with the default (`fail`) this
    // allocation of an unknown GPU would refuse the container.
    let bad = cri
        .run_pod(&PodSpec::new("unknown-gpu").annotation(
            "scheduling.koordinator.sh/device-allocated",
            r#"{"gpu":[{"minor":99,"resources":{"koordinator.sh/gpu-core":"100"}}]}"#,
        ))
        .expect("RunPodSandbox");
    let run = cri
        .run_container(&bad, &ContainerSpec::shell("main", "ls /dev"))
        .expect("failure_policy = \"ignore\" from the runtime's config starts it");
    assert!(!run.log.contains("nvidia"), "{}", run.log);

    assert!(
        state.join("ledger.lock").exists() || state.join("runtime.json").exists(),
        "the launched devgate keeps its state in the instance's directory"
    );
    // containerd connects a launched plugin's stderr to the null device: the
    // log is in the state directory, in the format the runtime's config set.
    let log = std::fs::read_to_string(state.join("nri.log")).expect("the plugin's log file");
    assert!(log.contains("started by the runtime"), "{log}");
    assert!(
        log.lines()
            .any(|l| l.starts_with('{') && l.contains("unknown-gpu")),
        "the refusal, as json: {log}"
    );
    // It cannot reconnect to a descriptor: it must exit with the runtime
    // rather than linger as an orphan.
    let needle = state.to_string_lossy().into_owned();
    assert_eq!(
        support::pids_matching(&needle).len(),
        1,
        "one launched devgate"
    );
    ctrd.kill();
    support::wait_for("the launched devgate to exit", SLOW, || {
        support::pids_matching(&needle).is_empty().then_some(())
    });
}

/// The line of the plugin's log holding `needle`, once it is there.
fn plugin_line(plugin: &DevgatePlugin, needle: &str) -> String {
    let deadline = Instant::now() + SLOW;
    loop {
        let out = plugin.output();
        if let Some(line) = out.lines().find(|l| l.contains(needle)) {
            return line.to_string();
        }
        assert!(Instant::now() < deadline, "no line with {needle}: {out}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The runtime's request timeout bounds the plugin's waits (a creation
/// waiting for a release, a pod's stop waiting for its VFs). containerd 2.x
/// states its `plugin_request_timeout` in Configure (NRI v0.7 and later);
/// 1.7 (NRI v0.6.1) states none there, and the plugin keeps NRI's default of
/// 2 s at Configure. Both send each request's deadline, which the plugin
/// fits the waits of that request to.
#[test]
fn the_runtimes_request_timeout_is_taken_where_it_is_stated() {
    require_root();
    let mut ctrd = Containerd::prepare();
    ctrd.set_nri(r#"  plugin_request_timeout = "1500ms""#);
    ctrd.start();
    let plugin = DevgatePlugin::launch(&ctrd, &[]);
    let stated = match ctrd.runtime() {
        Runtime::Containerd17 => "request_timeout_ms=2000",
        Runtime::Containerd21 => "request_timeout_ms=1500",
    };
    let line = plugin_line(&plugin, " configured ");
    assert!(line.contains(stated), "want {stated}: {line}");
    // A pod's start is a request like any other.
    let _pod = ctrd
        .cri()
        .run_pod(&PodSpec::new("deadline"))
        .expect("RunPodSandbox");
    let line = plugin_line(&plugin, "request_deadline_ms=");
    assert!(line.contains("request_deadline_ms=1500 "), "{line}");
}

/// An invalid config file does not stop the plugin, which would leave the
/// node's containers created without their devices: it registers, refuses
/// the containers that ask devgate for something with the config's error,
/// lets the others through, and `devgate ready` fails, which stops a
/// rollout on this node.
#[test]
fn an_invalid_config_file_refuses_containers_that_need_devgate() {
    require_root();
    let ctrd = Containerd::launch();
    std::fs::write(ctrd.path("devgate.toml"), "no_such_key = 1\n").unwrap();
    let plugin = DevgatePlugin::launch(&ctrd, &[]);
    let cri = ctrd.cri();
    let asks = probe_pod(&cri, "asks", "v");
    let spec = ContainerSpec::shell("probe", "true");
    let refused = cri
        .create_container(&asks, &spec)
        .expect_err("a container that asks devgate, under an invalid config");
    assert!(
        refused.message().contains("no_such_key"),
        "{}",
        refused.message()
    );
    let plain = cri.run_pod(&PodSpec::new("plain")).expect("RunPodSandbox");
    assert_eq!(probe_from_inside(&cri, &plain, "probe"), "unset");
    let (ok, text) = ready(&ctrd);
    assert!(!ok && text.contains("no_such_key"), "{text}");
    let log = plugin.output();
    assert!(log.contains("invalid config; refusing containers"), "{log}");
}
