//! `devgate plan` end to end: the binary against the fixture's HGX-class host root.
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use devgate::allocation::DEVICE_ALLOCATED;
use devgate::fixture::{Fixture, HostRootBuilder};
use serde_json::{json, Value};

/// What the plan warns of and notes: devices other pods hold, unhealthy GPUs,
/// a moved VF without a host GID.
#[path = "cli_plan/warnings.rs"]
mod warnings;

fn fixture() -> (tempfile::TempDir, Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let fx = HostRootBuilder::hgx()
        .build(&dir.path().join("root"))
        .unwrap();
    (dir, fx)
}

fn pod(annotations: Value, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "4f1c", "annotations": annotations, "labels": labels},
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox"}],
            "containers": [{"name": "main", "image": "cuda"}, {"name": "sidecar", "image": "busybox"}]
        },
        "status": {"phase": "Pending"}
    })
}

fn allocated(annotation: &str) -> Value {
    pod(json!({ DEVICE_ALLOCATED: annotation }), json!({}))
}

/// Runs `devgate plan` on `pod_text` (written to a file, or piped for `-`).
fn plan_cmd(root: &Path, pod_text: &[u8], extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    plan_cmd_with_state(root, pod_text, &dir.path().join("state"), extra)
}

/// [`plan_cmd`] reading the ledger under `state`.
fn plan_cmd_with_state(root: &Path, pod_text: &[u8], state: &Path, extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.json");
    std::fs::write(&file, pod_text).unwrap();
    let stdin = extra.contains(&"-");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_devgate"));
    cmd.arg("plan")
        .args(["--host-root", root.to_str().unwrap()])
        .args(["--state-dir", state.to_str().unwrap()]);
    if !extra.contains(&"--config") {
        cmd.args(["--config", "/nonexistent/devgate.toml"]);
    }
    if !stdin {
        cmd.args(["--pod", file.to_str().unwrap()]);
    }
    cmd.args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if stdin {
        input.write_all(pod_text).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn plan_ok(root: &Path, pod: &Value, extra: &[&str]) -> Value {
    serde_json::from_slice(&plan_out(root, pod, extra)).unwrap()
}

/// The plan as `-o table` prints it.
fn plan_table(root: &Path, pod: &Value, extra: &[&str]) -> String {
    let extra = [extra, &["-o", "table"]].concat();
    String::from_utf8(plan_out(root, pod, &extra)).unwrap()
}

/// What a successful `devgate plan` printed.
fn plan_out(root: &Path, pod: &Value, extra: &[&str]) -> Vec<u8> {
    let out = plan_cmd(root, pod.to_string().as_bytes(), extra);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    out.stdout
}

#[test]
fn unannotated_pod_is_an_empty_plan() {
    let (_dir, fx) = fixture();
    let p = plan_ok(fx.root(), &pod(json!({}), json!({})), &[]);
    for key in ["devices", "mounts", "network", "claims"] {
        assert_eq!(p[key], json!([]), "{key}");
    }
    assert_eq!(p["env"], json!({}));
    assert_eq!(p["container"], "main");
    // No annotations at all, and null maps, as YAML may carry them.
    let yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  annotations: null\nspec:\n  containers:\n  - name: app\n";
    let out = plan_cmd(fx.root(), yaml.as_bytes(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn gpu_and_vf_plan_fields() {
    let (_dir, fx) = fixture();
    let inv = fx.expected();
    let (g0, g1) = (&inv.gpus[0], &inv.gpus[5]);
    let nic = &inv.rdma[1];
    let vf = &nic.vfs[2];
    let ann = format!(
        r#"{{"gpu":[{{"minor":{},"id":"{}","resources":{{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}}},{{"minor":{},"resources":{{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}}}],
            "rdma":[{{"minor":1,"id":"{}","resources":{{"koordinator.sh/rdma":"1"}},"extension":{{"vfs":[{{"minor":-1,"busID":"{}"}}]}}}}]}}"#,
        g0.minor, g0.uuid, g1.minor, nic.bus_id, vf.bus_id
    );
    let labels = json!({"koordinator.sh/gpu-isolation-provider": "HAMi-core"});
    let p = plan_ok(
        fx.root(),
        &pod(json!({ DEVICE_ALLOCATED: ann }), labels),
        &["--container", "main"],
    );

    let dev0 = &p["devices"][0];
    assert_eq!(dev0["path"], format!("/dev/nvidia{}", g0.minor));
    assert_eq!(
        (dev0["type"].as_str(), dev0["major"].as_u64()),
        (Some("c"), Some(195))
    );
    assert_eq!(dev0["minor"], g0.minor);
    assert_eq!(dev0["file_mode"], 0o666);
    let paths: Vec<&str> = p["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    for want in [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/infiniband/rdma_cm",
    ] {
        assert!(paths.contains(&want), "{want} in {paths:?}");
    }
    let verbs = vf
        .rdma
        .as_ref()
        .unwrap()
        .char_devs
        .iter()
        .find(|c| c.name.starts_with("uverbs"))
        .unwrap();
    assert!(
        paths.contains(&format!("/dev/infiniband/{}", verbs.name).as_str()),
        "{paths:?}"
    );

    assert_eq!(
        p["env"]["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", g0.uuid, g1.uuid)
    );
    assert_eq!(
        p["env"]["CUDA_DEVICE_MEMORY_LIMIT_1"],
        (40u64 << 30).to_string()
    );
    assert_eq!(p["env"]["CUDA_DEVICE_SM_LIMIT_0"], "50");
    assert_eq!(p["env"]["LD_PRELOAD"], "/usr/local/vgpu/libvgpu.so");
    assert_eq!(p["mounts"].as_array().unwrap().len(), 2);

    let net = &p["network"][0];
    assert_eq!(net["pf"], nic.bus_id.to_string());
    assert_eq!(net["vf_index"], vf.index);
    assert_eq!(net["vf_bus_id"], vf.bus_id.to_string());
    assert_eq!(net["netdev"], json!(vf.netdev));
    assert_eq!(net["rdma_device"], vf.rdma.as_ref().unwrap().name);
    assert_eq!(net["container_ifname"], "net1");

    let claims = &p["claims"];
    assert_eq!(
        claims[0],
        json!({"device": {"kind": "gpu", "id": g0.uuid}, "share": {"mode": "shared", "core": 50, "memory_ratio": 50}})
    );
    assert_eq!(
        claims[2],
        json!({"device": {"kind": "vf", "id": vf.bus_id.to_string()}, "share": {"mode": "exclusive"}, "pf": nic.bus_id.to_string()})
    );

    // Same pod, a container left out by devgate.io/containers: nothing, but the claims.
    let mut only = pod(
        json!({ DEVICE_ALLOCATED: ann, "devgate.io/containers": "main" }),
        json!({}),
    );
    let p = plan_ok(fx.root(), &only, &["--container", "sidecar"]);
    assert_eq!(
        (
            p["selected"].as_bool(),
            p["devices"].as_array().unwrap().len()
        ),
        (Some(false), 0)
    );
    assert_eq!(p["claims"].as_array().unwrap().len(), 3);
    // Init containers get the devices unless the list leaves them out; stdin works.
    only["metadata"]["annotations"] = json!({ DEVICE_ALLOCATED: ann });
    let table = plan_table(fx.root(), &only, &["--pod", "-", "--container", "setup"]);
    assert!(table.contains("/dev/nvidiactl"), "{table}");
}

/// Every invalid or unsatisfiable allocation: exit 1 and exactly one stderr line
/// naming the annotation, the entry and the reason.
#[test]
fn bad_allocations_exit_1_with_one_line() {
    let (_dir, fx) = fixture();
    let inv = fx.expected();
    let (nic0, nic1) = (&inv.rdma[0], &inv.rdma[1]);
    let other_uuid = &inv.gpus[1].uuid;
    let many: Vec<String> = (0..257).map(|i| format!(r#"{{"minor":{i}}}"#)).collect();
    #[rustfmt::skip]
    let cases: Vec<(&str, String, &str)> = vec![
        ("malformed json", r#"{"gpu":[{"minor":0}"#.into(), "-: malformed"),
        ("unknown minor", r#"{"gpu":[{"minor":77}]}"#.into(), "gpu[0]: no gpu with minor 77"),
        ("uuid of another gpu", format!(r#"{{"gpu":[{{"minor":{},"id":"{other_uuid}"}}]}}"#, inv.gpus[0].minor), "gpu[0]: id"),
        ("vf not under its pf", format!(r#"{{"rdma":[{{"minor":0,"id":"{}","extension":{{"vfs":[{{"busID":"{}"}}]}}}}]}}"#, nic0.bus_id, nic1.vfs[0].bus_id), "rdma[0].vfs[0]: vf"),
        ("bus id not a vf", format!(r#"{{"rdma":[{{"minor":0,"extension":{{"vfs":[{{"busID":"{}"}}]}}}}]}}"#, nic1.bus_id), "rdma[0].vfs[0]: busID"),
        ("path-like", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"busID":"../../../dev/sda"}]}}]}"#.into(), "rdma[0].vfs[0]: busID"),
        ("duplicate", r#"{"gpu":[{"minor":0},{"minor":0}]}"#.into(), "gpu[1]: duplicate"),
        ("share over 100", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"150"}}]}"#.into(), "gpu[0]: resources[koordinator.sh/gpu-core] 150"),
        ("negative", r#"{"gpu":[{"minor":-3}]}"#.into(), "gpu[0]: minor -3 is negative"),
        ("oversized", format!(r#"{{"gpu":[],"x":"{}"}}"#, "a".repeat(70_000)), "bytes, over the limit"),
        ("too many entries", format!(r#"{{"gpu":[{}]}}"#, many.join(",")), "gpu[256]: more than 256"),
    ];
    for (name, ann, want) in cases {
        let out = plan_cmd(fx.root(), allocated(&ann).to_string().as_bytes(), &[]);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}");
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr:?}");
        let prefix = format!("devgate: {DEVICE_ALLOCATED}: ");
        assert!(
            stderr.starts_with(&prefix) && stderr.contains(want),
            "{name}: want {want:?} in {stderr:?}"
        );
    }
}

#[test]
fn bad_pod_files_exit_1_with_one_line() {
    let (_dir, fx) = fixture();
    let big = vec![b' '; 1024 * 1024 + 1];
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<u8>, Vec<&str>, &str)> = vec![
        ("not a pod", b"{\"metadata\": 5}".to_vec(), vec![], "not a pod object"),
        ("too large", big, vec![], "larger than"),
        ("unknown container", pod(json!({}), json!({})).to_string().into_bytes(), vec!["--container", "nope"], "no container \"nope\""),
        ("bad container list", pod(json!({"devgate.io/containers": "a/b"}), json!({})).to_string().into_bytes(), vec![], "devgate.io/containers: [0]"),
    ];
    for (name, text, extra, want) in cases {
        let out = plan_cmd(fx.root(), &text, &extra);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr:?}");
        assert!(
            stderr.starts_with("devgate: ") && stderr.contains(want),
            "{name}: {stderr:?}"
        );
    }
}

/// Communication-library variables from the host's own tables: the VF's
/// container name, a variable the pod spec sets left alone, and the RoCE v2 GID
/// index read from sysfs for a whole PF alone (beside a VF whose addresses are
/// the pod's, none); the table shows them under ENV.
#[test]
fn comm_env_from_the_host_and_the_pod_spec() {
    let dir = tempfile::tempdir().unwrap();
    let fx = HostRootBuilder::hgx()
        .roce_ipv4(true)
        .build(&dir.path().join("root"))
        .unwrap();
    let inv = fx.expected();
    let (nic, whole) = (&inv.rdma[1], &inv.rdma[3]);
    let vf = &nic.vfs[2];
    let ann = format!(
        r#"{{"gpu":[{{"minor":{}}}],"rdma":[{{"minor":1,"id":"{}","extension":{{"vfs":[{{"busID":"{}"}}]}}}},{{"minor":3,"id":"{}"}}]}}"#,
        inv.gpus[1].minor, nic.bus_id, vf.bus_id, whole.bus_id
    );
    let mut p = allocated(&ann);
    p["spec"]["containers"][0]["env"] = json!([{"name": "UCX_NET_DEVICES", "value": "mine"}]);
    let vf_dev = &vf.rdma.as_ref().unwrap().name;
    let hca = format!("{vf_dev}:1,{}:1", whole.rdma.name);
    let plan = plan_ok(fx.root(), &p, &[]);
    let env = &plan["env"];
    assert_eq!(env["NCCL_IB_HCA"], format!("={hca}"));
    assert!(env.get("NCCL_IB_GID_INDEX").is_none(), "{env}");
    assert_eq!(env["NCCL_SOCKET_IFNAME"], "net1");
    assert_eq!(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert!(env.get("UCX_NET_DEVICES").is_none(), "{env}");
    assert_eq!(plan["warnings"], json!([]));
    let ann = format!(r#"{{"rdma":[{{"minor":3,"id":"{}"}}]}}"#, whole.bus_id);
    let alone = plan_ok(fx.root(), &allocated(&ann), &[]);
    assert_eq!(alone["env"]["NCCL_IB_GID_INDEX"], "3", "{alone}");

    // Another container of the pod does not set it: it gets the devgate value.
    let text = plan_table(fx.root(), &p, &["--container", "sidecar"]);
    assert!(
        text.contains(&format!("\nUCX_NET_DEVICES={hca}\n")),
        "{text}"
    );
    assert!(text.contains(&format!("\nNCCL_IB_HCA=={hca}\n")), "{text}");
}

/// A pod the namespace rules refuse (the plugin's first check) gets no plan:
/// the command fails as the creation would, with its message.
#[test]
fn a_pod_the_namespace_rules_refuse_has_no_plan() {
    let (dir, fx) = fixture();
    let gpu = &fx.expected().gpus[0];
    let pod = allocated(&format!(r#"{{"gpu":[{{"minor":{}}}]}}"#, gpu.minor));
    let config = dir.path().join("config.toml");
    for (rules, rule) in [
        ("denied_namespaces = [\"ml\"]\n", "is in denied_namespaces"),
        (
            "allowed_namespaces = [\"batch\"]\n",
            "is not in allowed_namespaces",
        ),
    ] {
        std::fs::write(&config, rules).unwrap();
        let out = plan_cmd(
            fx.root(),
            pod.to_string().as_bytes(),
            &["--config", config.to_str().unwrap()],
        );
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "{DEVICE_ALLOCATED}: pod ml/train-0: namespace ml {rule}"
            )),
            "{stderr}"
        );
    }
    // A pod file without a namespace is created in `default`.
    let mut unplaced = pod.clone();
    unplaced["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    std::fs::write(&config, "denied_namespaces = [\"default\"]\n").unwrap();
    let out = plan_cmd(
        fx.root(),
        unplaced.to_string().as_bytes(),
        &["--config", config.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pod default/train-0: namespace default is in denied_namespaces"),
        "{stderr}"
    );
    // Allowed: planned.
    std::fs::write(&config, "allowed_namespaces = [\"ml\"]\n").unwrap();
    let plan = plan_ok(fx.root(), &pod, &["--config", config.to_str().unwrap()]);
    assert!(
        plan["devices"].as_array().is_some_and(|d| !d.is_empty()),
        "{plan}"
    );
}

/// A whole PF's RDMA device stays in the host's network namespace: on a
/// kernel in exclusive RDMA netns mode, a pod with a network of its own (no
/// `hostNetwork`) is refused as the plugin refuses it at creation, and a
/// `hostNetwork` pod gets it.
#[test]
fn a_whole_pf_in_exclusive_mode_follows_the_pods_host_network() {
    use devgate::config::RdmaNetnsMode;
    let dir = tempfile::tempdir().unwrap();
    let fx = HostRootBuilder::hgx()
        .rdma_netns_mode(Some(RdmaNetnsMode::Exclusive))
        .build(&dir.path().join("root"))
        .unwrap();
    let whole = &fx.expected().rdma[3];
    let ann = format!(r#"{{"rdma":[{{"minor":3,"id":"{}"}}]}}"#, whole.bus_id);
    let pod = allocated(&ann);
    let out = plan_cmd(fx.root(), pod.to_string().as_bytes(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{DEVICE_ALLOCATED}: rdma[0]: pf {} is used without vfs, so its rdma device stays in the host network namespace",
            whole.bus_id
        )),
        "{stderr}"
    );
    let mut on_host = pod.clone();
    on_host["spec"]["hostNetwork"] = json!(true);
    let plan = plan_ok(fx.root(), &on_host, &[]);
    assert!(
        plan["devices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["path"].as_str().unwrap().starts_with("/dev/infiniband/")),
        "{plan}"
    );
    assert!(
        !plan["warnings"].to_string().contains("host netns"),
        "{plan}"
    );
}
