//! CreateContainer round trip as the runtime sees it: request out, empty
//! adjustment back, over a real unix socket through the mux and ttrpc on
//! the fake runtime's side, the stub's blocking transport on the plugin's.
//! The plugin runs on its own thread, as `devgate nri` does. Target: p99 <
//! 100 µs.
//!
//! Besides criterion's estimate, prints latency percentiles from a separate
//! run of `NRI_BENCH_SAMPLES` round trips (default 20000).
//!
//! `cargo bench -p nri --bench create_rtt -- --quick` for a short run.

use std::{
    sync::mpsc as std_mpsc,
    thread,
    time::{Duration, Instant},
};

use criterion::{criterion_group, criterion_main, Criterion};
use nri::{
    api::{Container, CreateContainerResponse, Event, PodSandbox},
    testing::{FakeConfig, FakeRuntime, PluginConn},
    EventMask, Plugin, Stub,
};
use tokio::runtime::Runtime;

const DEFAULT_SAMPLES: usize = 20_000;

/// Answers every CreateContainer with an empty adjustment.
struct Empty;

impl Plugin for Empty {
    type Error = std::convert::Infallible;

    fn events(&self) -> EventMask {
        EventMask::of(Event::CREATE_CONTAINER)
    }

    fn create_container(
        &self,
        _pod: &PodSandbox,
        _ctr: &Container,
    ) -> Result<CreateContainerResponse, Self::Error> {
        Ok(CreateContainerResponse::default())
    }
}

struct Rig {
    rt: Runtime,
    conn: PluginConn,
    pod: PodSandbox,
    ctr: Container,
    _dir: tempfile::TempDir,
}

fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

impl Rig {
    fn start() -> Rig {
        let dir = tempfile::Builder::new()
            .prefix("nrib")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let path = dir.path().join("s");
        let rt = current_thread();
        let runtime = rt
            .block_on(async { FakeRuntime::bind(&path, FakeConfig::containerd_1_7()) })
            .expect("bind");
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let plugin_path = path.clone();
        thread::spawn(move || {
            let stub = Stub::new(Empty)
                .with_name("bench")
                .with_idx("50")
                .with_socket_path(plugin_path);
            let _ = ready_tx.send(());
            let _ = stub.run();
        });
        let _ = ready_rx.recv();
        let conn = rt.block_on(runtime.accept()).expect("plugin registers");
        let pod = PodSandbox {
            id: "0123456789abcdef".repeat(4),
            name: "bench-pod".to_string(),
            namespace: "default".to_string(),
            ..Default::default()
        };
        let ctr = Container {
            id: "fedcba9876543210".repeat(4),
            name: "app".to_string(),
            pod_sandbox_id: pod.id.clone(),
            ..Default::default()
        };
        Rig {
            rt,
            conn,
            pod,
            ctr,
            _dir: dir,
        }
    }

    /// Runs `n` round trips; returns each one's latency.
    fn round_trips(&self, n: usize) -> Vec<Duration> {
        self.rt.block_on(async {
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let t = Instant::now();
                let reply = self.conn.create_container(&self.pod, &self.ctr).await;
                lat.push(t.elapsed());
                assert!(reply.is_ok(), "{reply:?}");
            }
            lat
        })
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let last = sorted.len().saturating_sub(1);
    let i = ((last as f64) * p).round() as usize;
    sorted.get(i.min(last)).copied().unwrap_or_default()
}

fn report_percentiles(rig: &Rig) {
    let samples = std::env::var("NRI_BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SAMPLES);
    rig.round_trips(samples.min(1000)); // warm-up
    let mut lat = rig.round_trips(samples);
    lat.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "create_container_rtt percentiles over {samples} round trips: \
         p50 {:.1} µs, p90 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs",
        us(percentile(&lat, 0.50)),
        us(percentile(&lat, 0.90)),
        us(percentile(&lat, 0.99)),
        us(percentile(&lat, 0.999)),
        us(percentile(&lat, 1.0)),
    );
}

fn create_rtt(c: &mut Criterion) {
    let rig = Rig::start();
    report_percentiles(&rig);
    c.bench_function("create_container_rtt", |b| {
        b.iter_custom(|iters| {
            let n = usize::try_from(iters).unwrap_or(usize::MAX);
            rig.round_trips(n).into_iter().sum()
        })
    });
}

criterion_group!(benches, create_rtt);
criterion_main!(benches);
