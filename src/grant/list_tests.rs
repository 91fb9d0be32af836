//! What a pod list costs the plugin: the API server leaves out the node's
//! finished pods, and of a listed pod's annotations only those the check
//! reads are kept.
use std::time::Duration;

use super::cache::Lookup;
use super::fake_api::{pod, FakeApi};
use super::model::{Pod, CONFIG_MIRROR};
use super::request::RdmaStrategy;
use super::settings::{Endpoint, Mode};
use super::GrantChecker;

const NODE: &str = "node-a";

/// Finished pods whose specs together exceed a list page's byte bound (Argo
/// workflow pods carry large template annotations; kubelet keeps a node's
/// finished pods until the garbage collector's threshold): the list asks the
/// API server to leave them out, and the running pod is found.
#[test]
fn finished_pods_are_not_listed_at_all() {
    let api = FakeApi::start().unwrap();
    let big = "x".repeat(256 * 1024);
    let pods = super::watch::MAX_LIST_BYTES as usize / big.len() + 16;
    for i in 0..pods {
        let mut p = pod(
            "jobs",
            &format!("done{i}"),
            &format!("u-done{i}"),
            NODE,
            &[],
        );
        p["metadata"]["annotations"]["workflows.argoproj.io/template"] = big.as_str().into();
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
    let dir = tempfile::tempdir().unwrap();
    let ep = Endpoint {
        base: api.url().to_string(),
        token: None,
        ca: None,
        client: None,
        node_name: NODE.to_string(),
        watch_timeout_secs: 30,
    };
    let checker = GrantChecker::with_mode(Mode::Requests(ep), dir.path());
    let found = checker.cache().wait_for("u-run", Duration::from_secs(20));
    assert!(matches!(found, Lookup::Found(_)), "{found:?}");
    assert_eq!(checker.cache().len(), 1);
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

/// Running pods of several MiB each (a page of them over the byte bound):
/// the page is asked for again half as long until it fits, and every pod is
/// found.
#[test]
fn a_page_too_large_is_asked_for_again_shorter() {
    let api = FakeApi::start().unwrap();
    let big = "x".repeat(6 << 20);
    let pods = super::watch::MAX_LIST_BYTES as usize / big.len() + 1;
    for i in 0..pods {
        let mut p = pod(
            "ns",
            &format!("big{i:02}"),
            &format!("u-big{i:02}"),
            NODE,
            &[],
        );
        p["metadata"]["annotations"]["large"] = big.as_str().into();
        api.put_pod(p);
    }
    let dir = tempfile::tempdir().unwrap();
    let ep = Endpoint {
        base: api.url().to_string(),
        token: None,
        ca: None,
        client: None,
        node_name: NODE.to_string(),
        watch_timeout_secs: 30,
    };
    let checker = GrantChecker::with_mode(Mode::Requests(ep), dir.path());
    let last = format!("u-big{:02}", pods - 1);
    let found = checker.cache().wait_for(&last, Duration::from_secs(20));
    assert!(matches!(found, Lookup::Found(_)), "{found:?}");
    assert_eq!(checker.cache().len(), pods);
    assert_eq!(api.pages(), [(0, 40), (0, 20), (0, 10), (10, 10)]);
}
