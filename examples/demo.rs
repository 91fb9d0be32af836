//! The README's main job: a private containerd 1.7 with NRI, devgate on a
//! simulated 8-GPU, 8-NIC HGX host root, and a GPU + RDMA pod created through
//! CRI as kubelet does. Prints what the container got and what was released
//! after removal. Run as root: `sudo ./install/demo.sh`.
#[path = "../tests/support/mod.rs"]
mod support;

use support::node::{gpu_entry, Node, DEVICE_ALLOCATED};
use support::{require_root, wait_for, ContainerSpec, PodSpec, SLOW};

const SHOW: &str = r#"
echo "device nodes:"
for d in /dev/nvidia* /dev/infiniband/*; do set -- $(stat -c '%t %T' $d); printf '  %-28s %d:%d\n' $d 0x$1 0x$2; done
echo "opening /dev/nvidia2 (granted, no driver): $(cat /dev/nvidia2 2>&1 | sed 's/.*: //')"
mknod /tmp/nvidia5 c 195 5 && echo "opening 195:5 (not granted): $(cat /tmp/nvidia5 2>&1 | sed 's/.*: //')"
echo "env:"
env | grep -E '^(NVIDIA|CUDA|NCCL|UCX)' | sort | sed 's/^/  /'
"#;

fn main() {
    require_root();
    println!("starting containerd 1.7 with NRI and devgate on a simulated HGX node...");
    let node = Node::start(&[]);
    let inv = node.fixture.expected();
    let cri = node.cri();
    let (g0, g1) = (node.gpu(2).clone(), node.gpu(3).clone());
    let nic = &inv.rdma[0];
    let alloc = format!(
        r#"{{"gpu":[{},{}],"rdma":[{{"minor":0,"id":"{}","resources":{{"koordinator.sh/rdma":"100"}}}}]}}"#,
        gpu_entry(2, &g0.uuid),
        gpu_entry(3, &g1.uuid),
        nic.bus_id
    );
    println!("\npod annotation {DEVICE_ALLOCATED}:\n  {alloc}");
    let pod = cri
        .run_pod(&PodSpec::new("train").annotation(DEVICE_ALLOCATED, &alloc))
        .expect("RunPodSandbox");
    let run = cri
        .run_container(&pod, &ContainerSpec::shell("main", SHOW))
        .expect("container");
    println!("\ninside the container:\n{}", run.log.trim_end());
    println!("\ndevgate status while the pod runs:");
    print!("{}", devgate::cli::status::table(&node.ledger()));
    cri.stop_pod(&pod).expect("StopPodSandbox");
    cri.remove_pod(&pod).expect("RemovePodSandbox");
    wait_for("claims released", SLOW, || {
        node.ledger().pods.is_empty().then_some(())
    });
    println!("\nafter removal: every claim released");
    print!("{}", devgate::cli::status::table(&node.ledger()));
}
