//! The shipped manifests read as kubelet reads them: the DaemonSet's containers
//! as CRI container specs (command, args, env, security context, mounts), each
//! hostPath as a directory of the test's own, the ConfigMap's config with the
//! hook paths of those directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_cri::v1::{Int64Value, Mount, SeLinuxOption};
use serde_yaml_ng::Value;

use crate::support::{ContainerSpec, Containerd};

pub(super) fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub(super) fn yaml(rel: &str) -> Value {
    use serde::Deserialize;
    let text = std::fs::read_to_string(repo().join(rel)).expect("read manifest");
    let found = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).expect("yaml document"))
        .find(|d| matches!(d["kind"].as_str(), Some("DaemonSet" | "ConfigMap")));
    found.expect("a DaemonSet or ConfigMap document")
}

pub(super) fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The test's directory for each hostPath the manifest mounts; a hostPath this
/// table does not know fails the test, so the manifest cannot grow untested.
pub(super) struct HostPaths {
    dirs: BTreeMap<&'static str, PathBuf>,
}

impl HostPaths {
    pub(super) fn new(ctrd: &Containerd, host_root: &Path) -> HostPaths {
        let dirs = BTreeMap::from([
            // containerd's nri.sock lies at the top of the instance directory.
            ("/var/run/nri", ctrd.path("")),
            ("/run/devgate", ctrd.path("devgate-state")),
            ("/var/lib/devgate", ctrd.path("gpu-health")),
            ("/sys", host_root.join("sys")),
            ("/proc", host_root.join("proc")),
            ("/dev", host_root.join("dev")),
            ("/dev/char", host_root.join("dev/char")),
            ("/usr", host_root.join("usr")),
            ("/opt/devgate/bin", ctrd.path("hook-bin")),
            ("/run/netns", ctrd.path("netns")),
            ("/etc/cdi", ctrd.cdi_dir()),
            ("/var/run/cdi", ctrd.path("run-cdi")),
        ]);
        for dir in dirs.values() {
            std::fs::create_dir_all(dir).expect("host path dir");
        }
        HostPaths { dirs }
    }

    pub(super) fn get(&self, host_path: &str) -> &Path {
        self.dirs
            .get(host_path)
            .unwrap_or_else(|| panic!("hostPath {host_path} has no test directory"))
    }
}

/// The CRI mounts of a container spec of the manifest: its volumeMounts, each
/// resolved through the pod's volumes (hostPath, or the ConfigMap's directory).
fn mounts(ctr: &Value, volumes: &Value, hosts: &HostPaths, config_dir: &Path) -> Vec<Mount> {
    let volume = |name: &str| {
        volumes
            .as_sequence()
            .and_then(|v| v.iter().find(|v| v["name"].as_str() == Some(name)))
            .unwrap_or_else(|| panic!("volume {name} is mounted but not declared"))
    };
    let mounts = ctr["volumeMounts"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    mounts
        .iter()
        .map(|m| {
            let v = volume(m["name"].as_str().expect("volumeMount name"));
            let host_path = match v["hostPath"]["path"].as_str() {
                Some(p) => hosts.get(p).to_path_buf(),
                None if v["configMap"].is_mapping() => config_dir.to_path_buf(),
                None => panic!("volume {v:?}: neither hostPath nor configMap"),
            };
            Mount {
                container_path: m["mountPath"].as_str().expect("mountPath").to_string(),
                host_path: host_path.to_string_lossy().into_owned(),
                readonly: m["readOnly"].as_bool().unwrap_or(false),
                ..Default::default()
            }
        })
        .collect()
}

/// The mount kubelet adds to every container for its termination message: a
/// file of its own, at `terminationMessagePath` (default `/dev/termination-log`).
fn termination_log(ctr: &Value, config_dir: &Path) -> Mount {
    let name = ctr["name"].as_str().expect("container name");
    let file = config_dir.with_file_name(format!("termination-log-{name}"));
    std::fs::write(&file, "").expect("termination log file");
    Mount {
        container_path: ctr["terminationMessagePath"]
            .as_str()
            .unwrap_or("/dev/termination-log")
            .to_string(),
        host_path: file.to_string_lossy().into_owned(),
        ..Default::default()
    }
}

/// A container spec of the manifest as the CRI ContainerSpec kubelet would send.
pub(super) fn container(
    ctr: &Value,
    volumes: &Value,
    hosts: &HostPaths,
    config_dir: &Path,
) -> ContainerSpec {
    let mut command = strs(&ctr["command"]);
    command.extend(strs(&ctr["args"]));
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let name = ctr["name"].as_str().expect("container name");
    let mut spec = ContainerSpec::new(name, &command).image(ctr["image"].as_str().expect("image"));
    for env in ctr["env"].as_sequence().cloned().unwrap_or_default() {
        let key = env["name"].as_str().expect("env name");
        // The downward API's spec.nodeName, as kubelet resolves it.
        let value = env["value"].as_str().unwrap_or("dg-node");
        spec = spec.env(key, value);
    }
    let security = ctr["securityContext"].clone();
    let mut mounts = mounts(ctr, volumes, hosts, config_dir);
    mounts.push(termination_log(ctr, config_dir));
    spec.edit(move |c| {
        c.mounts = mounts.clone();
        let linux = c.linux.get_or_insert_with(Default::default);
        let sc = linux.security_context.get_or_insert_with(Default::default);
        sc.privileged = security["privileged"].as_bool().unwrap_or(false);
        sc.readonly_rootfs = security["readOnlyRootFilesystem"]
            .as_bool()
            .unwrap_or(false);
        sc.run_as_user = security["runAsUser"]
            .as_i64()
            .map(|value| Int64Value { value });
        // Sent as kubelet sends it; containerd applies it only where SELinux is on.
        let selinux = &security["seLinuxOptions"];
        sc.selinux_options = selinux.as_mapping().map(|_| SeLinuxOption {
            r#type: selinux["type"].as_str().unwrap_or_default().to_string(),
            ..Default::default()
        });
    })
}

/// `text` with the line setting `key` replaced by one setting it to `value`.
fn set(text: &str, key: &str, value: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{key} =")))
        .unwrap_or_else(|| panic!("the ConfigMap sets no {key}"));
    text.replace(line, &format!("{key} = {value}"))
}

/// The ConfigMap's config.toml with the hook paths of the test's host paths.
pub(super) fn write_config(dir: &Path, hosts: &HostPaths) {
    let cm = yaml("install/kubernetes/configmap.yaml");
    let text = cm["data"]["config.toml"].as_str().expect("config.toml");
    let hook_bin = hosts.get("/opt/devgate/bin").join("devgate-hook");
    let replaced = [
        ("hook_path", hook_bin.as_path()),
        ("hook_state_dir", hosts.get("/run/devgate")),
    ]
    .iter()
    .fold(text.to_string(), |text, (key, path)| {
        set(&text, key, &format!("\"{}\"", path.display()))
    });
    // No API server here: the grant check has its own end-to-end test.
    let replaced = set(&replaced, "grant_check", "\"off\"");
    std::fs::create_dir_all(dir).expect("config dir");
    std::fs::write(dir.join("config.toml"), replaced).expect("write config");
}
