//! Where a list again is read from: the cache, no older than what the watch
//! saw; etcd, where the cache cannot serve that version. When it is asked
//! again: no sooner than a server that throttled it said.
use super::fake_api::CACHED;
use super::watch::{retry_after, WatchError};
use super::*;

/// A fake API server holding pod `a`, and a checker that listed it and
/// watches again.
fn watching_pod_a() -> (FakeApi, tempfile::TempDir, GrantChecker) {
    let api = FakeApi::start().unwrap();
    api.put_pod(pod("ns", "a", "u-a", NODE, &[]));
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    assert!(found(&checker, "u-a"));
    assert!(api.wait_requests(LONG, watching_again));
    (api, dir, checker)
}

#[test]
fn a_list_again_is_no_older_than_the_watch_and_from_etcd_where_the_cache_lags() {
    let (api, _dir, _checker) = watching_pod_a();
    // The watch expires and the cache lags the version it saw: 504 to a
    // list no older than it, after which the list comes from etcd, page by
    // page.
    api.lag_cache();
    api.expire_watches();
    let lists = |r: &[String]| r.iter().filter(|x| x.starts_with("list")).count();
    assert!(api.wait_requests(LONG, |r| lists(r) >= 3));
    let requests = api.requests();
    let lists: Vec<&String> = requests.iter().filter(|r| r.starts_with("list")).collect();
    assert_eq!(lists[0], &format!("list {NODE}"), "{requests:?}");
    assert!(
        lists[1].starts_with(&format!("list {NODE} since ")),
        "{requests:?}"
    );
    assert_eq!(lists[2], &format!("list {NODE}"), "{requests:?}");
    let pages = api.pages();
    assert_eq!(
        pages[..2],
        [(0, CACHED), (0, 40)],
        "the first from the cache, then from etcd"
    );
}

/// API Priority and Fairness refuses a flow over its share with 429 and
/// `Retry-After`: each list after such a refusal waits what the server said,
/// not the 50-100 ms of the first steps of the backoff.
#[test]
fn a_throttled_list_is_asked_again_no_sooner_than_the_server_said() {
    // 429 from API Priority and Fairness, twice; 503 from a starting server.
    for (code, refusals) in [(429, 2), (503, 1)] {
        let api = FakeApi::start().unwrap();
        api.put_pod(pod("ns", "a", "u-a", NODE, &[]));
        api.throttle(code, refusals, 1);
        let dir = tempfile::tempdir().unwrap();
        let began = Instant::now();
        let checker = watching(&dir, &api);
        assert!(found(&checker, "u-a"));
        assert!(
            began.elapsed() >= Duration::from_secs(refusals as u64),
            "{code}: {refusals} refusals, a second each: {:?}",
            began.elapsed()
        );
        let requests = api.requests();
        let lists = requests.iter().filter(|r| r.starts_with("list")).count();
        assert_eq!(lists, refusals + 1, "{code}: {requests:?}");
    }
}

#[test]
fn retry_after_is_read_in_seconds_and_bounded() {
    let header = |v: &str| ureq::http::HeaderValue::from_str(v).unwrap();
    let cases: &[(&str, Option<u64>)] = &[
        ("1", Some(1)),
        (" 7 ", Some(7)),
        ("0", Some(0)),
        ("-1", None),
        ("1.5", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        ("", None),
    ];
    for (text, want) in cases {
        let got = retry_after(Some(&header(text)));
        assert_eq!(got, want.map(Duration::from_secs), "{text:?}");
    }
    assert_eq!(retry_after(None), None);
    let told = |secs| WatchError::Status {
        url: "u".into(),
        code: 429,
        message: String::new(),
        retry_after: Some(Duration::from_secs(secs)),
    };
    assert_eq!(told(3).retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(
        told(86_400).retry_after(),
        Some(Duration::from_secs(60)),
        "a day is asked again after a minute"
    );
}

/// A watch cache that lags the version a watch resumes from answers the
/// watch 504 "Too large resource version" for as long as it lags: the watch
/// lists from etcd then, instead of asking the same version again and again
/// with the cache frozen.
#[test]
fn a_watch_from_a_version_the_cache_lags_lists_from_etcd() {
    let (api, _dir, checker) = watching_pod_a();
    api.lag_watches(1);
    api.drop_watches();
    let lists = |r: &[String]| r.iter().filter(|x| x.starts_with("list")).count();
    assert!(
        api.wait_requests(LONG, |r| lists(r) >= 2),
        "{:?}",
        api.requests()
    );
    assert_eq!(
        api.pages().last(),
        Some(&(0, 40)),
        "from etcd, page by page"
    );
    api.put_pod(pod("ns", "b", "u-b", NODE, &[]));
    assert!(found(&checker, "u-b"));
}

/// A watch event that does not decode (from a server or proxy that does not
/// speak the API) is not read again from the same version for ever, each
/// resumed watch keeping the watch up: the pods are listed again, and while
/// that list fails too the watch counts as down, so that lookups stop
/// waiting.
#[test]
fn a_watch_event_that_does_not_decode_lists_again() {
    let (api, _dir, checker) = watching_pod_a();
    let mut odd = pod("ns", "odd", "u-odd", NODE, &[]);
    odd["status"]["phase"] = serde_json::json!(5);
    api.put_pod(odd);
    let lists = |r: &[String]| r.iter().filter(|x| x.starts_with("list")).count();
    assert!(
        api.wait_requests(LONG, |r| lists(r) >= 2),
        "{:?}",
        api.requests()
    );
    let deadline = std::time::Instant::now() + LONG;
    while !matches!(
        checker.cache().wait_for("u-none", Duration::ZERO),
        Lookup::Missing { down: true, .. }
    ) {
        assert!(std::time::Instant::now() < deadline, "never down");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An ERROR event other than 410 (a server whose own watch of etcd fails
/// answers every watch so) is not resumed from the same version for ever,
/// the cache frozen while each resumed watch's answer keeps it up: the pods
/// are listed again, as client-go's reflector does, so a pod bound since is
/// found.
#[test]
fn a_watch_error_event_lists_again() {
    let (api, _dir, checker) = watching_pod_a();
    api.fail_watches(500);
    api.put_pod(pod("ns", "b", "u-b", NODE, &[]));
    assert!(found(&checker, "u-b"), "{:?}", api.requests());
    let lists = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("list"))
        .count();
    assert!(lists >= 2, "{:?}", api.requests());
}
