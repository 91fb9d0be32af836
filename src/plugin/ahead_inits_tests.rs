//! A sandbox whose start claimed and which then ended with no container (its
//! start refused by an NRI plugin called after devgate, its pod deleted) is
//! released by the retry round, as soon as its init has exited.
use super::*;

/// A process standing in for the sandbox's init; killed and reaped on drop.
struct Init(std::process::Child);

impl Init {
    /// A `sleep` that outlives the test unless dropped.
    fn start() -> Init {
        Init(
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Through the runtime's socket, as containerd sends them: the init's pid
/// comes with RunPodSandbox's pod.
#[tokio::test]
async fn a_sandbox_that_ended_without_a_container_is_released() {
    let (plugin, fixture, _state) = hgx_plugin("");
    let (plugin, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let conn = conn.unwrap();
    let ledger = plugin.devices().ledger().clone();
    let gpus = &fixture.expected().gpus;

    // Two sandboxes start and claim; a container joins the second.
    let (ended, joined) = (Init::start(), Init::start());
    let mut pods = Vec::new();
    for (i, init) in [&ended, &joined].into_iter().enumerate() {
        let mut pod = allocated_pod(&gpu_allocation(gpus[i].minor, &gpus[i].uuid, 100));
        pod.id = format!("sandbox-{i}");
        pod.uid = format!("uid-{i}");
        pod.pid = init.0.id();
        conn.event(nri::api::Event::RUN_POD_SANDBOX, &pod, None)
            .await
            .unwrap();
        assert!(ledger.holds(&pod.id).unwrap(), "claimed at its start");
        pods.push(pod);
    }
    conn.create_container(&pods[1], &ctr()).await.unwrap();

    // While their inits run, nothing is released.
    plugin.retry_round();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(ledger.holds("sandbox-0").unwrap() && ledger.holds("sandbox-1").unwrap());

    // Both inits exit; the runtime reports nothing.
    drop((ended, joined));
    plugin.retry_round();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(
        !ledger.holds("sandbox-0").unwrap(),
        "ended with no container: released"
    );
    assert!(
        ledger.holds("sandbox-1").unwrap(),
        "a container joined: left to its stop and removal"
    );
    let free = ledger.snapshot().unwrap();
    assert!(
        !free
            .devices
            .keys()
            .any(|d| d.to_string().contains(&gpus[0].uuid)),
        "{free:?}"
    );
}

/// An ended sandbox whose teardown fails keeps its claims and is retried by
/// the next round, which releases it once the teardown succeeds.
#[test]
fn an_ended_sandbox_whose_teardown_fails_is_retried() {
    use nri::stub::Plugin as _;
    let (mut plugin, fixture, _state) = hgx_plugin("");
    let flaky = Arc::new(Flaky(false.into()));
    plugin.teardown = flaky.clone();
    let ledger = plugin.devices().ledger().clone();
    let gpu = &fixture.expected().gpus[0];
    let init = Init::start();
    let mut pod = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    pod.pid = init.0.id();
    plugin.run_pod_sandbox(&pod).unwrap();
    drop(init);

    plugin.retry_round();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(ledger.holds(&pod.id).unwrap(), "teardown failed: kept");
    assert!(plugin.unreleased.pending().contains(&pod.id));
    flaky.0.store(true, std::sync::atomic::Ordering::SeqCst);
    plugin.retry_round();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(!ledger.holds(&pod.id).unwrap(), "released by the retry");
    assert!(plugin.unreleased.pending().is_empty());
}
