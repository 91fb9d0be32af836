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

    let dir = tempfile::Builder::new()
        .prefix("dg")
        .tempdir_in("/tmp")
        .unwrap();
    let path = dir.path().join("s");
    let runtime = FakeRuntime::bind(&path, FakeConfig::containerd_1_7()).unwrap();
    let stub = Stub::new(plugin)
        .with_name("devgate")
        .with_idx("10")
        .with_socket_path(&path);
    let plugin = Arc::clone(stub.plugin());
    let requests = stub.request_gate();
    // Redials for ever: the thread ends with the test process.
    std::thread::spawn(move || stub.run());
    let conn = tokio::time::timeout(LIMIT, runtime.accept())
        .await
        .unwrap()
        .unwrap();

    let (drained_tx, drained) = std::sync::mpsc::channel();
    let (exit_tx, exit_rx) = std::sync::mpsc::channel::<()>();
    let exit = std::thread::spawn(move || {
        let _kept_out = plugin.drain_for_exit(&requests, LIMIT);
        drained_tx.send(()).unwrap();
        let _ = exit_rx.recv();
    });
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
