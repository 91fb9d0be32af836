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

/// A server whose pod list never ends: the client gives up past the most
/// pods a node can run instead of growing without bound.
#[test]
fn a_list_without_end_is_cut_off() {
    let api = FakeApi::start().unwrap();
    api.list_without_end(500);
    let client = watch::PodClient::new(&endpoint(&api)).unwrap();
    let e = client.list(&super::watch::ListFrom::Cache).unwrap_err();
    assert!(matches!(e, watch::WatchError::TooManyPods { .. }), "{e}");
    let pages = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("list"))
        .count();
    assert_eq!(pages, cache::MAX_PODS / 500 + 1);
}

/// A server whose list pages hold no pod yet never end is cut off too,
/// after a bounded number of pages, instead of being asked for ever.
#[test]
fn a_list_of_empty_pages_without_end_is_cut_off() {
    let api = FakeApi::start().unwrap();
    api.list_without_end(0);
    let client = watch::PodClient::new(&endpoint(&api)).unwrap();
    let e = client.list(&super::watch::ListFrom::Etcd).unwrap_err();
    assert!(matches!(e, watch::WatchError::TooManyPods { .. }), "{e}");
    let pages = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("list"))
        .count();
    assert_eq!(pages, watch::MAX_PAGES + 1);
}
