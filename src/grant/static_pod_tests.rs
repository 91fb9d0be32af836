//! Static pods: refused while the check is on, found by the runtime's
//! `kubernetes.io/config.source` or through their mirror pod.
use super::*;

#[test]
fn static_pods_are_refused_by_source_or_by_their_mirror_pod() {
    let api = FakeApi::start().unwrap();
    // kubelet's mirror pod of static pod "hash-1": asks for a GPU, to no avail.
    let mut mirror = pod(
        "kube-system",
        "s-node-a",
        "u-mirror",
        NODE,
        &[("nvidia.com/gpu", "1")],
    );
    mirror["metadata"]["annotations"][model::CONFIG_MIRROR] = "hash-1".into();
    api.put_pod(mirror);
    api.put_pod(pod("ml", "p", "u-p", NODE, &[("nvidia.com/gpu", "1")]));
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    let ignore = Arc::new(Config {
        failure_policy: FailurePolicy::Ignore,
        grant_wait_ms: 100,
        ..Config::default()
    });
    let a = alloc(ONE_GPU);
    assert!(found(&checker, "u-p"));
    let by_mirror = checker
        .check(&ignore, id("kube-system", "s-node-a", "hash-1"), "c", &a)
        .unwrap_err();
    assert!(
        by_mirror
            .to_string()
            .contains("static pod (its mirror pod is kube-system/s-node-a)"),
        "{by_mirror}"
    );
    let file = PodIdentity {
        config_source: Some("file"),
        ..id("kube-system", "s-node-a", "hash-2")
    };
    let by_source = checker.check(&ignore, file, "c", &a).unwrap_err();
    assert!(
        by_source
            .to_string()
            .contains("kubernetes.io/config.source: file"),
        "{by_source}"
    );
    let api_pod = PodIdentity {
        config_source: Some("api"),
        ..id("ml", "p", "u-p")
    };
    checker
        .check(&ignore, api_pod, "c", &a)
        .expect("api pod granted");
    // With the check off, the annotation is trusted, static or not.
    let other = tempfile::tempdir().unwrap();
    GrantChecker::with_mode(Mode::Off, other.path())
        .check(&ignore, file, "c", &a)
        .expect("unchecked");
    drop(checker);
    let c = audit::read_counters(dir.path()).unwrap();
    assert_eq!(c.refused_by_reason["static_pod"], 2, "{c:?}");
}
