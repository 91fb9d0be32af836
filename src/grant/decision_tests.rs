//! The checker's decisions: forged allocations refused and counted,
//! namespace rules, how the mode is resolved, and the config's keys.
use super::*;

#[test]
fn decisions_refuse_forged_allocations_and_count_them() {
    let api = FakeApi::start().unwrap();
    api.put_pod(pod("team", "forged", "u-forged", NODE, &[("cpu", "1")]));
    api.put_pod(pod(
        "team",
        "legit",
        "u-legit",
        NODE,
        &[("nvidia.com/gpu", "1")],
    ));
    api.put_pod(pod(
        "team",
        "bad",
        "u-bad",
        NODE,
        &[("nvidia.com/gpu", "half")],
    ));
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    let config = Arc::new(Config {
        grant_wait_ms: 100,
        ..Config::default()
    });
    let a = alloc(ONE_GPU);
    assert!(found(&checker, "u-bad"));
    checker
        .check(&config, id("team", "legit", "u-legit"), "main", &a)
        .expect("legit pod granted");
    let e = checker
        .check(&config, id("team", "forged", "u-forged"), "main", &a)
        .unwrap_err();
    let text = nri::ErrorChain(&e).to_string();
    assert!(text.starts_with(DEVICE_ALLOCATED), "{text}");
    assert!(text.contains("request no gpu"), "{text}");
    let e = checker
        .check(&config, id("team", "bad", "u-bad"), "main", &a)
        .unwrap_err();
    assert!(
        nri::ErrorChain(&e).to_string().contains("nvidia.com/gpu"),
        "{e}"
    );
    // Not known to the API server: waits the bound, then refuses.
    let t = Instant::now();
    let e = checker
        .check(&config, id("team", "ghost", "u-ghost"), "main", &a)
        .unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert!(
        e.to_string().contains("u-ghost") && e.to_string().contains("100 ms"),
        "{e}"
    );
    // failure_policy = ignore lets an unknown pod through unverified, never a mismatch.
    let ignore = Arc::new(Config {
        failure_policy: FailurePolicy::Ignore,
        ..(*config).clone()
    });
    checker
        .check(&ignore, id("team", "ghost", "u-ghost"), "main", &a)
        .expect("unverified under ignore");
    assert!(checker
        .check(&ignore, id("team", "forged", "u-forged"), "main", &a)
        .is_err());
    // Written in the background; written at the latest when the checker stops.
    drop(checker);
    let c = audit::read_counters(dir.path()).unwrap();
    assert_eq!((c.granted, c.unverified, c.refused), (1, 1, 4), "{c:?}");
    assert_eq!(c.refused_by_reason["mismatch"], 2);
    assert_eq!(c.refused_by_reason["unknown_pod"], 1);
    assert_eq!(c.refused_by_reason["bad_request"], 1);
}

#[test]
fn namespace_rules_and_modes() {
    let dir = tempfile::tempdir().unwrap();
    let a = alloc(ONE_GPU);
    let off = GrantChecker::with_mode(Mode::Off, dir.path());
    let denied = Arc::new(Config {
        denied_namespaces: vec!["tenants".into()],
        ..Config::default()
    });
    let e = off
        .check(&denied, id("tenants", "p", "u"), "c", &a)
        .unwrap_err();
    assert!(e.to_string().contains("denied_namespaces"), "{e}");
    off.check(&denied, id("ml", "p", "u"), "c", &a)
        .expect("other namespace, grant_check off");
    let allowed = Arc::new(Config {
        allowed_namespaces: vec!["ml".into()],
        ..Config::default()
    });
    off.check(&allowed, id("ml", "p", "u"), "c", &a).unwrap();
    let e = off
        .check(&allowed, id("web", "p", "u"), "c", &a)
        .unwrap_err();
    assert!(e.to_string().contains("not in allowed_namespaces"), "{e}");
    let unavailable =
        GrantChecker::with_mode(Mode::Unavailable("no api server".into()), dir.path());
    let e = unavailable
        .check(&Arc::default(), id("ml", "p", "u"), "c", &a)
        .unwrap_err();
    assert!(e.to_string().contains("no api server"), "{e}");
    let ignore = Arc::new(Config {
        failure_policy: FailurePolicy::Ignore,
        ..Config::default()
    });
    unavailable
        .check(&ignore, id("ml", "p", "u"), "c", &a)
        .expect("fail open when chosen");
}

#[test]
fn mode_resolution() {
    let sa = tempfile::tempdir().unwrap();
    std::fs::write(sa.path().join("token"), "t").unwrap();
    let no_env = |_: &str| None;
    let in_cluster = |k: &str| match k {
        "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_string()),
        "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
        "NODE_NAME" => Some("n1".to_string()),
        _ => None,
    };
    let no_kubelet = sa.path().join("no-kubelet.conf");
    let cfg = Config::default();
    assert_eq!(
        settings::resolve(&cfg, &no_env, sa.path(), &no_kubelet, "Host"),
        Mode::Off
    );
    match settings::resolve(&cfg, &in_cluster, sa.path(), &no_kubelet, "host") {
        Mode::Requests(ep) => {
            assert_eq!(ep.base, "https://10.96.0.1:443");
            assert_eq!(ep.node_name, "n1");
            assert_eq!(ep.token, Some(Secret::File(sa.path().join("token"))));
            assert_eq!(ep.ca, Some(Secret::File(sa.path().join("ca.crt"))));
        }
        other => panic!("{other:?}"),
    }
    let explicit = Config::parse(
        "grant_check = \"requests\"\n[kube_api]\nurl = \"http://127.0.0.1:8001/\"\n",
        "t",
    )
    .unwrap();
    match settings::resolve(&explicit, &no_env, sa.path(), &no_kubelet, "Host-1") {
        Mode::Requests(ep) => {
            assert_eq!(ep.base, "http://127.0.0.1:8001");
            assert_eq!(ep.node_name, "host-1");
            assert_eq!(ep.token, None);
        }
        other => panic!("{other:?}"),
    }
    let required = Config::parse("grant_check = \"requests\"", "t").unwrap();
    assert!(matches!(
        settings::resolve(&required, &no_env, sa.path(), &no_kubelet, "h"),
        Mode::Unavailable(_)
    ));
    let off = Config::parse("grant_check = \"off\"", "t").unwrap();
    assert_eq!(
        settings::resolve(&off, &in_cluster, sa.path(), &no_kubelet, "h"),
        Mode::Off
    );

    // On the host, with nothing configured: kubelet's kubeconfig, as the node.
    let kubelet = sa.path().join("kubelet.conf");
    std::fs::write(
        &kubelet,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: \"https://10.0.0.1:6443\"}}]\n\
         users: [{name: u, user: {token: t0k}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    match settings::resolve(&cfg, &no_env, sa.path(), &kubelet, "Node-7") {
        Mode::Requests(ep) => {
            assert_eq!(ep.base, "https://10.0.0.1:6443");
            assert_eq!(ep.node_name, "node-7");
        }
        other => panic!("{other:?}"),
    }
    // The service account wins in a pod; grant_check = "off" wins over both.
    match settings::resolve(&cfg, &in_cluster, sa.path(), &kubelet, "h") {
        Mode::Requests(ep) => assert_eq!(ep.base, "https://10.96.0.1:443"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        settings::resolve(&off, &no_env, sa.path(), &kubelet, "h"),
        Mode::Off
    );
    // Found but unusable: fails closed, and says how to turn the check off.
    std::fs::write(&kubelet, "kind: Config\nclusters: [\n").unwrap();
    match settings::resolve(&cfg, &no_env, sa.path(), &kubelet, "h") {
        Mode::Unavailable(reason) => {
            assert!(reason.contains("kubelet's kubeconfig"), "{reason}");
            assert!(reason.contains("grant_check = \"off\""), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn config_keys_are_validated() {
    for (text, key) in [
        ("grant_wait_ms = 1900", "grant_wait_ms"),
        ("[kube_api]\nurl = \"ftp://x\"", "kube_api.url"),
        (
            "[kube_api]\nurl = \"http://10.0.0.1:8080\"\ntoken_file = \"/t\"",
            "clear text",
        ),
        ("[kube_api]\nnode_name = \"Node A\"", "kube_api.node_name"),
        ("denied_namespaces = [\"Bad_NS\"]", "denied_namespaces"),
        ("grant_check = \"maybe\"", "unknown variant `maybe`"),
        (
            "[kube_api]\nkubeconfig = \"kubelet.conf\"",
            "not an absolute path",
        ),
        (
            "[kube_api]\nurl = \"https://h\"\ntoken_file = \"token\"",
            "kube_api.token_file",
        ),
        (
            "[kube_api]\nurl = \"https://h\"\nca_file = \"ca.crt\"",
            "kube_api.ca_file",
        ),
        ("[kube_api]\nnode_name = \"node-\"", "kube_api.node_name"),
        (
            "[kube_api]\nkubeconfig = \"/k\"\nurl = \"https://h\"",
            "set no url, token_file or ca_file",
        ),
        ("[kube_api]\ncontext = \"x\"", "kube_api.context"),
    ] {
        let e = Config::parse(text, "t").unwrap_err();
        assert!(e.to_string().contains(key), "{text}: {e}");
    }
    let _ = PathBuf::new();
}

/// A runtime that answers sooner than 2 s caps the wait for a pod the watch
/// has not delivered below `grant_wait_ms`, and the refusal names the wait
/// it made.
#[test]
fn the_wait_for_an_unknown_pod_is_capped_below_grant_wait_ms() {
    let api = FakeApi::start().unwrap();
    // Another pod, found once the watch's list is in.
    api.put_pod(pod("team", "other", "u-other", NODE, &[]));
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    assert!(found(&checker, "u-other"));
    // The refusal of a pod the API server never heard of, and how long it took.
    let refuse = |grant_wait_ms: u64| {
        let config = Arc::new(Config {
            grant_wait_ms,
            ..Config::default()
        });
        let t = Instant::now();
        let ghost = id("team", "ghost", "u-ghost");
        let e = checker.check(&config, ghost, "main", &alloc(ONE_GPU));
        (e.unwrap_err().to_string(), t.elapsed())
    };
    checker.cap_wait(Duration::from_millis(150));
    let (e, took) = refuse(1500);
    assert!(took >= Duration::from_millis(150), "{took:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert!(e.contains("after 150 ms"), "{e}");
    // A cap above grant_wait_ms leaves it.
    checker.cap_wait(Duration::from_secs(60));
    let (e, _) = refuse(50);
    assert!(e.contains("after 50 ms"), "{e}");
}
