//! What a pod list costs the plugin: the API server leaves out the node's
//! finished pods, and of a listed pod's annotations only those the check
//! reads are kept.
use super::fake_api::{pod, FakeApi, CACHED};
use super::model::{Pod, CONFIG_MIRROR};
use super::request::RdmaStrategy;

const NODE: &str = "node-a";

/// A page's byte bound in these tests: 64 KiB stands for 64 MiB, so that
/// crossing it takes kilobytes.
const BOUND: u64 = 64 << 10;

fn client(api: &FakeApi) -> super::watch::PodClient {
    super::watch::PodClient::new(&api.endpoint(NODE))
        .unwrap()
        .with_max_list_bytes(BOUND)
}

/// A pod carrying `bytes` of annotation.
fn big_pod(name: &str, bytes: usize) -> serde_json::Value {
    let mut p = pod("ns", name, &format!("u-{name}"), NODE, &[]);
    p["metadata"]["annotations"]["workflows.argoproj.io/template"] = "x".repeat(bytes).into();
    p
}

/// Finished pods whose specs together exceed a list page's byte bound (Argo
/// workflow pods carry large template annotations; kubelet keeps a node's
/// finished pods until the garbage collector's threshold): the list asks the
/// API server to leave them out, and one page holds the running pod.
#[test]
fn finished_pods_are_not_listed_at_all() {
    let api = FakeApi::start().unwrap();
    for i in 0..24 {
        let mut p = big_pod(&format!("done{i:02}"), 6 << 10);
        p["status"]["phase"] = if i % 2 == 0 { "Succeeded" } else { "Failed" }.into();
        api.put_pod(p);
    }
    api.put_pod(pod(
        "ns",
        "running",
        "u-run",
        NODE,
        &[("nvidia.com/gpu", "1")],
    ));
    let (pods, _) = client(&api).list(&super::watch::ListFrom::Cache).unwrap();
    let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["running"]);
    assert_eq!(
        api.pages(),
        [(0, CACHED)],
        "one list from the cache; the server left them out"
    );
}

/// Running pods of a large size each (the cached list and a page of them
/// over the byte bound): the list is read again from etcd page by page, a
/// page asked for again half as long until it fits, and every pod is listed.
#[test]
fn a_page_too_large_is_asked_for_again_shorter() {
    let api = FakeApi::start().unwrap();
    for i in 0..12 {
        api.put_pod(big_pod(&format!("big{i:02}"), 6 << 10));
    }
    let (pods, _) = client(&api).list(&super::watch::ListFrom::Cache).unwrap();
    assert_eq!(pods.len(), 12);
    let mut pages = api.pages();
    assert_eq!(pages.remove(0), (0, CACHED), "from the cache first");
    assert_eq!(pages[..2], [(0, 40), (0, 20)], "{pages:?}");
    // Each retry of the first page halves it; later pages keep the size that fit.
    let fit = pages
        .iter()
        .position(|&(from, _)| from > 0)
        .expect("a second page");
    assert!(
        pages[..fit].windows(2).all(|w| w[1].1 == w[0].1 / 2),
        "{pages:?}"
    );
    assert!(
        pages[fit..]
            .iter()
            .all(|&(_, limit)| limit == pages[fit - 1].1),
        "{pages:?}"
    );
    // A pod that cannot fit even alone is an error, not a loop.
    let api = FakeApi::start().unwrap();
    api.put_pod(big_pod("huge", BOUND as usize));
    let e = client(&api)
        .list(&super::watch::ListFrom::Cache)
        .unwrap_err();
    assert!(
        matches!(e, super::watch::WatchError::PageTooLarge { .. }),
        "{e}"
    );
    assert_eq!(api.pages().last(), Some(&(0, 1)));
}

#[test]
fn only_the_annotations_the_check_reads_are_kept() {
    let mut p = pod("ns", "a", "u-a", NODE, &[]);
    let notes = &mut p["metadata"]["annotations"];
    notes[CONFIG_MIRROR] = "hash-1".into();
    notes[RdmaStrategy::HINT] = "{}".into();
    notes["kubectl.kubernetes.io/last-applied-configuration"] = "{\"big\": true}".into();
    let pod: Pod = serde_json::from_value(p.clone()).unwrap();
    let kept: Vec<&str> = pod
        .metadata
        .annotations
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(kept, [CONFIG_MIRROR, RdmaStrategy::HINT]);
    assert_eq!(pod.summary().mirror_of.as_deref(), Some("hash-1"));
    // `null`, or none at all, is no annotation.
    p["metadata"]["annotations"] = serde_json::Value::Null;
    let pod: Pod = serde_json::from_value(p.clone()).unwrap();
    assert!(pod.metadata.annotations.is_empty());
    p["metadata"].as_object_mut().unwrap().remove("annotations");
    let pod: Pod = serde_json::from_value(p).unwrap();
    assert!(pod.metadata.annotations.is_empty());
    // Not a map of strings where it matters: an error, as before.
    let bad = serde_json::json!({"metadata": {"annotations": {(CONFIG_MIRROR): 7}}});
    assert!(serde_json::from_value::<Pod>(bad).is_err());
    let skipped = serde_json::json!({"metadata": {"annotations": {"other": [1, {"a": null}]}}});
    assert!(serde_json::from_value::<Pod>(skipped).is_ok());
}
