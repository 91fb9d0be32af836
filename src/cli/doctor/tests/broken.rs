//! Each way of breaking the healthy node's runtime, plugin, CDI and hooks
//! fails or warns the check that owns it (broken_devices.rs: its devices).
use std::os::unix::fs::PermissionsExt;

/// The hooks.d file of the healthy node, below its host root.
const USR_HOOKS_D: &str = "usr/share/containers/oci/hooks.d/devgate.json";

use super::{check, healthy, healthy_from, write, write_record_of, Node, BOOT, CONTAINERD_CONFIG};
use crate::cli::doctor::{run_checks, Check, Status};

type Breakage = fn(&mut Node);

/// A case's name, its breakage, the check that must report it, the status and
/// a text the report holds.
pub(super) type Case = (&'static str, Breakage, &'static str, Status, &'static str);

/// The healthy node's API server, kept by configs a case rewrites for
/// something else.
pub(super) const API: &str = "[kube_api]\nurl = \"https://10.0.0.1:6443\"\n";

/// The healthy node's config with CDI names stated to be injected.
const CDI_ON: &str =
    "device_mode = \"cdi\"\nruntime_cdi = \"on\"\n[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n[kube_api]\nurl = \"https://10.0.0.1:6443\"\n";

#[test]
fn each_broken_runtime_or_plugin_setup_fails_or_warns_its_own_check() {
    let cases: &[Case] = &[
        (
            "no api server for the grant check",
            |n| {
                write(
                    n.roots.config.as_deref().unwrap(),
                    "[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n",
                )
            },
            "grant check",
            Status::Warn,
            "off: allocations are applied as the annotation says",
        ),
        (
            "kubelet's kubeconfig unusable",
            |n| {
                write(
                    n.roots.config.as_deref().unwrap(),
                    "[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n",
                );
                // Read by doctor's own view: the plugin's is unreadable
                // (tests/grant.rs has the plugin's).
                std::fs::remove_file(n.roots.proc_dir.join("4242/environ")).unwrap();
                write(
                    &n.roots.etc_root.join("kubernetes/kubelet.conf"),
                    "not: [a kubeconfig",
                );
            },
            "grant check",
            Status::Fail,
            "every allocation would be refused",
        ),
        (
            "bad config",
            |n| write(n.roots.config.as_deref().unwrap(), "failure_polcy = 1\n"),
            "config",
            Status::Fail,
            "failure_polcy",
        ),
        (
            "containerd 1.6",
            |n| n.host.version = Ok("containerd x 1.6.20 y".into()),
            "containerd",
            Status::Fail,
            "no NRI before 1.7",
        ),
        (
            "no containerd",
            |n| n.host.version = Err("run containerd: not found".into()),
            "containerd",
            Status::Fail,
            "not found",
        ),
        (
            "nri disabled",
            |n| {
                write(
                    &n.roots.containerd_config,
                    "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
                )
            },
            "nri enabled",
            Status::Fail,
            "disable = true",
        ),
        (
            "nri absent on 1.7",
            |n| write(&n.roots.containerd_config, "version = 2\n"),
            "nri enabled",
            Status::Fail,
            "defaults to off",
        ),
        (
            "nri in disabled_plugins",
            |n| {
                write(&n.roots.containerd_config, "version = 2\ndisabled_plugins = [\"io.containerd.nri.v1.nri\"]\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n")
            },
            "nri enabled",
            Status::Fail,
            "disabled_plugins",
        ),
        (
            "nri off in an import",
            |n| {
                write(
                    &n.roots.containerd_config,
                    &format!("imports = [\"conf.d/*.toml\"]\n{CONTAINERD_CONFIG}"),
                );
                write(
                    &n.roots.etc_root.join("containerd/conf.d/50-nri.toml"),
                    "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
                );
            },
            "nri enabled",
            Status::Fail,
            "disable = true",
        ),
        (
            "nri off in an import of an import",
            |n| {
                write(
                    &n.roots.containerd_config,
                    &format!("imports = [\"conf.d/*.toml\"]\n{CONTAINERD_CONFIG}"),
                );
                write(
                    &n.roots.etc_root.join("containerd/conf.d/10-more.toml"),
                    "version = 2\nimports = [\"/etc/containerd/nested/nri.toml\"]\n",
                );
                write(
                    &n.roots.etc_root.join("containerd/nested/nri.toml"),
                    "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
                );
            },
            "nri enabled",
            Status::Fail,
            "disable = true",
        ),
        (
            "nri off in an import, the main config matched again by a glob",
            |n| {
                // containerd loads each file once: the main config's own
                // table does not come back after the drop-in's.
                write(
                    &n.roots.containerd_config,
                    &format!("imports = [\"conf.d/*.toml\", \"*.toml\"]\n{CONTAINERD_CONFIG}"),
                );
                write(
                    &n.roots.etc_root.join("containerd/conf.d/50-nri.toml"),
                    "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
                );
            },
            "nri enabled",
            Status::Fail,
            "disable = true",
        ),
        (
            "more than 64 imported files",
            |n| {
                write(
                    &n.roots.containerd_config,
                    &format!("imports = [\"conf.d/*.toml\"]\n{CONTAINERD_CONFIG}"),
                );
                for i in 0..65 {
                    write(
                        &n.roots
                            .etc_root
                            .join(format!("containerd/conf.d/{i:02}.toml")),
                        "version = 2\n",
                    );
                }
            },
            "nri enabled",
            Status::Fail,
            "imports more than 64 files",
        ),
        (
            "other socket",
            |n| {
                write(&n.roots.containerd_config, "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  socket_path = \"/run/other.sock\"\n")
            },
            "nri enabled",
            Status::Warn,
            "/run/other.sock",
        ),
        (
            "external plugins shut out",
            |n| {
                write(&n.roots.containerd_config, "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  disable_connections = true\n")
            },
            "nri enabled",
            Status::Warn,
            "disable_connections = true",
        ),
        (
            "socket down",
            |n| n.host.socket_up = false,
            "nri socket",
            Status::Fail,
            "refused",
        ),
        (
            "plugin not running",
            |n| std::fs::remove_dir_all(n.roots.proc_dir.join("4242")).unwrap(),
            "devgate registered",
            Status::Fail,
            "no devgate nri process",
        ),
        (
            "plugin on another socket",
            |n| {
                write(
                    &n.roots.proc_dir.join("4242/cmdline"),
                    "devgate\0nri\0--socket=/x.sock\0",
                )
            },
            "devgate registered",
            Status::Fail,
            "/x.sock",
        ),
        (
            "plugin runs but no runtime ever configured it",
            |n| std::fs::remove_file(n.roots.state_dir.join("runtime.json")).unwrap(),
            "devgate registered",
            Status::Fail,
            "no configure recorded",
        ),
        (
            "plugin restarted and not configured since",
            |n| super::write_record(&n.roots.state_dir, super::BOOT + 5),
            "devgate registered",
            Status::Fail,
            "the last configure in",
        ),
        (
            "the record names an earlier start of the plugin, though written after this one",
            |n| write_record_of(&n.roots.state_dir, super::BOOT + 20, 4242, 999),
            "devgate registered",
            Status::Fail,
            "was of another process (pid 4242, started at tick 999)",
        ),
        (
            "the runtime closed the connection since it configured the plugin",
            |n| {
                let path = n.roots.state_dir.join("runtime.json");
                let text = std::fs::read_to_string(&path).unwrap();
                let mut record: serde_json::Value = serde_json::from_str(&text).unwrap();
                record["disconnected_unix"] = serde_json::json!(super::BOOT + 30);
                write(&path, &record.to_string());
            },
            "devgate registered",
            Status::Fail,
            "closed its connection at unix time",
        ),
        (
            "plugin start time unreadable",
            |n| std::fs::remove_file(n.roots.proc_dir.join("4242/stat")).unwrap(),
            "devgate registered",
            Status::Warn,
            "whether a runtime accepted it is unknown",
        ),
        (
            "cdi names that containerd 1.7.30 drops without enable_cdi",
            |n| {
                n.host.version = Ok("containerd x v1.7.30 y".into());
                write(n.roots.config.as_deref().unwrap(), CDI_ON);
                super::write_cdi_specs(n);
            },
            "cdi",
            Status::Fail,
            "does not inject them (enable_cdi unset",
        ),
        (
            "cdi names without a spec",
            |n| {
                n.host.version = Ok("containerd x v2.1.9 y".into());
                write(n.roots.config.as_deref().unwrap(), CDI_ON);
            },
            "cdi specs",
            Status::Fail,
            "would be refused, the first: cdi device devgate.io/gpu=",
        ),
        (
            "cdi names with a spec gone stale",
            |n| {
                n.host.version = Ok("containerd x v2.1.9 y".into());
                write(n.roots.config.as_deref().unwrap(), CDI_ON);
                let specs = super::write_cdi_specs(n);
                let gpu = specs.join("devgate.io-gpu.json");
                let text = std::fs::read_to_string(&gpu).unwrap();
                let mut spec: serde_json::Value = serde_json::from_str(&text).unwrap();
                // Every GPU's node given minor 99: the devices changed since.
                for dev in spec["devices"].as_array_mut().unwrap() {
                    dev["containerEdits"]["deviceNodes"][0]["minor"] = 99.into();
                }
                write(&gpu, &spec.to_string());
            },
            "cdi specs",
            Status::Fail,
            "is stale for devgate.io/gpu=",
        ),
        (
            "containerd 1.7.30 with enable_cdi and runtime_cdi auto",
            |n| {
                n.host.version = Ok("containerd x v1.7.30 y".into());
                write(
                    n.roots.config.as_deref().unwrap(),
                    &CDI_ON.replace("\"on\"", "\"auto\""),
                );
                super::write_cdi_specs(n);
                // TOML allows the table after its sub-table.
                let with_cdi = format!(
                    "{CONTAINERD_CONFIG}[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = true\n"
                );
                write(&n.roots.containerd_config, &with_cdi);
            },
            "cdi",
            Status::Warn,
            "devgate cannot see that",
        ),
        (
            "hook not executable",
            |n| {
                std::fs::set_permissions(
                    n.roots.host_root.join("usr/local/bin/devgate-hook"),
                    std::fs::Permissions::from_mode(0o644),
                )
                .unwrap()
            },
            "hooks.d",
            Status::Fail,
            "not an executable file",
        ),
        (
            "static hook without devgate beside it",
            |n| {
                // busybox-static stands in for install/build.sh's static hook.
                let hook = n.roots.host_root.join("usr/local/bin/devgate-hook");
                std::fs::copy("/bin/busybox", hook).unwrap();
            },
            "hooks.d",
            Status::Fail,
            "statically linked and hands hooks-only runs to /usr/local/bin/devgate",
        ),
        (
            "hooks.d file garbage",
            |n| write(&n.roots.host_root.join(USR_HOOKS_D), "{"),
            "hooks.d",
            Status::Fail,
            "devgate.json",
        ),
        (
            "no hooks.d file",
            |n| std::fs::remove_file(n.roots.host_root.join(USR_HOOKS_D)).unwrap(),
            "hooks.d",
            Status::Warn,
            "no devgate file",
        ),
        (
            // podman 4 reads /etc's directory only where containers.conf
            // lists it (containers/common's default is /usr/share's alone).
            "hooks.d file in /etc's directory alone, on a host with podman",
            |n| {
                write(&n.roots.host_root.join("usr/bin/podman"), "");
                let etc = n.roots.etc_root.join("containers/oci/hooks.d");
                std::fs::create_dir_all(&etc).unwrap();
                std::fs::rename(
                    n.roots.host_root.join(USR_HOOKS_D),
                    etc.join("devgate.json"),
                )
                .unwrap()
            },
            "hooks.d",
            Status::Warn,
            "podman reads hooks.d files only from /usr/share/containers/oci/hooks.d",
        ),
        (
            // On a containerd node podman's config is not doctor's to fail.
            "podman's containers.conf broken",
            |n| {
                write(&n.roots.host_root.join("usr/bin/podman"), "");
                write(
                    &n.roots.etc_root.join("containers/containers.conf"),
                    "[engine",
                );
            },
            "hooks.d",
            Status::Warn,
            "containers.conf",
        ),
    ];
    each_broken_setup_fails_or_warns_its_check(cases);
}

/// Cases whose breakage may also show in a second check: a broken config or a
/// removed device tree, a missing state directory that holds no runtime record
/// either, a plugin not running whose hook then cannot be found beside it, a
/// hook binary that the hooks.d file and the plugin both name. The check a case
/// names is the one that must say so.
const ALSO_ELSEWHERE: &[&str] = &[
    "bad config",
    "state dir is a file",
    "no devices",
    "no /proc/driver/nvidia",
    "a gpu missing from /proc/driver/nvidia",
    "nri off in an import",
    "env-only gpus under systemd",
    "plugin not running",
    "hook not executable",
];

/// Breaks a copy of the healthy node for each case and asserts that the named
/// check, and no other unless the case is in [`ALSO_ELSEWHERE`], reports it
/// with its status, its text and a fix.
pub(super) fn each_broken_setup_fails_or_warns_its_check(cases: &[Case]) {
    let template = healthy();
    for (case, breakage, name, status, needle) in cases {
        let mut node = healthy_from(Some(&template.roots.host_root));
        breakage(&mut node);
        let checks = run_checks(&node.roots, &node.host);
        let c = check(&checks, name);
        assert_eq!(c.status, *status, "{case}: {c:?}");
        assert!(c.detail.contains(needle), "{case}: {c:?}");
        assert!(c.fix.is_some(), "{case}: a {status:?} needs a fix");
        let others: Vec<&Check> = checks
            .iter()
            .filter(|o| o.name != *name && o.status != Status::Pass)
            .collect();
        if !ALSO_ELSEWHERE.contains(case) {
            assert!(
                others.is_empty(),
                "{case}: other checks also changed: {others:?}"
            );
        }
    }
}

/// A record naming the running plugin shows it was configured, whatever the
/// clock did since it started (NTP stepped it back past the start here).
#[test]
fn a_record_naming_the_running_plugin_passes_whatever_the_clock_says() {
    let node = healthy();
    write_record_of(&node.roots.state_dir, BOOT + 5, 4242, 1000);
    let checks = run_checks(&node.roots, &node.host);
    let c = check(&checks, "devgate registered");
    assert_eq!(c.status, Status::Pass, "{c:?}");
}

/// containerd with `disable_connections = true` runs only pre-installed
/// plugins and listens on no socket: with devgate pre-installed and running,
/// the missing socket is what the node is built to have, a warning; with
/// devgate nri on the socket instead, it fails as before.
#[test]
fn a_preinstalled_plugin_behind_shut_connections_needs_no_socket() {
    let shut = "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  disable_connections = true\n";
    let mut node = healthy();
    write(&node.roots.containerd_config, shut);
    write(
        &node.roots.proc_dir.join("4242/cmdline"),
        "/opt/nri/plugins/10-devgate\0",
    );
    node.host.socket_up = false;
    let checks = run_checks(&node.roots, &node.host);
    let socket = check(&checks, "nri socket");
    assert_eq!(socket.status, Status::Warn, "{socket:?}");
    assert!(socket.detail.contains("pre-installed"), "{socket:?}");
    assert_eq!(check(&checks, "devgate registered").status, Status::Pass);
    let mut node = healthy();
    write(&node.roots.containerd_config, shut);
    node.host.socket_up = false;
    let checks = run_checks(&node.roots, &node.host);
    assert_eq!(check(&checks, "nri socket").status, Status::Fail);
}
