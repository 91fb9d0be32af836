//! The grant check when the api server appears late or misbehaves.
use super::*;

/// A node that joins the cluster after devgate started: no kubelet
/// kubeconfig at start (the check resolves to off), one afterwards. The next
/// decision finds it, watches the pods, and checks the allocation instead of
/// applying it unchecked.
#[test]
fn a_kubelet_kubeconfig_written_after_start_turns_the_check_on() {
    let api = FakeApi::start().unwrap();
    api.put_pod(pod("ns", "p", "u-late", NODE, &[("cpu", "1")]));
    let dir = tempfile::tempdir().unwrap();
    let kubelet = dir.path().join("kubelet.conf");
    let config = Arc::new(Config {
        kube_api: KubeApiConfig {
            node_name: NODE.to_string(),
            ..KubeApiConfig::default()
        },
        ..Config::default()
    });
    let checker = GrantChecker::start_at(&config, dir.path(), dir.path(), &kubelet);
    std::fs::write(
        &kubelet,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: c, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: u, user: {{}}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n",
            api.url()
        ),
    )
    .unwrap();
    assert!(
        matches!(checker.mode(), Mode::Requests(_)),
        "{:?}",
        checker.mode()
    );
    assert!(found(&checker, "u-late"));
    let e = checker
        .check(&config, id("ns", "p", "u-late"), "c", &alloc(ONE_GPU))
        .unwrap_err();
    assert!(
        e.to_string().contains("more than its containers request"),
        "{e}"
    );
}

/// Lists `from` a server whose list pages hold `per_page` pods each and
/// never end: the list fails as too many pods; how many pages it asked for.
fn pages_before_cut_off(per_page: usize, from: &watch::ListFrom) -> usize {
    let api = FakeApi::start().unwrap();
    api.list_without_end(per_page);
    let client = watch::PodClient::new(&endpoint(&api)).unwrap();
    let e = client.list(from).unwrap_err();
    assert!(matches!(e, watch::WatchError::TooManyPods { .. }), "{e}");
    let requests = api.requests();
    requests.iter().filter(|r| r.starts_with("list")).count()
}

/// A server whose pod list never ends: the client gives up past the most
/// pods a node can run instead of growing without bound; and where its pages
/// hold no pod (a field selector's pages may be empty), after a bounded
/// number of pages instead of asking for ever.
#[test]
fn a_list_without_end_is_cut_off() {
    let cached = pages_before_cut_off(500, &watch::ListFrom::Cache);
    assert_eq!(cached, cache::MAX_PODS / 500 + 1);
    let empty = pages_before_cut_off(0, &watch::ListFrom::Etcd);
    assert_eq!(empty, watch::MAX_PAGES + 1);
}

/// A server, or a proxy before it, that ends each watch at once with 200 and
/// no event: the watch is asked again after growing pauses, as after a
/// failed one, rather than as fast as the node can ask.
#[test]
fn a_watch_ended_at_once_is_asked_again_only_after_a_pause() {
    let api = FakeApi::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut ep = endpoint(&api);
    // The fake ends a watch when its timeout is up: at once.
    ep.watch_timeout_secs = 0;
    let checker = GrantChecker::with_mode(Mode::Requests(ep), dir.path());
    let watched = |r: &[String]| r.iter().any(|r| r.starts_with("watch"));
    assert!(api.wait_requests(LONG, watched));
    std::thread::sleep(Duration::from_millis(1500));
    drop(checker);
    let requests = api.requests();
    let watches = requests.iter().filter(|r| r.starts_with("watch")).count();
    // Pauses of 50–100, 100–200, 200–400, 400–800 ms and on: at most six
    // watches in 1.5 s, where without them there were thousands.
    assert!((2..=8).contains(&watches), "{watches} watches");
    assert!(requests[0].starts_with("list"), "{requests:?}");
}
