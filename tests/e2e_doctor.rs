//! `devgate doctor` against a real private containerd (1.7.24 and 2.1.9: the
//! suite runs under both) with `devgate nri` registered, on the simulated HGX host root.
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use support::node::Node;

fn doctor(node: &Node, etc: &Path) -> (bool, BTreeMap<String, (String, String)>) {
    let out = Command::new(env!("CARGO_BIN_EXE_devgate"))
        .arg("doctor")
        .arg("--host-root")
        .arg(node.fixture.root())
        .arg("--etc-root")
        .arg(etc)
        .args(["--proc-dir", "/proc", "-o", "json"])
        .arg("--containerd")
        .arg(node.ctrd.runtime().containerd())
        .arg("--config")
        .arg(node.ctrd.path("devgate.toml"))
        .arg("--containerd-config")
        .arg(node.ctrd.path("config.toml"))
        .arg("--socket")
        .arg(node.ctrd.nri_socket())
        .arg("--state-dir")
        .arg(node.state_dir())
        .output()
        .expect("run devgate doctor");
    let checks: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let by_name = checks
        .iter()
        .map(|c| {
            let field = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (field("name"), (field("status"), field("detail")))
        })
        .collect();
    (out.status.success(), by_name)
}

#[test]
fn doctor_sees_containerd_nri_and_the_running_plugin() {
    let mut node = Node::start(&[]);
    let etc = node.ctrd.path("etc");
    std::fs::create_dir_all(&etc).unwrap();

    // The hook next to the running plugin's executable, read from the real
    // /proc/<pid>/exe, is looked up below the host root, as on a node.
    let hook = Path::new(env!("CARGO_BIN_EXE_devgate")).with_file_name("devgate-hook");
    let (_, checks) = doctor(&node, &etc);
    assert_eq!(checks["nri hook"].0, "fail", "{checks:#?}");
    assert!(checks["nri hook"]
        .1
        .contains(&format!("{} is not an executable file", hook.display())));
    let in_root = node.fixture.root().join(hook.strip_prefix("/").unwrap());
    std::fs::create_dir_all(in_root.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&hook, &in_root).unwrap();

    let (ok, checks) = doctor(&node, &etc);
    let status = |name: &str| checks.get(name).map(|c| c.0.as_str()).unwrap_or("missing");
    for (name, want) in [
        ("config", "pass"),
        ("containerd", "pass"),
        ("nri enabled", "pass"),
        ("nri socket", "pass"),
        ("devgate registered", "pass"),
        ("inventory", "pass"),
        // The simulated host root has sysfs and procfs, but no /dev nodes.
        ("nvidia devices", "fail"),
        ("vfs", "pass"),
        ("cdi", "pass"),
        ("nri hook", "pass"),
        // The real plugin's /proc/<pid>/status: root, every capability.
        ("gpu process scan", "pass"),
    ] {
        assert_eq!(status(name), want, "{name}: {checks:#?}");
    }
    assert!(!ok, "a failed check must fail the command");
    let pid = node.plugin.pid().expect("plugin pid");
    assert!(
        checks["devgate registered"]
            .1
            .contains(&format!("pid {pid}")),
        "{checks:#?}"
    );
    // Registration is read from the runtime record `devgate nri` writes at
    // Configure, which the runtime sends only to a plugin it accepted. The
    // containerd log line the check's fix text names (`plugin
    // "external:10-devgate[<pid>]" registered as "10-devgate"`) is logged by
    // 1.7.24 and 2.1.9 alike.
    let runtime = node.ctrd.runtime();
    assert!(
        checks["devgate registered"]
            .1
            .contains("configured by containerd"),
        "{runtime}: {checks:#?}"
    );
    let log = node.ctrd.log();
    let needle = "registered as \\\"10-devgate\\\"";
    assert!(
        log.contains(needle),
        "{runtime}: containerd did not log {needle}: {log}"
    );
    let marker = node.ctrd.runtime().version_marker();
    assert!(checks["containerd"].1.contains(marker), "{checks:#?}");

    node.plugin.kill();
    let (_, checks) = doctor(&node, &etc);
    assert_eq!(checks["devgate registered"].0, "fail", "{checks:#?}");
}
