//! The plugin's exit on a signal: the runtime's requests are answered while
//! the teardowns in progress finish.
use super::release_wait_tests::{two_pods_one_gpu, Gate};
use super::*;

/// An exit waits for a teardown in progress, and a creation meanwhile is
/// answered: held past the runtime's timeout, it would make the runtime drop
/// the plugin and create the container without its devices. Once the
/// teardown ended, no request starts until the process is gone.
#[tokio::test]
async fn requests_are_answered_while_an_exit_waits_for_teardowns() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, _second) = two_pods_one_gpu(state.path(), &gate);
    plugin.stop_pod_sandbox(&first).unwrap();
    gate.wait_entered();

    let ((plugin, conn, _dir), requests) =
        connect_gated(plugin, FakeConfig::containerd_1_7()).await;
    let conn = conn.unwrap();

    let (drained_tx, drained) = std::sync::mpsc::channel();
    let (exit_tx, exit_rx) = std::sync::mpsc::channel::<()>();
    let exit = std::thread::spawn(move || {
        let _kept_out = plugin.drain_for_exit(&requests, LIMIT);
        drained_tx.send(()).unwrap();
        let _ = exit_rx.recv();
    });
    // The exit under way before the creation is sent: an exit that kept
    // requests out from its start would hold this one.
    std::thread::sleep(Duration::from_millis(200));
    let answered = tokio::time::timeout(
        Duration::from_secs(5),
        conn.create_container(&pod(None), &ctr()),
    )
    .await
    .expect("a creation answered while the exit waits for the teardown")
    .unwrap();
    assert_eq!(*answered.adjust, nri::api::ContainerAdjustment::default());
    assert!(
        drained.try_recv().is_err(),
        "the exit did not wait for the teardown"
    );

    gate.open();
    drained
        .recv_timeout(LIMIT)
        .expect("the exit's wait ends with the teardown");
    let held = tokio::time::timeout(
        Duration::from_millis(300),
        conn.create_container(&pod(None), &ctr()),
    )
    .await;
    assert!(held.is_err(), "a request started after the exit's wait");
    exit_tx.send(()).unwrap();
    exit.join().unwrap();
}

/// A release that the request in progress starts as the exit's wait ends
/// (a pod's stop) is waited for too, before requests are kept out for good.
#[test]
fn a_release_started_by_the_last_request_is_waited_for() {
    use nri::stub::Plugin as _;
    let state = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let (plugin, first, _second) = two_pods_one_gpu(state.path(), &gate);
    let plugin = Arc::new(plugin);
    let requests = nri::stub::RequestGate::default();
    // A request in progress: the exit's first wait finds nothing running.
    let in_progress = requests.hold();
    let (drained_tx, drained) = std::sync::mpsc::channel();
    let exiting = Arc::clone(&plugin);
    let gate_for_exit = requests.clone();
    let exit = std::thread::spawn(move || {
        drop(exiting.drain_for_exit(&gate_for_exit, LIMIT));
        drained_tx.send(()).unwrap();
    });
    std::thread::sleep(Duration::from_millis(100));
    // That request stops a pod: its release starts, then the request ends.
    plugin.stop_pod_sandbox(&first).unwrap();
    gate.wait_entered();
    drop(in_progress);
    assert!(
        drained.recv_timeout(Duration::from_millis(300)).is_err(),
        "the exit did not wait for the release the last request started"
    );
    gate.open();
    drained
        .recv_timeout(LIMIT)
        .expect("the exit ends once the release ended");
    exit.join().unwrap();
    assert!(!plugin.devices().ledger().holds(&first.id).unwrap());
}
