//! Every check on a healthy fake node, then on fakes broken one way each
//! ([`broken`]).
mod broken;
mod broken_devices;
mod broken_hook;
mod crio;
mod grant;
mod node_cases;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::host::{Host, Roots};
use super::{run_checks, table, Check, Status};
use crate::fixture::HostRootBuilder;
use crate::inventory::Inventory;

struct FakeHost {
    version: Result<String, String>,
    socket_up: bool,
    devs: HashMap<PathBuf, (u32, u32)>,
}

impl Host for FakeHost {
    fn containerd_version(&self) -> Result<String, String> {
        self.version.clone()
    }

    fn connect(&self, socket: &Path) -> std::io::Result<()> {
        match self.socket_up {
            true => Ok(()),
            false => Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                format!("{} refused", socket.display()),
            )),
        }
    }

    fn char_device(&self, path: &Path) -> std::io::Result<Option<(u32, u32)>> {
        Ok(self.devs.get(path).copied())
    }

    fn clock_ticks_per_sec(&self) -> u64 {
        100
    }

    /// Doctor run from a shell on the node: no API server in sight, whatever
    /// the machine running the tests has.
    fn env(&self, _key: &str) -> Option<String> {
        None
    }

    fn service_account_dir(&self) -> PathBuf {
        PathBuf::from("/nonexistent/serviceaccount")
    }
}

/// A node as `install/bootstrap.sh` leaves it, with the HGX fixture's devices.
struct Node {
    _dir: tempfile::TempDir,
    roots: Roots,
    host: FakeHost,
    fixture: Inventory,
}

const CONTAINERD_CONFIG: &str = "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n";

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// An executable file at `path`, as an installed hook is.
fn write_script(path: &Path) {
    write(path, "#!/bin/sh\n");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A healthy node whose host root is a copy of `template` (writing the HGX
/// fixture is the slow part), or a newly written one.
fn healthy_from(template: Option<&Path>) -> Node {
    // The fixture is a few thousand small files: on tmpfs when there is one.
    let dir = match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm"),
        false => tempfile::tempdir(),
    }
    .unwrap();
    let root = dir.path().join("host");
    let fixture = match template {
        Some(t) => {
            let copied = std::process::Command::new("cp")
                .arg("-a")
                .arg(t)
                .arg(&root)
                .status()
                .is_ok_and(|s| s.success());
            assert!(copied, "copy the fixture");
            HostRootBuilder::hgx().expected().unwrap()
        }
        None => HostRootBuilder::hgx()
            .build(&root)
            .unwrap()
            .expected()
            .clone(),
    };
    let etc = root.join("etc");
    let roots = Roots {
        host_root: root.clone(),
        etc_root: etc.clone(),
        proc_dir: dir.path().join("procs"),
        containerd_config: etc.join("containerd/config.toml"),
        config: Some(etc.join("devgate/config.toml")),
        state_dir: dir.path().join("run-devgate"),
        nri_socket: "/var/run/nri/nri.sock".into(),
    };
    write(&roots.containerd_config, CONTAINERD_CONFIG);
    write(
        roots.config.as_deref().unwrap(),
        "[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n[kube_api]\nurl = \"https://10.0.0.1:6443\"\nnode_name = \"node-a\"\n",
    );
    write(
        &etc.join("udev/rules.d/70-devgate-sriov.rules"),
        "ACTION==\"add|bind\", SUBSYSTEM==\"pci\", KERNEL==\"0000:19:00.0\", ATTR{sriov_numvfs}=\"4\"\n",
    );
    write(
        &roots.proc_dir.join("4242/cmdline"),
        "/usr/local/bin/devgate\0nri\0--socket\0/var/run/nri/nri.sock\0",
    );
    // Started from a systemd unit: no API server in its environment.
    write(
        &roots.proc_dir.join("4242/environ"),
        "PATH=/usr/local/bin:/usr/bin\0LANG=C.UTF-8\0",
    );
    write(&roots.proc_dir.join("1/cmdline"), "/sbin/init\0");
    // The plugin's executable: its hook is the devgate-hook next to it.
    std::os::unix::fs::symlink("/usr/local/bin/devgate", roots.proc_dir.join("4242/exe")).unwrap();
    // Booted at BOOT; the plugin started 10 s later (1000 ticks at 100 Hz) and
    // was configured 10 s after that.
    write(
        &roots.proc_dir.join("stat"),
        &format!("cpu 1 2 3\nbtime {BOOT}\n"),
    );
    write(&roots.proc_dir.join("4242/stat"), &proc_stat(1000));
    // Root's full set, as a privileged container or a plain unit has it.
    write(
        &roots.proc_dir.join("4242/status"),
        "Name:\tdevgate\nCapEff:\t000001ffffffffff\n",
    );
    write_script(&root.join("usr/local/bin/devgate-hook"));
    // Where podman (and CRI-O) read it by default.
    write(
        &root.join("usr/share/containers/oci/hooks.d/devgate.json"),
        r#"{"version":"1.0.0","hook":{"path":"/usr/local/bin/devgate-hook","args":["devgate-hook","createRuntime"]},"when":{"always":true},"stages":["createRuntime"]}"#,
    );
    std::fs::create_dir_all(&roots.state_dir).unwrap();
    write_record(&roots.state_dir, BOOT + 20);
    std::fs::create_dir_all(root.join("var/lib/devgate")).unwrap();
    write(
        &root.join("sys/module/ib_core/parameters/netns_mode"),
        "Y\n",
    );
    write(
        &root.join("sys/fs/cgroup/cgroup.controllers"),
        "cpu memory\n",
    );
    let mut devs = HashMap::new();
    for g in &fixture.gpus {
        devs.insert(root.join(format!("dev/nvidia{}", g.minor)), (195, g.minor));
    }
    devs.insert(root.join("dev/nvidiactl"), (195, 255));
    devs.insert(root.join("dev/nvidia-uvm"), (508, 0));
    // The plugin's /dev/char links (the config's runtime uses the systemd
    // cgroup driver).
    std::fs::create_dir_all(root.join("dev/char")).unwrap();
    let mut links: Vec<(String, String)> = devs
        .iter()
        .map(|(path, (major, minor))| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (format!("{major}:{minor}"), name)
        })
        .collect();
    links.push(("508:1".into(), "nvidia-uvm-tools".into()));
    for (link, name) in links {
        let link = root.join("dev/char").join(link);
        // A node copied from a template has them already.
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(format!("../{name}"), link).unwrap();
        }
    }
    let host = FakeHost {
        version: Ok("containerd github.com/containerd/containerd v1.7.24 abc".into()),
        socket_up: true,
        devs,
    };
    Node {
        _dir: dir,
        roots,
        host,
        fixture,
    }
}

/// Boot time of the fake node (`btime`).
const BOOT: u64 = 1_700_000_000;

/// proc(5) `/proc/<pid>/stat` of `devgate nri` started `start_ticks` after boot.
fn proc_stat(start_ticks: u64) -> String {
    format!("4242 (devgate) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start_ticks} 1000 10\n")
}

/// The record `devgate nri` writes at Configure.
fn write_record(state_dir: &Path, configured_unix: u64) {
    write(
        &state_dir.join("runtime.json"),
        &record(configured_unix).to_string(),
    );
}

/// A record as this release writes it, naming the plugin process.
fn write_record_of(state_dir: &Path, configured_unix: u64, pid: u32, start_ticks: u64) {
    let mut record = record(configured_unix);
    record["plugin"] = serde_json::json!({"pid": pid, "start_ticks": start_ticks});
    write(&state_dir.join("runtime.json"), &record.to_string());
}

/// A record of an older release, which names no plugin process.
fn record(configured_unix: u64) -> serde_json::Value {
    serde_json::json!({
        "runtime": "containerd", "version": "1.7.24", "nri_version": "v0.6.1",
        "events": "0x60c", "explicit_cgroup_rules": false, "cdi_devices": false,
        "device_mode": "nodes", "devices_as": "nodes", "configured_unix": configured_unix,
    })
}

fn healthy() -> Node {
    healthy_from(None)
}

/// `devgate cdi generate -o /etc/cdi` on node `n`, with its config; the
/// directory written.
fn write_cdi_specs(n: &Node) -> PathBuf {
    let config = crate::config::Config::load(n.roots.config.as_deref().unwrap()).unwrap();
    let inv = crate::inventory::discover(&n.roots.host_root);
    let g = crate::cdi::generate(&inv, &config, &crate::cdi::Class::ALL, "0.6.0").unwrap();
    let dir = n.roots.etc_root.join("cdi");
    std::fs::create_dir_all(&dir).unwrap();
    for (class, spec) in &g.specs {
        write(
            &dir.join(class.file_name()),
            &serde_json::to_string(spec).unwrap(),
        );
    }
    dir
}

/// Specs as generated pass, where devgate names CDI devices; where the
/// runtime gets raw nodes no spec is read.
#[test]
fn cdi_specs_as_generated_pass() {
    let mut n = healthy();
    write(
        n.roots.config.as_deref().unwrap(),
        "device_mode = \"cdi\"\n",
    );
    // containerd 1.7.24 gets raw nodes.
    let checks = run_checks(&n.roots, &n.host);
    let specs = check(&checks, "cdi specs");
    assert_eq!(specs.status, Status::Pass, "{}", table(&checks));
    assert!(specs.detail.contains("raw nodes"), "{}", specs.detail);
    // 2.1 injects CDI devices: its specs are checked.
    n.host.version = Ok("containerd github.com/containerd/containerd v2.1.9 abc".into());
    let checks = run_checks(&n.roots, &n.host);
    assert_eq!(check(&checks, "cdi specs").status, Status::Fail);
    write_cdi_specs(&n);
    let checks = run_checks(&n.roots, &n.host);
    let specs = check(&checks, "cdi specs");
    assert_eq!(specs.status, Status::Pass, "{}", table(&checks));
    assert!(
        specs.detail.contains("devices: the specs in"),
        "{}",
        specs.detail
    );
}

/// Every check run on `node`, and the one named `name` of them.
fn run_check(node: &Node, name: &str) -> Check {
    check(&run_checks(&node.roots, &node.host), name).clone()
}

fn check<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}"))
}

#[test]
fn healthy_node_passes_every_check() {
    let node = healthy();
    let checks = run_checks(&node.roots, &node.host);
    let report = table(&checks);
    assert!(checks.iter().all(|c| c.status == Status::Pass), "{report}");
    assert_eq!(checks.len(), 17, "{report}");
    assert!(
        report.contains("17 passed, 0 warnings, 0 failed"),
        "{report}"
    );
    assert!(check(&checks, "cgroup").detail.contains("systemd driver"));
    assert_eq!(
        check(&checks, "nri hook").detail,
        "/usr/local/bin/devgate-hook, given the plugin's --state-dir"
    );
    assert_eq!(
        check(&checks, "grant check").detail,
        "pods of node node-a from https://10.0.0.1:6443 with no credentials, as the running plugin (pid 4242) resolves it"
    );
    let registered = &check(&checks, "devgate registered").detail;
    assert!(registered.contains("pid 4242"), "{registered}");
    assert!(
        registered.contains("configured by containerd 1.7.24 at unix time 1700000020"),
        "{registered}"
    );
}

/// containerd's default NRI socket is `/run/nri/nri.sock`, devgate's
/// `/var/run/nri/nri.sock`, the same file on a systemd host: spelled either
/// way, in containerd's config or doctor's `--socket`, the node is healthy.
#[test]
fn the_socket_under_run_or_var_run_is_one_socket() {
    for (in_config, checked) in [
        ("/run/nri/nri.sock", "/var/run/nri/nri.sock"),
        ("/var/run/nri/nri.sock", "/run/nri/nri.sock"),
    ] {
        let mut node = healthy();
        let config = CONTAINERD_CONFIG.replace(
            "disable = false\n",
            &format!("disable = false\n  socket_path = \"{in_config}\"\n"),
        );
        write(&node.roots.containerd_config, &config);
        node.roots.nri_socket = checked.into();
        let checks = run_checks(&node.roots, &node.host);
        let report = table(&checks);
        assert!(
            checks.iter().all(|c| c.status == Status::Pass),
            "{checked}: {report}"
        );
    }
}

/// The exit status follows the checks: a healthy node, and one with warnings
/// only, exit 0; one failed check makes it 1, naming the count.
#[test]
fn exit_status_fails_only_on_a_failed_check() {
    let node = healthy();
    let mut checks = run_checks(&node.roots, &node.host);
    assert!(super::verdict(&checks).is_ok());
    checks[0].status = Status::Warn;
    assert!(super::verdict(&checks).is_ok(), "warnings alone exit 0");
    checks[1].status = Status::Fail;
    let err = super::verdict(&checks).unwrap_err();
    assert_eq!(err.to_string(), "1 of 17 checks failed");
}
