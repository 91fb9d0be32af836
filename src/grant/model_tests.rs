//! What a list page keeps of the pods it holds.

use serde_json::json;

use super::*;

/// A pod naming thousands of extended resources: its containers keep the
/// device resources only, and a page keeps a summary per unfinished pod,
/// never the pods themselves.
#[test]
fn a_list_page_keeps_summaries_and_device_resources_only() {
    let mut requests = serde_json::Map::new();
    for i in 0..2000 {
        requests.insert(format!("example.com/r{i}"), "0".into());
    }
    requests.insert("nvidia.com/gpu".into(), "1".into());
    let running = json!({
        "metadata": {"name": "a", "namespace": "ns", "uid": "u-a"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}]},
    });
    let pod: Pod = serde_json::from_value(running.clone()).unwrap();
    let kept = &pod.spec.containers[0].resources;
    assert_eq!(kept.requests.keys().collect::<Vec<_>>(), ["nvidia.com/gpu"]);
    assert_eq!(kept.limits.len(), 1);
    let page = json!({
        "metadata": {"resourceVersion": "7"},
        "items": [
            running,
            {"metadata": {"name": "b", "namespace": "ns", "uid": "u-b"}, "status": {"phase": "Succeeded"}},
        ],
    });
    let list: PodList = serde_json::from_value(page).unwrap();
    assert_eq!((list.items.count, list.items.pods.len()), (2, 1));
    let summary = &list.items.pods[0];
    assert_eq!(summary.uid, "u-a");
    assert_eq!(summary.request.as_ref().unwrap().gpu_core, 100);
    let empty: PodList = serde_json::from_value(json!({"items": null})).unwrap();
    assert_eq!(empty.items.count, 0);
}
