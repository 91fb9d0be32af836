//! Event delivery, replies and errors.

use super::*;

#[tokio::test]
async fn create_container_returns_the_adjustment() {
    let config = FakeConfig::containerd_1_7();
    let (_p, conn, _dir) = connect(Recorder::new(create_and_remove()), config).await;
    let reply = conn
        .unwrap()
        .create_container(&pod("web"), &ctr("app"))
        .await
        .unwrap();
    assert_eq!(reply.adjust.env[0].key, "POD");
    assert_eq!(reply.adjust.env[0].value, "web");
}

/// UpdateContainer and StopContainer reach their handlers with the request's
/// pod, container and resources, and their updates come back to the runtime.
#[tokio::test]
async fn update_and_stop_container_reach_the_plugin_and_return_updates() {
    let events = create_and_remove()
        .with(Event::UPDATE_CONTAINER)
        .with(Event::STOP_CONTAINER);
    for config in [FakeConfig::containerd_1_7(), FakeConfig::nri_v0_12()] {
        let (plugin, conn, _dir) = connect(Recorder::new(events), config).await;
        let conn = conn.unwrap();
        let resources = crate::api::LinuxResources {
            devices: vec![Default::default(), Default::default()],
            ..Default::default()
        };
        let updated = conn
            .update_container(&pod("web"), &ctr("app"), &resources)
            .await
            .unwrap();
        assert_eq!(updated.update[0].container_id, "app-id");
        let stopped = conn.stop_container(&pod("web"), &ctr("app")).await.unwrap();
        assert_eq!(stopped.update[0].container_id, "app-id-sibling");
        assert_eq!(
            plugin.calls()[1..],
            [
                "update app in web: 2 device rules".to_string(),
                "stop app in web".to_string()
            ]
        );
    }
}

#[tokio::test]
async fn a_lean_plugin_gets_what_it_reads_and_not_the_rest() {
    let mut pod = pod("web");
    pod.labels.insert("app".into(), "web".into());
    let mut c = ctr("app");
    c.env.push("A=1".into());
    c.mounts.push(crate::api::Mount {
        destination: "/data".into(),
        ..Default::default()
    });
    // No label, and the env at creations only: a creation still has it.
    let no_labels = crate::Keep {
        labels: crate::Keys::Only(&[]),
        annotations: crate::Keys::All,
        env: crate::EnvAt::Only {
            events: crate::EventMask::of(Event::CREATE_CONTAINER),
            pods_annotated: crate::Keys::All,
        },
    };
    for (decode, mounts, labels) in [
        (crate::Decode::Full, 1, 1),
        (crate::Decode::Lean(crate::Keep::ALL), 0, 1),
        (crate::Decode::Lean(no_labels), 0, 0),
    ] {
        for config in [FakeConfig::containerd_1_7(), FakeConfig::nri_v0_12()] {
            let plugin = Recorder {
                decode,
                ..Recorder::new(create_and_remove())
            };
            let (plugin, conn, _dir) = connect(plugin, config).await;
            let conn = conn.unwrap();
            let reply = conn.create_container(&pod, &c).await.unwrap();
            assert_eq!(reply.adjust.env[0].value, "web");
            conn.event(Event::REMOVE_CONTAINER, &pod, Some(&c))
                .await
                .unwrap();
            let want =
                format!("create app in web: env [\"A=1\"], mounts {mounts}, pod labels {labels}");
            assert_eq!(
                plugin.calls()[1..],
                [want, "remove app".to_string()],
                "{decode:?}"
            );
        }
    }
}

#[tokio::test]
async fn lifecycle_events_arrive_by_either_rpc_style() {
    let events = create_and_remove().with(Event::RUN_POD_SANDBOX);
    for config in [FakeConfig::containerd_1_7(), FakeConfig::nri_v0_12()] {
        let (plugin, conn, _dir) = connect(Recorder::new(events), config).await;
        let conn = conn.unwrap();
        conn.event(Event::RUN_POD_SANDBOX, &pod("p"), None)
            .await
            .unwrap();
        let c = ctr("gone");
        conn.event(Event::REMOVE_CONTAINER, &pod("p"), Some(&c))
            .await
            .unwrap();
        assert_eq!(&plugin.calls()[1..], ["run_pod p", "remove gone"]);
    }
}

#[tokio::test]
async fn state_change_still_works_on_new_runtimes() {
    let config = FakeConfig::nri_v0_12();
    let (plugin, conn, _dir) = connect(Recorder::new(create_and_remove()), config).await;
    let conn = conn.unwrap();
    let req = crate::api::StateChangeEvent {
        event: Event::REMOVE_CONTAINER.into(),
        pod: Some(pod("p")).into(),
        container: Some(ctr("old")).into(),
        ..Default::default()
    };
    let ctx = ttrpc::context::with_duration(LIMIT);
    conn.client().state_change(ctx, &req).await.unwrap();
    assert_eq!(plugin.calls().last().unwrap(), "remove old");
}

#[tokio::test]
async fn plugin_error_reaches_the_runtime_as_a_status() {
    let plugin = Recorder {
        refuse_with: Some(Code::INVALID_ARGUMENT),
        ..Recorder::new(create_and_remove())
    };
    let (_p, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let err = conn
        .unwrap()
        .create_container(&pod("p"), &ctr("app"))
        .await
        .unwrap_err();
    let ttrpc::Error::RpcStatus(status) = err else {
        panic!("not a status: {err:?}");
    };
    assert_eq!(status.code(), Code::INVALID_ARGUMENT);
    assert_eq!(status.message(), "refused container app");
}

#[tokio::test]
async fn misleading_error_codes_are_replaced() {
    for code in [Code::UNIMPLEMENTED, Code::DEADLINE_EXCEEDED, Code::OK] {
        let plugin = Recorder {
            refuse_with: Some(code),
            ..Recorder::new(create_and_remove())
        };
        let (_p, conn, _dir) = connect(plugin, FakeConfig::nri_v0_12()).await;
        let err = conn
            .unwrap()
            .create_container(&pod("p"), &ctr("c"))
            .await
            .unwrap_err();
        let ttrpc::Error::RpcStatus(status) = err else {
            panic!("not a status: {err:?}");
        };
        assert_eq!(status.code(), Code::UNKNOWN, "{code:?}");
    }
}

/// A handler sees the deadline the runtime gave its request (what is left
/// of the runtime's request timeout when it sent it), and none once it
/// returned.
#[tokio::test]
async fn a_handler_sees_its_requests_deadline() {
    let config = FakeConfig {
        request_timeout: Duration::from_millis(1234),
        ..FakeConfig::containerd_1_7()
    };
    let (p, conn, _dir) = connect(Recorder::new(create_and_remove()), config).await;
    let conn = conn.unwrap();
    conn.create_container(&pod("p"), &ctr("c")).await.unwrap();
    let seen = p.deadlines.lock().unwrap().clone();
    let [Some(deadline)] = seen[..] else {
        panic!("{seen:?}");
    };
    assert!(
        deadline <= Duration::from_millis(1234) && deadline > Duration::from_millis(1000),
        "{deadline:?}"
    );
    assert_eq!(crate::stub::request_timeout(), None);
}

#[tokio::test]
async fn a_late_reply_does_not_confuse_the_next_request() {
    let plugin = Recorder {
        stall: Mutex::new(Some(Duration::from_millis(1500))),
        ..Recorder::new(create_and_remove())
    };
    let config = FakeConfig {
        request_timeout: Duration::from_millis(1000),
        ..FakeConfig::containerd_1_7()
    };
    let (_p, conn, _dir) = connect(plugin, config).await;
    let conn = conn.unwrap();
    // The runtime gives up first: a timeout, not a status from the plugin.
    let err = conn
        .create_container(&pod("p"), &ctr("slow"))
        .await
        .unwrap_err();
    assert!(!matches!(err, ttrpc::Error::RpcStatus(_)), "{err:?}");
    // The reply that comes after it is dropped by stream id; the next request
    // gets its own.
    let reply = conn
        .create_container(&pod("p"), &ctr("next"))
        .await
        .unwrap();
    assert_eq!(reply.adjust.env[0].value, "p");
}

#[tokio::test]
async fn the_request_gate_waits_for_the_handler_in_progress() {
    let (_dir, path) = socket_dir();
    let runtime = FakeRuntime::bind(&path, FakeConfig::containerd_1_7()).unwrap();
    let (tx, stalling) = std::sync::mpsc::channel();
    let plugin = Recorder {
        stall: Mutex::new(Some(Duration::from_millis(400))),
        stalling: Mutex::new(Some(tx)),
        ..Recorder::new(create_and_remove())
    };
    let stub = Stub::new(plugin)
        .with_name("test")
        .with_idx("42")
        .with_socket_path(&path);
    let gate = stub.request_gate();
    std::thread::spawn(move || stub.run());
    let conn = tokio::time::timeout(LIMIT, runtime.accept())
        .await
        .unwrap()
        .unwrap();
    let started = std::time::Instant::now();
    let holder = std::thread::spawn(move || {
        // Inside the stalled handler: it began after `started`, and holds
        // the gate for its 400 ms.
        stalling.recv().expect("the handler stalls");
        let _held = gate.hold();
        started.elapsed()
    });
    let reply = conn.create_container(&pod("p"), &ctr("c")).await.unwrap();
    assert_eq!(reply.adjust.env[0].value, "p");
    let waited = holder.join().unwrap();
    assert!(
        waited >= Duration::from_millis(400),
        "the gate was taken after {waited:?}, before the handler ended"
    );
}
