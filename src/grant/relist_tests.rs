//! Where a list again is read from: the cache, no older than what the watch
//! saw; etcd, where the cache cannot serve that version.
use super::fake_api::CACHED;
use super::*;

#[test]
fn a_list_again_is_no_older_than_the_watch_and_from_etcd_where_the_cache_lags() {
    let api = FakeApi::start().unwrap();
    api.put_pod(pod("ns", "a", "u-a", NODE, &[]));
    let dir = tempfile::tempdir().unwrap();
    let checker = watching(&dir, &api);
    assert!(found(&checker, "u-a"));
    // The watch expires and the cache lags the version it saw: 504 to a
    // list no older than it, after which the list comes from etcd, page by
    // page.
    assert!(api.wait_requests(LONG, watching_again));
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
