//! The pods GPU teardown knows: daemons the runtime names, until removed.
use super::*;

/// A daemon pod the runtime names (`gpu.ignored_pods`) is known to GPU
/// teardown until its sandbox is removed; a tenant's pod is not kept, so
/// that sandboxes whose start failed after devgate's part, which get no
/// removal, do not pile up.
#[tokio::test]
async fn pods_are_known_to_gpu_teardown_until_removed() {
    let (plugin, _state) = plugin(Config::default(), false);
    let (p, conn, _dir) = connect(plugin, FakeConfig::containerd_1_7()).await;
    let conn = conn.unwrap();
    let koordlet = PodSandbox {
        id: "sb-k".to_string(),
        uid: "u-k".to_string(),
        name: "koordlet-x7k2p".to_string(),
        namespace: "koordinator-system".to_string(),
        ..Default::default()
    };
    for i in 0..3 {
        let tenant = PodSandbox {
            id: format!("sb-t{i}"),
            uid: format!("u-t{i}"),
            name: format!("koordlet-t{i}"),
            namespace: "team-a".to_string(),
            ..Default::default()
        };
        conn.event(nri::api::Event::RUN_POD_SANDBOX, &tenant, None)
            .await
            .unwrap();
        conn.create_container(&tenant, &ctr()).await.unwrap();
    }
    assert_eq!(p.gpu.known_pods().count(), 0, "tenants are not kept");
    conn.create_container(&koordlet, &ctr()).await.unwrap();
    assert_eq!(p.gpu.known_pods().count(), 1);
    let patterns = crate::config::GpuConfig::default().ignored_pods;
    let its = "0::/kubepods/burstable/podu-k/c1\n";
    assert!(p.gpu.known_pods().cgroups_of(&patterns).contains(its));
    // Written for `devgate clear`, which cannot ask the runtime.
    let file = p.options().state_dir.join(crate::gpu::DAEMON_PODS_FILE);
    let saved = || std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        saved(),
        r#"[{"pod":"koordinator-system/koordlet-x7k2p","uid":"u-k"}]"#
    );
    conn.event(nri::api::Event::REMOVE_POD_SANDBOX, &koordlet, None)
        .await
        .unwrap();
    assert!(!p.gpu.known_pods().cgroups_of(&patterns).contains(its));
    assert_eq!(saved(), "[]");
}
