//! The plugin's own work per container, in process: `Devices::apply` for a pod with
//! 4 GPUs + 4 VFs on the HGX fixture (parse, plan, health check, one ledger
//! transaction, the adjustment), then the RemoveContainer ledger update. The
//! ledger sits on tmpfs (/dev/shm), as /run/devgate does on a node. This is the
//! CPU the end-to-end `create_container` bench attributes to devgate, minus NRI.
//! With a pod of its own per container: the claim made by the container, and
//! made at the sandbox's start (`Devices::claim_ahead`) before it.
use std::hint::black_box;

use criterion::{criterion_group, Criterion};
use devgate::config::Config;
use devgate::fixture::HostRootBuilder;
use devgate::plugin::devices::{Devices, RuntimeFeatures};
use nri::api::{Container, PodSandbox};

fn pod(inv: &devgate::inventory::Inventory) -> PodSandbox {
    let gpus: Vec<String> = inv.gpus[..4]
        .iter()
        .map(|g| format!(r#"{{"minor":{},"id":"{}","resources":{{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}}}"#, g.minor, g.uuid))
        .collect();
    let rdma: Vec<String> = inv.rdma[..4]
        .iter()
        .enumerate()
        .map(|(i, nic)| format!(r#"{{"minor":{i},"id":"{}","resources":{{"koordinator.sh/rdma":"1"}},"extension":{{"vfs":[{{"minor":-1,"busID":"{}"}}]}}}}"#, nic.bus_id, nic.vfs[0].bus_id))
        .collect();
    let mut pod = PodSandbox {
        id: "sandbox".into(),
        name: "bench".into(),
        namespace: "default".into(),
        uid: "uid".into(),
        ..Default::default()
    };
    pod.annotations.insert(
        devgate::allocation::DEVICE_ALLOCATED.into(),
        format!(
            r#"{{"gpu":[{}],"rdma":[{}]}}"#,
            gpus.join(","),
            rdma.join(",")
        ),
    );
    pod
}

/// The HGX fixture, the plugin's devices on it with their ledger on tmpfs, and
/// the pod every measurement starts from.
struct Node {
    _host: tempfile::TempDir,
    _state: tempfile::TempDir,
    devices: Devices,
    pod: PodSandbox,
    config: std::sync::Arc<Config>,
    health: devgate::gpu::HealthStore,
}

impl Node {
    fn new() -> Node {
        let host = tempfile::tempdir().expect("host dir");
        let fixture = HostRootBuilder::hgx().build(host.path()).expect("fixture");
        let state = tempfile::tempdir_in("/dev/shm").expect("tmpfs state dir");
        let devices = Devices::open(
            fixture.root(),
            &state.path().join("run"),
            "/usr/local/bin/devgate-hook".into(),
            None,
        )
        .expect("devices");
        Node {
            pod: pod(fixture.expected()),
            config: std::sync::Arc::new(Config::default()),
            health: devgate::gpu::HealthStore::new(&state.path().join("health")),
            devices,
            _host: host,
            _state: state,
        }
    }

    /// Container number `n` of `pod`, applied: its id.
    fn apply(&self, pod: &PodSandbox, n: u64) -> String {
        let ctr = Container {
            id: format!("c{n}"),
            name: "main".into(),
            ..Default::default()
        };
        let adjust = self.devices.apply(
            pod,
            &ctr,
            &self.config,
            RuntimeFeatures::default(),
            &self.health,
        );
        black_box(adjust.expect("apply"));
        ctr.id
    }

    /// Pod number `n`: the node's pod, as a pod of its own.
    fn pod_of_its_own(&self, n: u64) -> PodSandbox {
        let mut pod = self.pod.clone();
        pod.id = format!("sandbox{n}");
        pod.uid = format!("uid{n}");
        pod
    }

    /// The pod's claim at its sandbox's start, as the plugin makes it at RunPodSandbox.
    fn claim_ahead(&self, pod: &PodSandbox) {
        let done =
            self.devices
                .claim_ahead(pod, &self.config, RuntimeFeatures::default(), &self.health);
        black_box(done.expect("claim ahead"));
    }

    /// The pod's devices given back, as its removal does.
    fn release(&self, pod: &PodSandbox) {
        self.devices
            .ledger()
            .release_pod(&pod.id, &devgate::ledger::NoTeardown)
            .expect("release");
        self.devices.pod_removed(&pod.id);
    }
}

fn bench(c: &mut Criterion) {
    let node = Node::new();
    let pod = &node.pod;
    let mut n = 0u64;
    c.bench_function("apply/create_and_remove_4gpu_4vf", |b| {
        b.iter(|| {
            n += 1;
            let id = node.apply(pod, n);
            node.devices
                .ledger()
                .remove_container(&pod.id, &id, &|p| node.devices.vfs_away(p))
                .expect("remove");
        })
    });
    // The pod above gives its devices back for the pods below.
    node.release(pod);
    // Every container the first of a pod of its own: it parses the pod's
    // allocation, builds the plan and makes the pod's claim; the release after
    // it is part of the loop.
    c.bench_function("apply/new_pod_claim_and_release_4gpu_4vf", |b| {
        b.iter(|| {
            n += 1;
            let pod = node.pod_of_its_own(n);
            node.apply(&pod, n);
            node.release(&pod);
        })
    });
}

/// A pod's claim made at its sandbox's start (`Devices::claim_ahead`): the
/// sandbox's work and its first container's together, then the first
/// container's alone.
fn bench_ahead(c: &mut Criterion) {
    let node = Node::new();
    let mut n = 0u64;
    c.bench_function(
        "apply/sandbox_claim_first_container_and_release_4gpu_4vf",
        |b| {
            b.iter(|| {
                n += 1;
                let pod = node.pod_of_its_own(n);
                node.claim_ahead(&pod);
                node.apply(&pod, n);
                node.release(&pod);
            })
        },
    );
    c.bench_function("apply/first_container_after_sandbox_claim_4gpu_4vf", |b| {
        b.iter_custom(|iters| {
            let mut timed = std::time::Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let pod = node.pod_of_its_own(n);
                node.claim_ahead(&pod);
                let start = std::time::Instant::now();
                node.apply(&pod, n);
                timed += start.elapsed();
                node.release(&pod);
            }
            timed
        })
    });
}

criterion_group!(benches, bench, bench_ahead);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
