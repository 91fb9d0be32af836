//! The plugin's own work per container, in process: `Devices::apply` for a pod with
//! 4 GPUs + 4 VFs on the HGX fixture (parse, plan, health check, one ledger
//! transaction, the adjustment), then the RemoveContainer ledger update. The
//! ledger sits on tmpfs (/dev/shm), as /run/devgate does on a node. This is the
//! CPU the end-to-end `create_container` bench attributes to devgate, minus NRI.
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

fn bench(c: &mut Criterion) {
    let host = tempfile::tempdir().expect("host dir");
    let fixture = HostRootBuilder::hgx().build(host.path()).expect("fixture");
    let state = tempfile::tempdir_in("/dev/shm").expect("tmpfs state dir");
    let devices = Devices::open(
        fixture.root(),
        &state.path().join("run"),
        "/usr/local/bin/devgate-hook".into(),
    )
    .expect("devices");
    let pod = pod(fixture.expected());
    let config = std::sync::Arc::new(Config::default());
    let health = devgate::gpu::HealthStore::new(&state.path().join("health"));
    let mut n = 0u64;
    // Container number `n` of `pod`, applied: its id.
    let apply = |pod: &PodSandbox, n: u64| {
        let ctr = Container {
            id: format!("c{n}"),
            name: "main".into(),
            ..Default::default()
        };
        let adjust = devices.apply(pod, &ctr, &config, RuntimeFeatures::default(), &health);
        black_box(adjust.expect("apply"));
        ctr.id
    };
    c.bench_function("apply/create_and_remove_4gpu_4vf", |b| {
        b.iter(|| {
            n += 1;
            let id = apply(&pod, n);
            devices
                .ledger()
                .remove_container(&pod.id, &id)
                .expect("remove");
        })
    });
    // The pod above gives its devices back for the pods below.
    devices
        .ledger()
        .release_pod(&pod.id, &devgate::ledger::NoTeardown)
        .expect("release");
    // Every container the first of a pod of its own: it parses the pod's
    // allocation, builds the plan and makes the pod's claim; the release after
    // it is part of the loop.
    c.bench_function("apply/new_pod_claim_and_release_4gpu_4vf", |b| {
        b.iter(|| {
            n += 1;
            let mut pod = pod.clone();
            pod.id = format!("sandbox{n}");
            pod.uid = format!("uid{n}");
            apply(&pod, n);
            devices
                .ledger()
                .release_pod(&pod.id, &devgate::ledger::NoTeardown)
                .expect("release");
            devices.pod_removed(&pod.id);
        })
    });
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
