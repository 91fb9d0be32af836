//! The shipped install files agree with devgate: install/config.toml and the
//! ConfigMap parse as devgate's config, the DaemonSet mounts the host paths
//! devgate needs, passes flags `devgate nri` knows, and runs as the service
//! account the RBAC binds.
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use devgate::config::Config;
use serde_yaml_ng::Value;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn documents(rel: &str) -> Vec<Value> {
    use serde::Deserialize;
    let text = read(rel);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_sequence()
        .map(|s| s.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default()
}

#[test]
fn shipped_configs_parse() {
    Config::parse(&read("install/config.toml"), "install/config.toml").unwrap();
    let cm = &documents("install/kubernetes/configmap.yaml")[0];
    let text = cm["data"]["config.toml"].as_str().expect("config.toml key");
    let config = Config::parse(text, "configmap").unwrap();
    assert_eq!(config.hook_path, "/opt/devgate/bin/devgate-hook");
    // Missing credentials refuse device pods instead of turning the check off.
    assert_eq!(
        config.grant_check,
        Some(devgate::grant::GrantCheck::Requests)
    );
    // The host's /usr is mounted at /host/usr (daemonset.yaml).
    let libs = config.gpu.nvml_library.candidates();
    assert!(
        libs.len() >= 2 && libs.iter().all(|l| l.starts_with("/host/usr/")),
        "{libs:?}"
    );
}

/// runc runs the hook on the host: the ConfigMap's hook paths are the hostPaths
/// the DaemonSet mounts the hook and the plugin's state directory from.
#[test]
fn configmap_hook_paths_are_the_daemonsets_host_paths() {
    let cm = &documents("install/kubernetes/configmap.yaml")[0];
    let config = Config::parse(cm["data"]["config.toml"].as_str().unwrap(), "configmap").unwrap();
    let ds = documents("install/kubernetes/daemonset.yaml");
    let spec = &of_kind(&ds, "DaemonSet")[0]["spec"]["template"]["spec"];
    let host_path_of = |mount_path: &str| {
        let mount = spec["containers"][0]["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .chain(
                spec["initContainers"][0]["volumeMounts"]
                    .as_sequence()
                    .unwrap(),
            )
            .find(|m| m["mountPath"].as_str() == Some(mount_path))
            .unwrap_or_else(|| panic!("nothing mounted at {mount_path}"));
        spec["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .and_then(|v| v["hostPath"]["path"].as_str())
            .unwrap_or_else(|| panic!("{mount_path} is not a hostPath"))
            .to_string()
    };
    // The plugin's --state-dir and the init container's copy target.
    let args = strs(&spec["containers"][0]["args"]);
    let state_dir = args
        .iter()
        .find_map(|a| a.strip_prefix("--state-dir="))
        .expect("--state-dir=");
    assert_eq!(config.hook_state_dir, host_path_of(state_dir));
    let hook = Path::new(&config.hook_path);
    let copy = strs(&spec["initContainers"][0]["args"]).join(" ");
    assert!(copy.contains(&hook.display().to_string()), "{copy}");
    let hook_dir = hook.parent().unwrap().to_str().unwrap();
    assert_eq!(hook_dir, host_path_of(hook_dir));
}

#[test]
fn daemonset_mounts_what_devgate_needs_and_matches_rbac() {
    let ds = documents("install/kubernetes/daemonset.yaml");
    let spec = &of_kind(&ds, "DaemonSet")[0]["spec"]["template"]["spec"];
    let host_paths: BTreeSet<&str> = spec["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    for want in [
        "/var/run/nri",
        "/run/devgate",
        "/var/lib/devgate",
        "/sys",
        "/proc",
        "/dev",
        "/dev/char",
        "/usr",
        "/opt/devgate/bin",
        "/run/netns",
    ] {
        assert!(
            host_paths.contains(want),
            "no hostPath {want}: {host_paths:?}"
        );
    }
    assert_eq!(spec["hostPID"].as_bool(), Some(true));
    assert_eq!(
        spec["nodeSelector"]["kubernetes.io/os"].as_str(),
        Some("linux")
    );
    // A rollout waits for each new plugin to be configured by the runtime,
    // in the state directory the plugin writes.
    let plugin = &spec["containers"][0];
    let probe = strs(&plugin["readinessProbe"]["exec"]["command"]);
    assert_eq!(probe[..2], ["/usr/local/bin/devgate", "ready"]);
    let state = strs(&plugin["args"])
        .into_iter()
        .find(|a| a.starts_with("--state-dir="))
        .unwrap();
    assert!(probe.contains(&state), "{probe:?} {state}");
    let ds_spec = &of_kind(&ds, "DaemonSet")[0]["spec"];
    assert!(ds_spec["minReadySeconds"].as_u64().is_some_and(|s| s > 0));
    // Longer than the plugin's wait for teardowns at exit (RELEASE_WAIT, 20 s).
    let grace = spec["terminationGracePeriodSeconds"].as_u64();
    assert!(grace.is_some_and(|g| g > 20), "{grace:?}");
    // The grant check's credentials, whatever the cluster's automount default.
    assert_eq!(spec["automountServiceAccountToken"].as_bool(), Some(true));

    // The init container writes the hook into the host's /opt/devgate/bin:
    // refused to container_t on an SELinux host.
    let init = &spec["initContainers"][0];
    assert_eq!(
        init["securityContext"]["seLinuxOptions"]["type"].as_str(),
        Some("spc_t")
    );

    let container = &spec["containers"][0];
    // NVML opens /dev/nvidia* by those paths: the host's /dev, read-only, so
    // that nodes a driver makes after the start show; kubelet's termination
    // log then cannot be bound into /dev.
    let dev = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str() == Some("/dev"))
        .expect("the host's /dev over the container's");
    let host_dev = spec["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == dev["name"])
        .expect("the /dev mount's volume");
    assert_eq!(host_dev["hostPath"]["path"].as_str(), Some("/dev"));
    assert_eq!(dev["readOnly"].as_bool(), Some(true));
    let message = container["terminationMessagePath"]
        .as_str()
        .expect("a termination message path off /dev");
    assert!(!message.starts_with("/dev/"), "{message}");
    let args = strs(&container["args"]);
    assert_eq!(args[0], "nri");
    // clap rejects an unknown flag before it reaches --help.
    let out = Command::new(env!("CARGO_BIN_EXE_devgate"))
        .args(&args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let rbac = documents("install/kubernetes/rbac.yaml");
    let account = spec["serviceAccountName"].as_str().unwrap();
    let namespace = of_kind(&ds, "DaemonSet")[0]["metadata"]["namespace"]
        .as_str()
        .unwrap();
    let accounts: Vec<(&str, &str)> = of_kind(&rbac, "ServiceAccount")
        .iter()
        .map(|sa| {
            let m = &sa["metadata"];
            (
                m["name"].as_str().unwrap(),
                m["namespace"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(accounts.contains(&(account, namespace)), "{accounts:?}");
    // What each account may do, through the roles bound to it.
    let roles = of_kind(&rbac, "ClusterRole");
    let rules_of = |who: &str| -> Vec<(&str, &str, Vec<&str>)> {
        of_kind(&rbac, "ClusterRoleBinding")
            .iter()
            .filter(|b| b["subjects"][0]["name"].as_str() == Some(who))
            .flat_map(|b| {
                let role = b["roleRef"]["name"].as_str();
                roles
                    .iter()
                    .filter(move |r| r["metadata"]["name"].as_str() == role)
            })
            .flat_map(|r| r["rules"].as_sequence().unwrap().iter())
            .map(|r| {
                (
                    strs(&r["apiGroups"])[0],
                    strs(&r["resources"])[0],
                    strs(&r["verbs"]),
                )
            })
            .collect()
    };
    let allows = |who: &str, group: &str, resource: &str, verb: &str| {
        rules_of(who)
            .iter()
            .any(|(g, r, v)| *g == group && *r == resource && v.contains(&verb))
    };
    assert!(allows(account, "", "pods", "watch"));
    for (_, _, verbs) in rules_of(account) {
        for write in ["create", "update", "patch", "delete"] {
            assert!(
                !verbs.contains(&write),
                "the DaemonSet's account may {write}"
            );
        }
    }
    assert!(allows(
        "devgate-device-report",
        "scheduling.koordinator.sh",
        "devices",
        "patch"
    ));
}
