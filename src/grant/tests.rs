//! The grant check end to end in process: the watch against a fake API server
//! (list, watch, dropped connections, 410 Gone), and the checker's decisions.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::cache::Lookup;
use super::credentials::Secret;
use super::fake_api::{pod, FakeApi};
use super::*;
use crate::allocation::parse_allocation;

const NODE: &str = "node-a";
const LONG: Duration = Duration::from_secs(20);

fn endpoint(api: &FakeApi) -> Endpoint {
    api.endpoint(NODE)
}

fn found(checker: &GrantChecker, uid: &str) -> bool {
    matches!(checker.cache().wait_for(uid, LONG), Lookup::Found(_))
}

/// Polls until `uid` is gone from the cache.
fn gone(checker: &GrantChecker, uid: &str) -> bool {
    let deadline = Instant::now() + LONG;
    while Instant::now() < deadline {
        if matches!(
            checker.cache().wait_for(uid, Duration::ZERO),
            Lookup::Missing { .. }
        ) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn watching(state: &tempfile::TempDir, api: &FakeApi) -> GrantChecker {
    GrantChecker::with_mode(Mode::Requests(endpoint(api)), state.path())
}

#[test]
fn list_then_watch_fills_the_cache_with_this_nodes_pods_only() {
    let api = FakeApi::start().unwrap();
    api.put_pod(pod(
        "ns",
        "before",
        "u-before",
        NODE,
        &[("nvidia.com/gpu", "1")],
    ));
    api.put_pod(pod("ns", "elsewhere", "u-other", "node-b", &[]));
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    assert!(found(&checker, "u-before"));
    match checker.cache().wait_for("u-before", Duration::ZERO) {
        Lookup::Found(p) => {
            assert_eq!((p.namespace.as_str(), p.name.as_str()), ("ns", "before"));
            assert_eq!(p.request.as_ref().unwrap().gpu_core, 100);
            assert_eq!(p.containers.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    // Added after the list: arrives through the watch, resumed from the list's version.
    api.put_pod(pod(
        "ns",
        "after",
        "u-after",
        NODE,
        &[("koordinator.sh/rdma", "1")],
    ));
    assert!(found(&checker, "u-after"));
    assert!(api
        .requests()
        .iter()
        .any(|r| r == "watch 101" || r == "watch 102"));
    assert_eq!(
        checker.cache().len(),
        2,
        "the other node's pod is not cached"
    );
    api.delete_pod("u-before");
    assert!(gone(&checker, "u-before"));
}

/// Finished pods (Succeeded, Failed) stay bound to their node until the pod
/// garbage collector's threshold: more of them than the cache holds must not
/// make the list fail, which would refuse every running pod's devices.
#[test]
fn finished_pods_take_no_place_in_the_cache() {
    let api = FakeApi::start().unwrap();
    let finished = |mut p: serde_json::Value, phase: &str| {
        p["status"]["phase"] = phase.into();
        p
    };
    for i in 0..super::cache::MAX_PODS + 10 {
        let phase = if i % 2 == 0 { "Succeeded" } else { "Failed" };
        let p = pod(
            "jobs",
            &format!("done{i}"),
            &format!("u-done{i}"),
            NODE,
            &[],
        );
        api.put_pod(finished(p, phase));
    }
    let running = || pod("ns", "running", "u-run", NODE, &[("nvidia.com/gpu", "1")]);
    api.put_pod(running());
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    assert!(found(&checker, "u-run"));
    assert_eq!(checker.cache().len(), 1);
    assert!(gone(&checker, "u-done0"));
    // A pod that finishes while watched leaves the cache.
    api.put_pod(finished(running(), "Succeeded"));
    assert!(gone(&checker, "u-run"));
    assert_eq!(checker.cache().len(), 0);
}

#[test]
fn a_dropped_watch_resumes_from_the_last_version_without_relisting() {
    let api = FakeApi::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    api.put_pod(pod("ns", "a", "u-a", NODE, &[]));
    assert!(found(&checker, "u-a"));
    api.drop_watches();
    api.put_pod(pod("ns", "b", "u-b", NODE, &[]));
    assert!(found(&checker, "u-b"));
    let requests = api.requests();
    let lists = requests.iter().filter(|r| r.starts_with("list")).count();
    assert_eq!(lists, 1, "{requests:?}");
    // The second watch starts from the version of u-a's event, not from the list's.
    assert!(requests.iter().any(|r| r == "watch 101"), "{requests:?}");
}

#[test]
fn gone_relists_and_drops_pods_deleted_meanwhile() {
    let api = FakeApi::start().unwrap();
    api.put_pod(pod("ns", "a", "u-a", NODE, &[]));
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    assert!(found(&checker, "u-a"));
    // The API server loses its history while the watch is down: the resumed
    // watch gets 410 and the plugin lists again, seeing the deletion.
    api.compact();
    api.delete_pod("u-a");
    api.compact();
    api.put_pod(pod("ns", "b", "u-b", NODE, &[]));
    api.compact();
    api.drop_watches();
    assert!(found(&checker, "u-b"));
    assert!(gone(&checker, "u-a"));
    assert!(
        api.wait_requests(LONG, |r| r.iter().filter(|x| x.starts_with("list")).count()
            >= 2)
    );
    // The list again is no older than what the watch saw.
    let requests = api.requests();
    let relist = requests.iter().filter(|r| r.starts_with("list")).nth(1);
    assert!(
        relist.is_some_and(|r| r.starts_with(&format!("list {NODE} since "))),
        "{requests:?}"
    );
    // An ERROR event with 410 in an open watch does the same.
    assert!(api.wait_requests(LONG, watching_again));
    api.expire_watches();
    assert!(
        api.wait_requests(LONG, |r| r.iter().filter(|x| x.starts_with("list")).count()
            >= 3)
    );
}

/// An event beyond the size read from a watch (a pod fat with escaped
/// characters): the plugin lists again instead of resuming at that event for
/// ever, and the list brings the pod.
#[test]
fn an_event_too_large_for_the_watch_is_read_from_a_new_list() {
    let api = FakeApi::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    api.put_pod(pod("ns", "a", "u-a", NODE, &[]));
    assert!(found(&checker, "u-a"));
    let mut fat = pod("ns", "fat", "u-fat", NODE, &[]);
    let filler = "x".repeat(watch::MAX_EVENT_BYTES as usize + 1);
    fat["metadata"]["annotations"] = serde_json::json!({ "filler": filler });
    api.put_pod(fat);
    assert!(found(&checker, "u-fat"));
    let requests = api.requests();
    let lists = requests.iter().filter(|r| r.starts_with("list")).count();
    assert_eq!(lists, 2, "{requests:?}");
}

#[test]
fn an_unreachable_api_server_is_retried_until_it_answers() {
    // Reserve a port, then free it: nothing listens there at first.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let ep = Endpoint {
        base: format!("http://127.0.0.1:{port}"),
        token: None,
        ca: None,
        client: None,
        node_name: NODE.into(),
        watch_timeout_secs: 30,
    };
    let checker = GrantChecker::with_mode(Mode::Requests(ep), dir.path());
    assert!(matches!(
        checker.cache().wait_for("x", Duration::from_millis(300)),
        Lookup::Missing { synced: false, .. }
    ));
    // The refusal says why the pod is unknown.
    let deadline = Instant::now() + LONG;
    while checker.cache().last_error().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let config = Arc::new(Config {
        grant_wait_ms: 300,
        ..Config::default()
    });
    // Failing for long enough to be down.
    checker.cache().failing_for(super::cache::DOWN_AFTER);
    let e = checker
        .check(&config, id("ns", "p", "x"), "c", &alloc(ONE_GPU))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("(the pod list has not loaded yet: request http://127.0.0.1"),
        "{e}"
    );
    // Down: no lookup waits.
    assert!(
        e.contains("on the api server (the pod list has not loaded yet: "),
        "{e}"
    );
    assert!(e.contains("(not waited for: the watch is down)"), "{e}");
    assert!(
        e.ends_with(&format!("(pods listed for node {NODE})")),
        "{e}"
    );
    assert_eq!(
        checker.cache().wait_for("x", LONG),
        Lookup::Missing {
            synced: false,
            down: true
        }
    );
}

fn alloc(text: &str) -> Allocation {
    parse_allocation(text.as_bytes()).unwrap()
}

const ONE_GPU: &str = r#"{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;

fn id<'a>(ns: &'a str, name: &'a str, uid: &'a str) -> PodIdentity<'a> {
    PodIdentity {
        namespace: ns,
        name,
        uid,
        config_source: None,
    }
}

#[path = "decision_tests.rs"]
mod decisions;

#[path = "static_pod_tests.rs"]
mod static_pods;

#[path = "late_tests.rs"]
mod late;

#[path = "last_tests.rs"]
mod last_tests;

/// Pauses and watch timeouts are spread: drawn within their bounds, and not
/// all the same.
#[test]
fn jitter_stays_within_its_bound_and_varies() {
    let most = Duration::from_secs(240);
    let drawn: Vec<Duration> = (0..64).map(|_| super::watch::jitter(most)).collect();
    assert!(drawn.iter().all(|d| *d <= most), "{drawn:?}");
    let first = drawn[0];
    assert!(drawn.iter().any(|d| *d != first), "{drawn:?}");
    assert!(drawn.iter().any(|d| *d < most / 2), "{drawn:?}");
    assert!(drawn.iter().any(|d| *d > most / 2), "{drawn:?}");
    assert_eq!(super::watch::jitter(Duration::ZERO), Duration::ZERO);
}

#[path = "held_tests.rs"]
mod held_tests;

#[path = "relist_tests.rs"]
mod relist_tests;

/// Whether the last request is a watch: one is open (or being answered 410).
fn watching_again(requests: &[String]) -> bool {
    requests.last().is_some_and(|r| r.starts_with("watch"))
}
