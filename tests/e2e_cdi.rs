//! CDI: `devgate cdi generate` specs used by a runtime, and `device_mode = "cdi"`
//! through NRI. containerd 2.1 injects CDI devices named in an adjustment, so
//! there the devices come from the spec (and a missing spec fails the
//! container); containerd 1.7 does not, and gets raw nodes. podman 4.3.1
//! (bookworm) resolves `--device devgate.io/...` from a 0.5.0 spec: its CDI
//! library (v0.5.2) knows no spec version after 0.5.0.
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use devgate::fixture::HostRootBuilder;
use support::node::{gpu_entry, gpus, Node, DEVICE_ALLOCATED};
use support::{image_set, require_root, ContainerSpec, PodSpec, Runtime, DEVGATE};

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
    assert_eq!(
        nodes,
        [
            "node /dev/nvidia-uvm 1fc:0",
            "node /dev/nvidia-uvm-tools 1fc:1",
            "node /dev/nvidia2 c3:2",
            "node /dev/nvidiactl c3:ff",
        ],
        "{runtime}: {}",
        run.log
    );
    assert!(
        run.log
            .contains("open-granted: cat: can't open '/dev/nvidia2': No such device or address"),
        "{runtime}: the cgroup must allow the node: {}",
        run.log
    );

    // `devgate status` shows the runtime and what it uses.
    let health = node.ctrd.path("health");
    let status = devgate(&[
        "status",
        "--state-dir",
        &node.state_dir().to_string_lossy(),
        "--health-dir",
        &health.to_string_lossy(),
        "-o",
        "json",
    ]);
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

/// A CDI spec file in podman's dynamic spec directory, removed on drop.
struct SpecFile(PathBuf);

impl Drop for SpecFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Private podman storage (vfs) so the host's is left alone; settings this VM needs.
fn podman(store: &Path, args: &[&str]) -> std::process::Output {
    let root = store.join("root");
    let run = store.join("run");
    Command::new("podman")
        .arg("--root")
        .arg(&root)
        .arg("--runroot")
        .arg(&run)
        .args(["--storage-driver", "vfs", "--cgroup-manager", "cgroupfs"])
        .args(["--events-backend", "file"])
        .args(args)
        .output()
        .expect("run podman (tests/setup-host.sh installs it)")
}

const RDMA_CHECK: &str = r#"
for d in /dev/infiniband/*; do echo "node $d $(stat -c '%t:%T' $d)"; done
for d in /dev/infiniband/uverbs*; do echo "open: $(cat $d 2>&1)"; done
"#;

#[test]
fn podman_runs_a_container_with_a_devgate_rdma_vf_by_pci_address() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .expect("host root");
    let config = dir.path().join("none.toml");
    let spec = SpecFile(PathBuf::from(format!(
        "/var/run/cdi/devgate-e2e-{}.json",
        std::process::id()
    )));
    std::fs::create_dir_all("/var/run/cdi").expect("create /var/run/cdi");
    let out = podman(
        dir.path(),
        &["load", "-i", &image_set().workload.to_string_lossy()],
    );
    assert!(out.status.success(), "podman load: {out:?}");
    let inv = fixture.expected();
    let nic = &inv.rdma[0];
    let vf = &nic.vfs[0];
    let device = format!("devgate.io/rdma={}", vf.bus_id);
    let run = |name: &str| {
        podman(
            dir.path(),
            &[
                "run",
                "--rm",
                "--name",
                name,
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                "--device",
                &device,
                support::WORKLOAD_IMAGE,
                "sh",
                "-c",
                RDMA_CHECK,
            ],
        )
    };
    let spec_path = spec.0.to_string_lossy().into_owned();

    // cdiVersion 0.6.0 is past what podman 4.3's CDI library knows.
    generate(
        fixture.root(),
        &config,
        &["--kind", "rdma", "-o", &spec_path],
    );
    let out = run("cdi-060");
    assert!(
        !out.status.success(),
        "podman 4.3 took a 0.6.0 spec: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unresolvable CDI devices"),
        "{out:?}"
    );

    generate(
        fixture.root(),
        &config,
        &["--kind", "rdma", "--cdi-version", "0.5.0", "-o", &spec_path],
    );
    let out = run("cdi-050");
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "podman run: {out:?}");
    let rdma = vf.rdma.as_ref().expect("fixture vf has an rdma device");
    let mut want: Vec<String> = rdma
        .char_devs
        .iter()
        .filter(|c| !c.name.starts_with("issm"))
        .map(|c| {
            format!(
                "node /dev/infiniband/{} {:x}:{:x}",
                c.name, c.dev.major, c.dev.minor
            )
        })
        .collect();
    let cm = inv.rdma_cm.expect("fixture rdma_cm");
    want.push(format!(
        "node /dev/infiniband/rdma_cm {:x}:{:x}",
        cm.major, cm.minor
    ));
    want.sort();
    let mut got: Vec<String> = log
        .lines()
        .filter(|l| l.starts_with("node "))
        .map(String::from)
        .collect();
    got.sort();
    assert_eq!(got, want, "{log}");
    assert!(
        log.contains("No such device or address"),
        "cgroup must allow uverbs: {log}"
    );
}
