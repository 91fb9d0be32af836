//! The README's main job: a private containerd 1.7 with NRI, devgate on a
//! simulated 8-GPU, 8-NIC HGX host root, and a GPU + RDMA pod created through CRI
//! as kubelet does. The pod's VF is a veth pair named like the simulated VF
//! netdev. Prints what the container got, then what came back after removal,
//! and checks each: it exits 1, naming what was wrong, when any differs.
//! Run as root: `./install/demo.sh`.
#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;

use devgate::fixture::HostRootBuilder;
use support::node::{allocation, gpu_entry, vf_entry, Node, DEVICE_ALLOCATED};
use support::{require_root, wait_for, ContainerSpec, PodSpec, SLOW};

const SHOW: &str = r#"
echo "device nodes (major:minor):"
for d in /dev/nvidia* /dev/infiniband/*; do set -- $(stat -c '%t %T' $d); printf '  %-28s %d:%d\n' $d 0x$1 0x$2; done
echo "opening /dev/nvidia2 (granted, no driver): $(cat /dev/nvidia2 2>&1 | sed 's/.*: //')"
mknod /tmp/nvidia5 c 195 5 && echo "opening 195:5 (not granted): $(cat /tmp/nvidia5 2>&1 | sed 's/.*: //')"
echo "env:"
env | grep -E '^(NVIDIA|CUDA|NCCL|UCX)' | sort | sed 's/^/  /'
echo "network interfaces:"
ip -o link show | sed 's/^/  /'
"#;

const VF_MAC: &str = "02:00:00:de:00:01";
const PEER: &str = "dgdemopeer";

/// The stand-in for the VF netdev; deleting the peer deletes the pair.
struct Veth;

impl Veth {
    fn new(name: &str) -> Veth {
        // A pair left by an interrupted run; absent is the normal case.
        let _ = Command::new("ip")
            .args(["link", "del", PEER])
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args([
                "link", "add", name, "address", VF_MAC, "type", "veth", "peer", "name", PEER,
            ])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip link add {name}");
        Veth
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", PEER]).status();
    }
}

fn host_link(name: &str) -> Option<String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show", name])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// What the demo shows, checked: a run that prints a wrong result fails.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn expect(&mut self, what: &str, ok: bool) {
        if !ok {
            self.0.push(what.to_string());
        }
    }
}

/// The line of the in-container listing for `path`, as `major:minor`.
fn listed(out: &str, path: &str) -> Option<String> {
    out.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some(path)).then(|| words.next().unwrap_or_default().to_string())
    })
}

fn main() {
    require_root();
    let failed = run();
    if !failed.0.is_empty() {
        for what in &failed.0 {
            eprintln!("demo check failed: {what}");
        }
        std::process::exit(1);
    }
    println!("\nevery check passed");
}

/// Runs the demo; the node and the veth pair are gone when it returns.
fn run() -> Checks {
    let mut checks = Checks::default();
    println!("starting containerd 1.7 with NRI and devgate on a simulated HGX node...");
    let node = Node::start_with(HostRootBuilder::hgx().vf_netdev_prefix("dgdemo"), &[]);
    let inv = node.fixture.expected();
    let cri = node.cri();
    let (g0, g1) = (node.gpu(2).clone(), node.gpu(3).clone());
    let (nic, vf) = (&inv.rdma[0], &inv.rdma[0].vfs[0]);
    let vf_netdev = vf.netdev.clone().expect("simulated vf netdev");
    let _veth = Veth::new(&vf_netdev);
    let alloc = allocation(
        &[gpu_entry(2, &g0.uuid), gpu_entry(3, &g1.uuid)],
        &[vf_entry(0, nic.bus_id, vf.bus_id)],
    );
    println!("\npod annotation {DEVICE_ALLOCATED}:\n  {alloc}");
    println!(
        "\nVF {} on the host: {}",
        vf.bus_id,
        host_link(&vf_netdev).unwrap_or_default()
    );
    let pod = cri
        .run_pod(
            &PodSpec::new("train")
                .own_netns()
                .annotation(DEVICE_ALLOCATED, &alloc),
        )
        .expect("RunPodSandbox");
    let id = cri
        .create_container(&pod, &ContainerSpec::shell("main", "sleep 600"))
        .expect("CreateContainer");
    cri.start_container(&id).expect("StartContainer");
    let (_, out, err) = cri.exec(&id, &["sh", "-c", SHOW]).expect("exec");
    println!(
        "\ninside the container:\n{}{}",
        out.trim_end(),
        err.trim_end()
    );
    for (minor, granted) in (0..8).map(|m| (m, m == 2 || m == 3)) {
        let node = listed(&out, &format!("/dev/nvidia{minor}"));
        let want = granted.then(|| format!("195:{minor}"));
        checks.expect(
            &format!("/dev/nvidia{minor} is {want:?}, got {node:?}"),
            node == want,
        );
    }
    checks.expect(
        "the granted GPU node opens with ENXIO",
        out.contains("(granted, no driver): No such device or address"),
    );
    checks.expect(
        "an ungranted GPU node is refused by the cgroup (EPERM)",
        out.contains("(not granted): Operation not permitted"),
    );
    checks.expect(
        "an RDMA verbs node of the VF",
        out.contains("/dev/infiniband/uverbs"),
    );
    let visible = format!("NVIDIA_VISIBLE_DEVICES={},{}", g0.uuid, g1.uuid);
    checks.expect(&format!("env has {visible}"), out.contains(&visible));
    checks.expect(
        &format!("net1 with the VF's MAC {VF_MAC} in the pod"),
        out.lines()
            .any(|l| l.contains(" net1") && l.contains(VF_MAC)),
    );
    let on_host = host_link(&vf_netdev);
    checks.expect("the VF netdev leaves the host", on_host.is_none());
    println!(
        "\nVF netdev {vf_netdev} on the host while the pod runs: {}",
        on_host.unwrap_or_else(|| "absent (moved into the pod)".into())
    );
    println!("\ndevgate status while the pod runs:");
    print!("{}", devgate::cli::status::table(&node.ledger()));
    cri.stop_container(&id, 5).expect("StopContainer");
    cri.remove_container(&id).expect("RemoveContainer");
    cri.stop_pod(&pod).expect("StopPodSandbox");
    cri.remove_pod(&pod).expect("RemovePodSandbox");
    wait_for("claims released", SLOW, || {
        node.ledger().pods.is_empty().then_some(())
    });
    println!("\nafter removal:");
    let back = host_link(&vf_netdev);
    checks.expect(
        &format!("the VF is back on the host as {vf_netdev} with its MAC"),
        back.as_deref().is_some_and(|l| l.contains(VF_MAC)),
    );
    println!("  VF back on the host: {}", back.unwrap_or_default());
    print!("{}", devgate::cli::status::table(&node.ledger()));
    checks
}
