//! Plan for an 8-GPU + 8-VF pod on the fixture's HGX-class inventory: the work the
//! NRI plugin does per CreateContainer (parse the annotation, resolve, build).
//! Target: p99 < 200 µs. Criterion reports the mean; the percentiles are printed
//! after it from 10,000 timed runs.
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use devgate::allocation::{parse_pod, DEVICE_ALLOCATED, GPU_ISOLATION_PROVIDER};
use devgate::config::Config;
use devgate::fixture::HostRootBuilder;
use devgate::inventory::Inventory;
use devgate::plan;

/// Eight GPUs at half share (HAMi-core) and one VF on each of the eight mlx5 PFs.
fn annotation(inv: &Inventory) -> String {
    let gpus: Vec<String> = inv
        .gpus
        .iter()
        .map(|g| {
            format!(
                r#"{{"minor":{},"id":"{}","resources":{{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"40Gi","koordinator.sh/gpu-memory-ratio":"50"}}}}"#,
                g.minor, g.uuid
            )
        })
        .collect();
    let minors = devgate::inventory::device_cr::rdma_minors(&inv.rdma);
    let rdma: Vec<String> = inv
        .rdma
        .iter()
        .zip(minors)
        .filter(|(nic, _)| !nic.vfs.is_empty())
        .take(8)
        .map(|(nic, minor)| {
            format!(
                r#"{{"minor":{minor},"id":"{}","resources":{{"koordinator.sh/rdma":"1"}},"extension":{{"vfs":[{{"minor":-1,"busID":"{}"}}]}}}}"#,
                nic.bus_id, nic.vfs[0].bus_id
            )
        })
        .collect();
    format!(
        r#"{{"gpu":[{}],"rdma":[{}]}}"#,
        gpus.join(","),
        rdma.join(",")
    )
}

struct Input {
    inventory: Inventory,
    annotations: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    config: Config,
}

fn input() -> Input {
    let inventory = HostRootBuilder::hgx()
        .expected()
        .expect("fixture inventory");
    let annotations = BTreeMap::from([(DEVICE_ALLOCATED.to_string(), annotation(&inventory))]);
    let labels = BTreeMap::from([(GPU_ISOLATION_PROVIDER.to_string(), "HAMi-core".to_string())]);
    Input {
        inventory,
        annotations,
        labels,
        config: Config::default(),
    }
}

fn run(i: &Input) -> plan::Plan {
    let pod = parse_pod(&i.annotations, &i.labels).expect("annotation parses");
    plan::build(&i.inventory, &pod, "main", &i.config).expect("plan builds")
}

fn bench(c: &mut Criterion) {
    let i = input();
    let p = run(&i);
    assert_eq!((p.claims.len(), p.network.len()), (16, 8), "8 GPUs + 8 VFs");
    c.bench_function("plan 8 gpu + 8 vf (parse + build)", |b| {
        b.iter(|| run(black_box(&i)))
    });
    let pod = parse_pod(&i.annotations, &i.labels).unwrap();
    c.bench_function("plan 8 gpu + 8 vf (build only)", |b| {
        b.iter(|| plan::build(black_box(&i.inventory), black_box(&pod), "main", &i.config).unwrap())
    });
}

/// p50/p99/max of single runs; criterion does not report tails.
fn percentiles() {
    let i = input();
    let mut samples: Vec<Duration> = (0..10_000)
        .map(|_| {
            let t = Instant::now();
            black_box(run(black_box(&i)));
            t.elapsed()
        })
        .collect();
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!(
        "plan 8 gpu + 8 vf, 10000 runs: p50 {:?}  p99 {:?}  max {:?}",
        at(0.50),
        at(0.99),
        samples[samples.len() - 1]
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    percentiles();
    Criterion::default().configure_from_args().final_summary();
}
