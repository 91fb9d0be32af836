//! A container refused for a device another pod holds, while that pod's
//! release runs, waits for the release and is admitted when it ends.
use super::*;
use std::sync::{Condvar, Mutex};

/// A teardown that ends only once opened.
#[derive(Default)]
pub(super) struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    entered: bool,
    open: bool,
}

impl Gate {
    pub(super) fn open(&self) {
        self.state.lock().unwrap().open = true;
        self.changed.notify_all();
    }

    /// Opens the gate 100 ms from now, on a thread of its own.
    fn open_later(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let gate = Arc::clone(self);
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            gate.open();
        })
    }

    /// Opens the gate once `log` says a creation waits for the release, on a
    /// thread of its own: a creation slower to come than a fixed delay would
    /// otherwise find the release over, and not wait.
    fn open_once_waited(
        self: &Arc<Self>,
        log: &crate::logging::capture::Captured,
    ) -> std::thread::JoinHandle<()> {
        let (gate, log) = (Arc::clone(self), log.clone());
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + LIMIT;
            while log.lines("waiting for").is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            gate.open();
        })
    }

    /// Returns once a teardown waits at the gate; fails after [`LIMIT`].
    pub(super) fn wait_entered(&self) {
        let state = self.state.lock().unwrap();
        let (state, waited) = self
            .changed
            .wait_timeout_while(state, LIMIT, |s| !s.entered)
            .unwrap();
        drop(state);
        assert!(!waited.timed_out(), "no teardown reached the gate");
    }
}

impl Teardown for Gate {
    fn teardown(&self, _pod: &crate::ledger::PodRecord) -> Result<(), crate::ledger::Unclean> {
        let mut state = self.state.lock().unwrap();
        state.entered = true;
        self.changed.notify_all();
        drop(self.changed.wait_while(state, |s| !s.open).unwrap());
        Ok(())
    }
}

/// A plugin on the HGX fixture whose teardown is `gate`, and two pods
/// allocated the same whole GPU: the first one created, holding it.
pub(super) fn two_pods_one_gpu(
    state: &std::path::Path,
    gate: &Arc<Gate>,
) -> (DevgatePlugin, PodSandbox, PodSandbox) {
    let host = state.join("host");
    let fixture = crate::fixture::HostRootBuilder::hgx().build(&host).unwrap();
    let gpu = &fixture.expected().gpus[1];
    let mut plugin = plugin_on(&host, state, "");
    plugin.teardown = gate.clone();
    let first = allocated_pod(&gpu_allocation(gpu.minor, &gpu.uuid, 100));
    let second = PodSandbox {
        id: "sandbox-2".into(),
        uid: "u-2".into(),
        name: "web-2".into(),
        ..first.clone()
    };
    plugin.adjustment(&first, &ctr()).expect("first holder");
    (plugin, first, second)
}

/// The release ends while the creation waits: the container is admitted.
#[test]
fn a_creation_waits_for_the_release_of_the_holder() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, second) = two_pods_one_gpu(state.path(), &gate);
    plugin.stop_pod_sandbox(&first).unwrap();
    let opener = gate.open_later();
    let adjust = plugin
        .adjustment(&second, &ctr())
        .expect("admitted once the release ended");
    assert!(!adjust.linux.is_none(), "{adjust:?}");
    opener.join().unwrap();
    let snap = plugin.devices().ledger().snapshot().unwrap();
    assert_eq!(
        snap.pods.keys().collect::<Vec<_>>(),
        ["sandbox-2"],
        "{snap:?}"
    );
}

/// A GPU marked unhealthy while the creation waits for the holder's release
/// (pages the holder left pending retirement, which its teardown marks) is
/// refused once the wait ends, and nothing is claimed for the pod. The wait
/// is a retry that marks the GPU and reports the release done, so that the
/// mark falls after the first health check whatever the machine's speed.
#[test]
fn a_gpu_marked_unhealthy_during_the_wait_is_refused() {
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, second) = two_pods_one_gpu(state.path(), &gate);
    let snap = plugin.devices().ledger().snapshot().unwrap();
    let Some(crate::ledger::DeviceId::Gpu(uuid)) = snap.pods[&first.id]
        .claims
        .first()
        .map(|c| c.device.clone())
    else {
        panic!("the first pod holds no gpu: {snap:?}");
    };
    let health = plugin.gpu().health().clone();
    let waited = std::sync::atomic::AtomicBool::new(false);
    let retry = |_: crate::ledger::LedgerError, _: &[crate::ledger::Claim]| {
        waited.store(true, std::sync::atomic::Ordering::SeqCst);
        health
            .mark(&uuid, &[crate::gpu::health::Fault::RetiredPagesPending], 1)
            .unwrap();
        Ok(())
    };
    let config = plugin.config().unwrap();
    let err = plugin
        .devices()
        .admit(
            &second,
            &ctr(),
            &config,
            Default::default(),
            &health,
            &retry,
        )
        .expect_err("refused");
    assert!(waited.load(std::sync::atomic::Ordering::SeqCst));
    let text = nri::ErrorChain(&err).to_string();
    assert!(text.contains("is unhealthy"), "{text}");
    assert!(!plugin.devices().ledger().holds("sandbox-2").unwrap());
}

/// A release that outlasts the wait leaves the refusal as it was, naming
/// the holder, and nothing claimed for the refused pod.
#[test]
fn a_release_that_outlasts_the_wait_leaves_the_refusal() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, second) = two_pods_one_gpu(state.path(), &gate);
    plugin.stop_pod_sandbox(&first).unwrap();
    let err = plugin.adjustment(&second, &ctr()).unwrap_err();
    let text = nri::ErrorChain(&err).to_string();
    assert!(text.contains("is held by pod team/web"), "{text}");
    assert!(!plugin.devices().ledger().holds("sandbox-2").unwrap());
    gate.open();
    assert!(plugin.wait_for_releases(LIMIT));
    plugin
        .adjustment(&second, &ctr())
        .expect("admitted after the release");
}

/// A device a live pod holds is refused at once, even while another pod's
/// release runs: only the holder's own release is waited for.
#[test]
fn a_live_holder_is_not_waited_for() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, second) = two_pods_one_gpu(state.path(), &gate);
    // Another pod, holding another GPU, is being released.
    let gpu = &crate::fixture::HostRootBuilder::hgx()
        .expected()
        .unwrap()
        .gpus[2];
    let other = pod_named(
        &first,
        "sandbox-3",
        gpu_allocation(gpu.minor, &gpu.uuid, 100),
    );
    plugin.adjustment(&other, &ctr()).expect("other holder");
    plugin.stop_pod_sandbox(&other).unwrap();
    // Held by the first pod, which runs.
    refused_at_once(&plugin, &second, "is held by pod team/web");
    assert!(
        plugin.releases.releasing("sandbox-3"),
        "still being released"
    );
    gate.open();
    assert!(plugin.wait_for_releases(LIMIT));
}

/// A share of a GPU over 100 % with a holder being released waits for that
/// release, and the grant is decided and counted once.
#[test]
fn a_share_over_100_percent_waits_for_its_holders_release() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let host = state.path().join("host");
    let fixture = crate::fixture::HostRootBuilder::hgx().build(&host).unwrap();
    let gpu = &fixture.expected().gpus[3];
    let gate = Arc::new(Gate::default());
    let mut plugin = plugin_on(&host, state.path(), "");
    plugin.teardown = gate.clone();
    let share = |id: &str, percent: u32| {
        pod_named(
            &allocated_pod(""),
            id,
            gpu_allocation(gpu.minor, &gpu.uuid, percent),
        )
    };
    plugin.enable_grant_check(&plugin.config().unwrap());
    let (first, second) = (share("first", 60), share("second", 60));
    plugin.adjustment(&first, &ctr()).expect("first share");
    plugin.stop_pod_sandbox(&first).unwrap();
    let opener = gate.open_later();
    plugin
        .adjustment(&second, &ctr())
        .expect("admitted once the first share was released");
    opener.join().unwrap();
    let counted = plugin.devices().grant_checker().unwrap().counters();
    assert_eq!(
        counted.unchecked, 2,
        "one decision per container: {counted:?}"
    );
}

/// A pod named `id` allocated `allocation`, otherwise as `like`.
fn pod_named(like: &PodSandbox, id: &str, allocation: String) -> PodSandbox {
    PodSandbox {
        id: id.into(),
        uid: format!("u-{id}"),
        name: id.into(),
        annotations: [(crate::allocation::DEVICE_ALLOCATED.to_string(), allocation)].into(),
        ..like.clone()
    }
}

/// Asserts that creating `pod`'s container is refused with `refusal` and
/// nothing waited for it.
fn refused_at_once(plugin: &DevgatePlugin, pod: &PodSandbox, refusal: &str) {
    let log = crate::logging::capture::Captured::default();
    let err = log
        .run(|| plugin.adjustment(pod, &ctr()))
        .expect_err("refused");
    let text = nri::ErrorChain(&err).to_string();
    assert!(text.contains(refusal), "{text}");
    assert!(log.lines("waiting for").is_empty(), "{:?}", log.lines(""));
    assert!(!plugin.devices().ledger().holds(&pod.id).unwrap());
}

/// A pod asking for a GPU whose holder is being released and for another a
/// live pod holds is refused at once: the release would not make it fit.
#[test]
fn a_release_beside_a_live_holder_is_not_waited_for() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, _second) = two_pods_one_gpu(state.path(), &gate);
    let gpus = crate::fixture::HostRootBuilder::hgx()
        .expected()
        .unwrap()
        .gpus;
    let live = pod_named(
        &first,
        "live",
        gpu_allocation(gpus[2].minor, &gpus[2].uuid, 100),
    );
    plugin.adjustment(&live, &ctr()).expect("live holder");
    plugin.stop_pod_sandbox(&first).unwrap();
    let both = format!(
        r#"{{"gpu":[{{"minor":{},"id":"{}"}},{{"minor":{},"id":"{}"}}]}}"#,
        gpus[1].minor, gpus[1].uuid, gpus[2].minor, gpus[2].uuid
    );
    let both = pod_named(&first, "both", both);
    // The lasting reason, not the holder being released.
    refused_at_once(&plugin, &both, "is held by pod team/live");
    assert!(
        plugin.releases.releasing("sandbox-1"),
        "still being released"
    );
    gate.open();
    assert!(plugin.wait_for_releases(LIMIT));
}

/// A share that would be over 100 % of a GPU even once a holder being
/// released is gone (a live holder's 60 % and its own 50 %) is refused at
/// once.
#[test]
fn a_share_over_100_percent_with_live_holders_is_not_waited_for() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, _second) = two_pods_one_gpu(state.path(), &gate);
    let gpu = &crate::fixture::HostRootBuilder::hgx()
        .expected()
        .unwrap()
        .gpus[3];
    let share = |id: &str, percent: u32| {
        pod_named(&first, id, gpu_allocation(gpu.minor, &gpu.uuid, percent))
    };
    plugin.adjustment(&share("live", 60), &ctr()).expect("60 %");
    let leaving = share("leaving", 30);
    plugin.adjustment(&leaving, &ctr()).expect("30 %");
    plugin.stop_pod_sandbox(&leaving).unwrap();
    // The release holds the GPU's release lock through its teardown, so the
    // claim meets the teardown first; the lasting reason is told.
    gate.wait_entered();
    refused_at_once(&plugin, &share("late", 50), "share over 100%");
    gate.open();
    assert!(plugin.wait_for_releases(LIMIT));
    plugin
        .adjustment(&share("fits", 40), &ctr())
        .expect("60 % and 40 %");
}

/// A share of a GPU whose teardown runs (another share's holder being
/// released) waits for that release although the shares fit: a pod that
/// joined the GPU would have its processes seen by that teardown.
#[test]
fn a_share_of_a_gpu_being_torn_down_waits_for_the_teardown() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, _second) = two_pods_one_gpu(state.path(), &gate);
    let gpu = &crate::fixture::HostRootBuilder::hgx()
        .expected()
        .unwrap()
        .gpus[3];
    let share = |id: &str| pod_named(&first, id, gpu_allocation(gpu.minor, &gpu.uuid, 30));
    let leaving = share("leaving");
    plugin.adjustment(&leaving, &ctr()).expect("30 %");
    plugin.stop_pod_sandbox(&leaving).unwrap();
    // The release holds the GPU's release lock through its teardown.
    gate.wait_entered();
    let log = crate::logging::capture::Captured::default();
    let opener = gate.open_once_waited(&log);
    log.run(|| plugin.adjustment(&share("joining"), &ctr()))
        .expect("admitted once the teardown ended");
    opener.join().unwrap();
    let waited = log.lines("waiting for");
    assert_eq!(waited.len(), 1, "{:?}", log.lines(""));
    assert!(waited[0].contains("is being released"), "{}", waited[0]);
    assert!(!plugin.devices().ledger().holds("leaving").unwrap());
}

/// With no release running: a refusal whose holders the ledger no longer
/// has (their release ended between the refusal and the look) is tried
/// again at once, whether it named a holder or the device's own teardown;
/// one while a live pod holds the device, or one no release ends, is not.
#[test]
fn what_is_tried_again_without_a_wait() {
    use crate::ledger::{Claim, DeviceId, LedgerError, Share};
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, second) = two_pods_one_gpu(state.path(), &gate);
    let uuid = &crate::fixture::HostRootBuilder::hgx()
        .expected()
        .unwrap()
        .gpus[1]
        .uuid;
    let device = || DeviceId::Gpu(uuid.clone());
    let claims = [Claim {
        device: device(),
        share: Share::Exclusive,
        pf: None,
    }];
    let began = std::time::Instant::now();
    let held = || LedgerError::Held {
        device: device(),
        holder: "team/web".into(),
    };
    let releasing = || LedgerError::Releasing { device: device() };
    let mismatch = || LedgerError::ClaimMismatch {
        pod: "p".into(),
        device: device(),
        held: false,
    };
    let again = |e: LedgerError| plugin.wait_for_release(&second, &ctr(), e, &claims, began);
    let held_by_web = |r: Result<(), LedgerError>| matches!(r, Err(LedgerError::Held { holder, .. }) if holder == "team/web");
    assert!(held_by_web(again(held())), "a live holder");
    assert!(
        held_by_web(again(releasing())),
        "a live holder, whatever the refusal"
    );
    assert!(
        matches!(again(mismatch()), Err(LedgerError::ClaimMismatch { .. })),
        "no release ends it"
    );
    plugin.stop_pod_sandbox(&first).unwrap();
    gate.open();
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(again(held()).is_ok(), "released meanwhile");
    assert!(
        again(releasing()).is_ok(),
        "the device's teardown ended meanwhile"
    );
    assert!(again(mismatch()).is_err());
}

/// A runtime that waits less than the default 2 s for a request (the
/// timeout it stated at Configure, or the request's own deadline, as the
/// stub gives the handler) gets its answer within it: the wait for the
/// holder's release ends at three quarters of it, not after the full second.
#[test]
fn a_short_request_timeout_shortens_the_wait_for_a_release() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, second) = two_pods_one_gpu(state.path(), &gate);
    plugin.stop_pod_sandbox(&first).unwrap();
    gate.wait_entered();
    let began = std::time::Instant::now();
    let timeout = std::time::Duration::from_millis(400);
    let err = nri::stub::with_request_timeout(timeout, || plugin.adjustment(&second, &ctr()))
        .unwrap_err();
    let took = began.elapsed();
    assert!(
        nri::ErrorChain(&err)
            .to_string()
            .contains("is held by pod team/web"),
        "{err}"
    );
    assert!(
        took >= std::time::Duration::from_millis(250),
        "waited {took:?}"
    );
    assert!(
        took < std::time::Duration::from_millis(1000),
        "waited {took:?}"
    );
    gate.open();
    assert!(plugin.wait_for_releases(LIMIT));
}
