//! The kept decision (`last.rs`): a pod's further containers take it, counted
//! as decisions of their own; nothing else does.
use super::*;

const TWO_GPUS: &str = r#"{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}},{"minor":3,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;

fn counters(checker: GrantChecker, dir: &tempfile::TempDir) -> audit::GrantCounters {
    drop(checker);
    audit::read_counters(dir.path()).unwrap()
}

/// A checker that watches an api server holding pod ml/p (uid u-p), which
/// requests one GPU, and a config that waits 100 ms for a pod.
fn watching_a_gpu_pod() -> (FakeApi, tempfile::TempDir, GrantChecker, Arc<Config>) {
    let api = FakeApi::start().unwrap();
    api.put_pod(pod("ml", "p", "u-p", NODE, &[("nvidia.com/gpu", "1")]));
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    let config = Arc::new(Config {
        grant_wait_ms: 100,
        ..Config::default()
    });
    assert!(found(&checker, "u-p"));
    (api, dir, checker, config)
}

#[test]
fn further_containers_of_a_granted_pod_are_granted_and_counted() {
    let (api, dir, checker, config) = watching_a_gpu_pod();
    let a = alloc(ONE_GPU);
    checker
        .check(&config, id("ml", "p", "u-p"), "main", &a)
        .unwrap();
    // The pod's requests are immutable for device resources: once granted,
    // its further containers (a sidecar, a restart) need no lookup, and a
    // watch that dropped the pod meanwhile does not refuse them.
    api.delete_pod("u-p");
    assert!(gone(&checker, "u-p"));
    checker
        .check(&config, id("ml", "p", "u-p"), "side", &a)
        .unwrap();
    checker
        .check(&config, id("ml", "p", "u-p"), "main", &a)
        .unwrap();
    let c = counters(checker, &dir);
    assert_eq!((c.granted, c.refused), (3, 0), "{c:?}");
}

#[test]
fn a_kept_decision_serves_only_the_same_pod_allocation_and_config() {
    let (_api, dir, checker, config) = watching_a_gpu_pod();
    let a = alloc(ONE_GPU);
    checker
        .check(&config, id("ml", "p", "u-p"), "c", &a)
        .unwrap();
    // More than the pod requests: decided again, and refused.
    let e = checker
        .check(&config, id("ml", "p", "u-p"), "c", &alloc(TWO_GPUS))
        .unwrap_err();
    assert!(
        e.to_string().contains("more than its containers request"),
        "{e}"
    );
    checker
        .check(&config, id("ml", "p", "u-p"), "c", &a)
        .unwrap();
    // The same allocation on another pod (uid), or under another name.
    let e = checker
        .check(&config, id("ml", "p", "u-other"), "c", &a)
        .unwrap_err();
    assert!(e.to_string().contains("u-other"), "{e}");
    checker
        .check(&config, id("ml", "p", "u-p"), "c", &a)
        .unwrap();
    // The api server has the pod by uid: the same uid under another name is
    // decided again (and logged under that name).
    checker
        .check(&config, id("other-ns", "p", "u-p"), "c", &a)
        .unwrap();
    // A new config (a reload) is a new decision: its namespace rule applies.
    let denying = Arc::new(Config {
        denied_namespaces: vec!["ml".into()],
        ..(*config).clone()
    });
    let e = checker
        .check(&denying, id("ml", "p", "u-p"), "c", &a)
        .unwrap_err();
    assert!(e.to_string().contains("denied_namespaces"), "{e}");
    // A static pod's source is part of the decision.
    checker
        .check(&config, id("ml", "p", "u-p"), "c", &a)
        .unwrap();
    let file = PodIdentity {
        config_source: Some("file"),
        ..id("ml", "p", "u-p")
    };
    assert!(checker.check(&config, file, "c", &a).is_err());
    let c = counters(checker, &dir);
    assert_eq!((c.granted, c.refused), (5, 4), "{c:?}");
}

#[test]
fn an_unverified_pod_is_checked_again_once_the_api_server_has_it() {
    let api = FakeApi::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    let ignore = Arc::new(Config {
        grant_wait_ms: 50,
        failure_policy: FailurePolicy::Ignore,
        ..Config::default()
    });
    let a = alloc(ONE_GPU);
    checker
        .check(&ignore, id("ml", "late", "u-late"), "c", &a)
        .expect("unverified under ignore");
    // It turns out to request no GPU: its next container is refused.
    api.put_pod(pod("ml", "late", "u-late", NODE, &[("cpu", "1")]));
    assert!(found(&checker, "u-late"));
    let e = checker
        .check(&ignore, id("ml", "late", "u-late"), "c", &a)
        .unwrap_err();
    assert!(
        e.to_string().contains("more than its containers request"),
        "{e}"
    );
    let c = counters(checker, &dir);
    assert_eq!((c.unverified, c.refused), (1, 1), "{c:?}");
}

#[test]
fn with_the_check_off_a_new_config_is_decided_again() {
    let dir = tempfile::tempdir().unwrap();
    let off = GrantChecker::with_mode(Mode::Off, dir.path());
    let a = alloc(ONE_GPU);
    let open = Arc::new(Config::default());
    off.check(&open, id("ml", "p", "u"), "c", &a).unwrap();
    off.check(&open, id("ml", "p", "u"), "d", &a).unwrap();
    let allowed_elsewhere = Arc::new(Config {
        allowed_namespaces: vec!["web".into()],
        ..Config::default()
    });
    let e = off
        .check(&allowed_elsewhere, id("ml", "p", "u"), "c", &a)
        .unwrap_err();
    assert!(e.to_string().contains("not in allowed_namespaces"), "{e}");
    let c = counters(off, &dir);
    assert_eq!((c.unchecked, c.refused), (2, 1), "{c:?}");
}

/// A sandbox's start decides ahead of its containers without logging or
/// counting; its first container takes the decision and counts it, even once
/// the watch has dropped the pod. A pod the cache lacks is not waited for.
#[test]
fn a_decision_ahead_is_kept_for_the_first_container_and_counted_by_it() {
    let (api, dir, checker, config) = watching_a_gpu_pod();
    let a = alloc(ONE_GPU);
    assert!(checker.check_ahead(&config, id("ml", "p", "u-p"), &a));
    assert_eq!(checker.counters(), audit::GrantCounters::default());
    api.delete_pod("u-p");
    assert!(gone(&checker, "u-p"));
    checker
        .check(&config, id("ml", "p", "u-p"), "main", &a)
        .unwrap();

    // Not in the cache, or more than requested: nothing kept, nothing counted.
    assert!(!checker.check_ahead(&config, id("ml", "q", "u-q"), &a));
    api.put_pod(pod("ml", "r", "u-r", NODE, &[("nvidia.com/gpu", "1")]));
    assert!(found(&checker, "u-r"));
    assert!(!checker.check_ahead(&config, id("ml", "r", "u-r"), &alloc(TWO_GPUS)));
    let c = counters(checker, &dir);
    assert_eq!((c.granted, c.refused), (1, 0), "{c:?}");
}
