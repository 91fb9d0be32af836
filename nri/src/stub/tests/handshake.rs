//! Registration, configuration, synchronization and reconnection.

use super::*;

#[tokio::test]
async fn registers_then_configures_and_synchronizes() {
    let config = FakeConfig::containerd_1_7();
    let (plugin, conn, _dir) = connect(Recorder::new(create_and_remove()), config).await;
    let conn = conn.unwrap();
    assert_eq!(conn.registration.plugin_name, "test");
    assert_eq!(conn.registration.plugin_idx, "42");
    assert_eq!(conn.registration.NRI_version, NRI_API_VERSION);
    assert_eq!(conn.events, create_and_remove());
    assert_eq!(plugin.calls(), ["configure containerd 0x408"]);
    assert_eq!(*plugin.synced.lock().unwrap(), [(0, 0)]);
}

#[tokio::test]
async fn mask_is_clipped_to_what_the_runtime_knows() {
    let wanted = EventMask::of(Event::CREATE_CONTAINER)
        .with(Event::UPDATE_POD_SANDBOX)
        .with(Event::VALIDATE_CONTAINER_ADJUSTMENT);
    // containerd 1.7.24 (NRI v0.6.1) would refuse bits 12-14.
    let (_p, old, _d1) = connect(Recorder::new(wanted), FakeConfig::containerd_1_7()).await;
    assert_eq!(old.unwrap().events, EventMask::of(Event::CREATE_CONTAINER));
    let (_p, new, _d2) = connect(Recorder::new(wanted), FakeConfig::nri_v0_12()).await;
    assert_eq!(new.unwrap().events, wanted);
    // An unknown runtime gets the pre-v0.10 set.
    let other = FakeConfig {
        runtime_name: "other".to_string(),
        runtime_version: "9.9.9".to_string(),
        ..FakeConfig::containerd_1_7()
    };
    let (_p, unknown, _d3) = connect(Recorder::new(wanted), other).await;
    assert_eq!(unknown.unwrap().events.bits() & !0x7FF, 0);
}

#[tokio::test]
async fn an_unknown_stated_version_is_inferred_and_the_mask_kept() {
    let wanted = EventMask::of(Event::CREATE_CONTAINER).with(Event::UPDATE_POD_SANDBOX);
    // A runtime built without module information states "0.0.0-unknown".
    let config = FakeConfig {
        nri_version: "0.0.0-unknown".to_string(),
        ..FakeConfig::nri_v0_12()
    };
    let (_p, conn, _d) = connect(Recorder::new(wanted), config).await;
    assert_eq!(conn.unwrap().events, wanted);
}

#[tokio::test]
async fn no_supported_event_fails_configure() {
    let only_new = EventMask::of(Event::UPDATE_POD_SANDBOX);
    let (_p, conn, _dir) = connect(Recorder::new(only_new), FakeConfig::containerd_1_7()).await;
    let err = conn.err().expect("configure must fail");
    assert!(
        matches!(
            err,
            FakeError::Rpc {
                method: "Configure",
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn split_synchronize_is_delivered_once() {
    let config = FakeConfig {
        pods: (0..5).map(|i| pod(&format!("p{i}"))).collect(),
        containers: (0..7).map(|i| ctr(&format!("c{i}"))).collect(),
        sync_chunk: 2,
        ..FakeConfig::nri_v0_12()
    };
    let (plugin, conn, _dir) = connect(Recorder::new(create_and_remove()), config).await;
    let conn = conn.unwrap();
    assert_eq!(*plugin.synced.lock().unwrap(), [(5, 7)]);
    let (last, chunks) = conn.sync_replies.split_last().unwrap();
    assert_eq!(chunks.len(), 5);
    assert!(chunks.iter().all(|r| r.more && r.update.is_empty()));
    assert!(!last.more);
    assert_eq!(last.update[0].container_id, "c0");
}

#[tokio::test]
async fn reconnects_after_the_runtime_restarts() {
    let (_dir, path) = socket_dir();
    let runtime = FakeRuntime::bind(&path, FakeConfig::containerd_1_7()).unwrap();
    let plugin = dialling(Recorder::new(create_and_remove()), &path);
    let first = tokio::time::timeout(LIMIT, runtime.accept())
        .await
        .unwrap()
        .unwrap();
    // Runtime restart: connection and socket go away, a new socket appears.
    drop(first);
    drop(runtime);
    std::fs::remove_file(&path).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runtime = FakeRuntime::bind(&path, FakeConfig::containerd_1_7()).unwrap();
    let second = tokio::time::timeout(LIMIT, runtime.accept())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.registration.plugin_name, "test");
    assert_eq!(plugin.synced.lock().unwrap().len(), 2);
    assert!(plugin.calls().contains(&"close".to_string()));
}

/// A runtime that closes the plugin right after each Synchronize (an update
/// it cannot apply, a reply too large or too late) is not redialled every
/// 100 ms: the waits between connections keep doubling, as after a failure.
#[tokio::test]
async fn a_connection_closed_soon_after_synchronizing_backs_off() {
    let (_dir, path) = socket_dir();
    let runtime = FakeRuntime::bind(&path, FakeConfig::containerd_1_7()).unwrap();
    dialling(Recorder::new(create_and_remove()), &path);
    let mut accepted = Vec::new();
    for _ in 0..4 {
        let conn = tokio::time::timeout(LIMIT, runtime.accept())
            .await
            .unwrap()
            .unwrap();
        accepted.push(std::time::Instant::now());
        drop(conn);
    }
    let waits: Vec<Duration> = accepted.windows(2).map(|w| w[1] - w[0]).collect();
    // 100, 200 and 400 ms at least (the handshake adds to each).
    assert!(waits[2] >= Duration::from_millis(350), "{waits:?}");
    assert!(waits[1] >= Duration::from_millis(180), "{waits:?}");
}

#[tokio::test]
async fn given_connection_ends_the_stub_when_closed() {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let stub = Stub::new(Recorder::new(create_and_remove()))
        .with_name("devgate")
        .with_idx("10")
        .with_connection(ours);
    let running = tokio::task::spawn_blocking(move || stub.run());
    theirs.set_nonblocking(true).unwrap();
    let theirs = tokio::net::UnixStream::from_std(theirs).unwrap();
    let conn = handshake(theirs, FakeConfig::containerd_1_7())
        .await
        .unwrap();
    assert_eq!(conn.registration.plugin_idx, "10");
    drop(conn);
    let result = tokio::time::timeout(LIMIT, running).await.unwrap().unwrap();
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn refusal_before_synchronize_is_an_error() {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let only_new = EventMask::of(Event::UPDATE_POD_SANDBOX);
    let stub = Stub::new(Recorder::new(only_new))
        .with_name("devgate")
        .with_idx("10")
        .with_connection(ours);
    let running = tokio::task::spawn_blocking(move || stub.run());
    theirs.set_nonblocking(true).unwrap();
    let theirs = tokio::net::UnixStream::from_std(theirs).unwrap();
    let config = FakeConfig {
        configure_before_register_reply: false,
        ..FakeConfig::containerd_1_7()
    };
    let refused = handshake(theirs, config).await;
    assert!(refused.is_err());
    let result = tokio::time::timeout(LIMIT, running).await.unwrap().unwrap();
    assert!(
        matches!(result, Err(StubError::Refused { .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn invalid_identity_is_refused_before_connecting() {
    let cases = [
        ("ok", "1"),
        ("ok", "ab"),
        ("ok", "123"),
        ("", "10"),
        ("a b", "10"),
    ];
    for (name, idx) in cases {
        let stub = Stub::new(Recorder::new(create_and_remove()))
            .with_name(name)
            .with_idx(idx)
            .with_socket_path("/nonexistent/nri.sock");
        let err = stub.run().unwrap_err();
        assert!(
            matches!(
                err,
                StubError::InvalidIndex { .. } | StubError::InvalidName { .. }
            ),
            "{name:?} {idx:?}: {err}"
        );
    }
    let stub = Stub::new(Recorder::new(EventMask::EMPTY))
        .with_name("x")
        .with_idx("10");
    assert!(matches!(stub.run(), Err(StubError::NoEvents)));
}
