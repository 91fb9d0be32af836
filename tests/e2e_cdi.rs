//! CDI: `devgate cdi generate` specs used by a runtime, and `device_mode = "cdi"`
//! through NRI. containerd 2.1 injects CDI devices named in an adjustment, so
//! there the devices come from the spec (and a missing spec fails the
//! container); containerd 1.7 does not, and gets raw nodes. The suite runs
//! under both lines (1.7.24 and 2.1.9); podman's use of the specs, which does
//! not depend on the containerd line, is in `e2e_podman_cdi.rs`.
mod support;

use std::path::Path;
use std::process::Command;

use devgate::fixture::HostRootBuilder;
use support::node::{gpu_entry, gpus, Node, DEVICE_ALLOCATED, GPU2_NODES};
use support::{require_root, ContainerSpec, PodSpec, Runtime, DEVGATE};

/// Each /dev/nvidia* node with its numbers, and what opening the granted GPU gives.
const GPU_CHECK: &str = r#"
for d in /dev/nvidia*; do echo "node $d $(stat -c '%t:%T' $d)"; done
echo "open-granted: $(cat /dev/nvidia2 2>&1)"
"#;

fn devgate(args: &[&str]) -> String {
    let out = Command::new(DEVGATE)
        .args(args)
        .output()
        .expect("run devgate");
    assert!(
        out.status.success(),
        "devgate {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn generate(root: &Path, config: &Path, extra: &[&str]) {
    let root = root.to_string_lossy();
    let config = config.to_string_lossy();
    let mut args = vec!["cdi", "generate", "--host-root", &root, "--config", &config];
    args.extend_from_slice(extra);
    devgate(&args);
}

#[test]
fn device_mode_cdi_uses_the_spec_where_the_runtime_injects_cdi() {
    require_root();
    let runtime = Runtime::current();
    let node = Node::start_full(HostRootBuilder::hgx(), "device_mode = \"cdi\"\n", &[]);
    let cdi_dir = node.ctrd.cdi_dir();
    generate(
        node.fixture.root(),
        &node.ctrd.path("devgate.toml"),
        &["-o", &cdi_dir.to_string_lossy()],
    );
    assert!(cdi_dir.join("devgate.io-gpu.json").exists());
    assert!(cdi_dir.join("devgate.io-rdma.json").exists());

    let cri = node.cri();
    let gpu = node.gpu(2).clone();
    let annotation = gpus(&[gpu_entry(2, &gpu.uuid)]);
    let pod = cri
        .run_pod(&PodSpec::new("cdi").annotation(DEVICE_ALLOCATED, &annotation))
        .expect("RunPodSandbox");
    let run = cri
        .run_container(&pod, &ContainerSpec::shell("main", GPU_CHECK))
        .unwrap_or_else(|e| panic!("{runtime}: gpu container: {e}"));
    let nodes: Vec<&str> = run.log.lines().filter(|l| l.starts_with("node ")).collect();
    assert_eq!(nodes, GPU2_NODES, "{runtime}: {}", run.log);
    assert!(
        run.log
            .contains("open-granted: cat: can't open '/dev/nvidia2': No such device or address"),
        "{runtime}: the cgroup must allow the node: {}",
        run.log
    );

    // The plugin said which config is in force.
    let output = node.plugin.output();
    assert!(
        output.contains("config loaded") && output.contains("devgate.toml"),
        "{output}"
    );

    // `devgate status` shows the runtime and what it uses.
    let status = node.status(&["-o", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    let rt = &status["runtime"];
    assert_eq!(rt["runtime"], "containerd", "{runtime}: {rt}");
    assert_eq!(rt["device_mode"], "cdi", "{runtime}: {rt}");
    let want = match runtime {
        Runtime::Containerd21 => ("cdi", true, "v0.8.0"),
        Runtime::Containerd17 => ("nodes", false, "v0.6.1"),
    };
    assert_eq!(
        (
            rt["devices_as"].as_str(),
            rt["cdi_devices"].as_bool(),
            rt["nri_version"].as_str()
        ),
        (Some(want.0), Some(want.1), Some(want.2)),
        "{runtime}: {rt}"
    );
    assert_eq!(rt["explicit_cgroup_rules"], false, "{runtime}: {rt}");

    // A spec gone stale (written before the devices changed: here it gives
    // the GPU another minor) is refused by the plugin, where the runtime
    // would take its numbers as they are; raw nodes come from sysfs.
    let spec_path = cdi_dir.join("devgate.io-gpu.json");
    let fresh = std::fs::read_to_string(&spec_path).expect("read gpu spec");
    let mut spec: serde_json::Value = serde_json::from_str(&fresh).expect("gpu spec json");
    for dev in spec["devices"].as_array_mut().expect("devices") {
        if dev["name"] == gpu.uuid.as_str() {
            dev["containerEdits"]["deviceNodes"][0]["minor"] = 3.into();
        }
    }
    std::fs::write(&spec_path, spec.to_string()).expect("write stale spec");
    let stale = cri.run_container(&pod, &ContainerSpec::shell("stale", GPU_CHECK));
    match runtime {
        Runtime::Containerd21 => {
            let err = stale.expect_err("containerd 2.1 took a stale spec's numbers");
            let want = format!(
                "scheduling.koordinator.sh/device-allocated: gpu[0]: cdi spec {} is stale for devgate.io/gpu={}: it gives /dev/nvidia2 as c 195:3 mode 666 rw, the plan c 195:2",
                spec_path.display(),
                gpu.uuid
            );
            assert!(
                err.message().contains(&want),
                "{runtime}: {}",
                err.message()
            );
        }
        Runtime::Containerd17 => {
            let run = stale.unwrap_or_else(|e| panic!("{runtime}: raw nodes need no spec: {e}"));
            assert!(run.log.contains("node /dev/nvidia2 c3:2"), "{}", run.log);
        }
    }
    std::fs::write(&spec_path, fresh).expect("restore gpu spec");

    // Without the spec, a runtime that resolves CDI names refuses the
    // container: the devices came from the spec, and nothing falls back silently.
    std::fs::remove_file(cdi_dir.join("devgate.io-gpu.json")).expect("remove gpu spec");
    let again = cri.run_container(&pod, &ContainerSpec::shell("again", GPU_CHECK));
    match runtime {
        Runtime::Containerd21 => {
            let err = again.expect_err("containerd 2.1 resolved a cdi device without its spec");
            assert!(
                err.message().contains("devgate.io/gpu"),
                "{runtime}: {}",
                err.message()
            );
        }
        Runtime::Containerd17 => {
            let run = again.unwrap_or_else(|e| panic!("{runtime}: raw nodes need no spec: {e}"));
            assert!(run.log.contains("node /dev/nvidia2 c3:2"), "{}", run.log);
        }
    }
}
