//! A container refused after its sandbox's start claimed, with no container
//! of the pod ever recorded, leaves no claim.
use super::*;
use crate::gpu::health::Fault;
use nri::stub::Plugin as _;

/// Pod `id` with GPU `n` of the fixture, its sandbox started (claimed).
fn started(
    plugin: &DevgatePlugin,
    fixture: &crate::fixture::Fixture,
    id: &str,
    n: usize,
) -> PodSandbox {
    started_with(plugin, fixture, id, n, &[])
}

/// [`started`], the pod also annotated with `annotations`.
fn started_with(
    plugin: &DevgatePlugin,
    fixture: &crate::fixture::Fixture,
    id: &str,
    n: usize,
    annotations: &[(&str, &str)],
) -> PodSandbox {
    let gpu = &fixture.expected().gpus[n];
    let mut pod = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    (pod.id, pod.uid) = (id.to_string(), format!("uid-{id}"));
    for (key, value) in annotations {
        pod.annotations.insert(key.to_string(), value.to_string());
    }
    plugin.run_pod_sandbox(&pod).unwrap();
    assert!(
        plugin.devices().ledger().holds(id).unwrap(),
        "claimed at the start"
    );
    pod
}

fn named(id: &str) -> Container {
    Container {
        id: id.into(),
        ..ctr()
    }
}

/// A container refused for what only it shows (its GPU turned unhealthy
/// after the sandbox's start claimed) leaves no claim: the claim made ahead
/// goes, and the retry once the GPU is healthy claims again. A pod that has
/// an admitted container keeps its claim when a later one is refused.
#[test]
fn a_refused_first_container_leaves_no_claim_made_ahead() {
    let (plugin, fixture, state) = hgx_plugin("");
    let ledger = plugin.devices().ledger().clone();
    let health = crate::gpu::HealthStore::new(&state.path().join("health"));
    let gpus = &fixture.expected().gpus;

    let first = started(&plugin, &fixture, "first", 0);
    health
        .mark(&gpus[0].uuid, &[Fault::DoubleBitEcc], 1)
        .unwrap();
    let e = nri::ErrorChain(&plugin.adjustment(&first, &named("c1")).unwrap_err()).to_string();
    assert!(e.contains(crate::allocation::DEVICE_ALLOCATED), "{e}");
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(!ledger.holds("first").unwrap(), "nothing claimed");
    assert!(health.clear(&gpus[0].uuid).unwrap());
    plugin.adjustment(&first, &named("c1")).unwrap();
    assert!(ledger.holds("first").unwrap(), "the retry claims");

    let ran = started(&plugin, &fixture, "ran", 1);
    plugin.adjustment(&ran, &named("c2")).unwrap();
    health
        .mark(&gpus[1].uuid, &[Fault::DoubleBitEcc], 1)
        .unwrap();
    plugin.adjustment(&ran, &named("c3")).unwrap_err();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(ledger.holds("ran").unwrap(), "c2 runs on its devices");
}

/// A live pod whose containers were all removed (kubelet removes a dead
/// container before it starts the next) keeps its devices when its next
/// container is refused: they were used, and stay its own until its sandbox
/// stops, instead of going to another pod in between with no teardown.
#[test]
fn a_pod_whose_containers_came_and_went_keeps_its_claim_when_the_next_is_refused() {
    let (plugin, fixture, state) = hgx_plugin("");
    let ledger = plugin.devices().ledger().clone();
    let health = crate::gpu::HealthStore::new(&state.path().join("health"));
    let uuid = &fixture.expected().gpus[0].uuid;

    let pod = started(&plugin, &fixture, "restarts", 0);
    plugin.adjustment(&pod, &named("c1")).unwrap();
    plugin.remove_container(&pod, &named("c1")).unwrap();
    let record = ledger.snapshot().unwrap().pods["restarts"].clone();
    assert!(record.containers.is_empty(), "c1 removed");
    assert_eq!(record.admitted(), 1);

    health.mark(uuid, &[Fault::DoubleBitEcc], 1).unwrap();
    plugin.adjustment(&pod, &named("c2")).unwrap_err();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(ledger.holds("restarts").unwrap(), "c1 ran on its devices");
    // Its sandbox's stop releases it, as any pod's.
    plugin.stop_pod_sandbox(&pod).unwrap();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(!ledger.holds("restarts").unwrap());
}

/// A container refused before its allocation is looked at, for its pod's
/// probe value (over its bound), leaves no claim made ahead either; the
/// refusal names the probe's annotation.
#[test]
fn a_container_refused_for_its_pods_probe_leaves_no_claim_made_ahead() {
    let (plugin, fixture, _state) = hgx_plugin("");
    let long = "z".repeat(300);
    let probe = [(super::probe::PROBE_ANNOTATION, long.as_str())];
    let pod = started_with(&plugin, &fixture, "probed", 0, &probe);
    let e = nri::ErrorChain(&plugin.adjustment(&pod, &named("c1")).unwrap_err()).to_string();
    assert!(e.contains(super::probe::PROBE_ANNOTATION), "{e}");
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(
        !plugin.devices().ledger().holds("probed").unwrap(),
        "nothing claimed"
    );
}

/// The claim made ahead of a refused container goes back without a
/// teardown: no container of the pod was ever given the devices, and a
/// teardown (the pod's processes on a GPU ended, the GPU reset) would run
/// before the guard's look, under a next container admitted meanwhile. A
/// teardown that would fail changes nothing; kubelet's retry claims anew.
#[test]
fn a_refused_containers_claim_goes_back_without_a_teardown() {
    let (mut plugin, fixture, state) = hgx_plugin("");
    plugin.teardown = Arc::new(Flaky(false.into()));
    let ledger = plugin.devices().ledger().clone();
    let health = crate::gpu::HealthStore::new(&state.path().join("health"));
    let uuid = &fixture.expected().gpus[0].uuid;

    let pod = started(&plugin, &fixture, "sb", 0);
    assert!(
        ledger.holds("sb").unwrap(),
        "claimed at the sandbox's start"
    );
    health.mark(uuid, &[Fault::DoubleBitEcc], 1).unwrap();
    plugin.adjustment(&pod, &named("c1")).unwrap_err();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(!ledger.holds("sb").unwrap(), "given back, no teardown run");
    assert!(plugin.unreleased.pending().is_empty());

    assert!(health.clear(uuid).unwrap());
    plugin.adjustment(&pod, &named("c1")).unwrap();
    assert!(ledger.snapshot().unwrap().pods["sb"]
        .containers
        .contains_key("c1"));
}

/// Under `failure_policy = "ignore"` a container whose allocation cannot be
/// applied starts without it: the claim its sandbox's start made goes back
/// as a refusal's does, rather than sit unused until the sandbox stops.
#[test]
fn an_ignored_failure_gives_back_the_claim_made_ahead() {
    let (plugin, fixture, state) = hgx_plugin("failure_policy = \"ignore\"\n");
    let ledger = plugin.devices().ledger().clone();
    let health = crate::gpu::HealthStore::new(&state.path().join("health"));
    let pod = started(&plugin, &fixture, "ig", 0);
    assert!(
        ledger.holds("ig").unwrap(),
        "claimed at the sandbox's start"
    );
    let uuid = &fixture.expected().gpus[0].uuid;
    health.mark(uuid, &[Fault::DoubleBitEcc], 1).unwrap();
    let adjust = plugin.adjustment(&pod, &named("c1")).unwrap();
    assert!(
        adjust.linux.as_ref().is_none_or(|l| l.devices.is_empty()),
        "started without its devices"
    );
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(!ledger.holds("ig").unwrap());
}
