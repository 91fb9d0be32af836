//! The grant check's watch reaches the API server directly: proxy variables
//! in the plugin's environment (injected into a DaemonSet, or a systemd
//! `DefaultEnvironment`) are not for it. Its own process, since the variables
//! are process-wide.
use std::time::Duration;

use devgate::grant::cache::Lookup;
use devgate::grant::fake_api::{pod, FakeApi};
use devgate::grant::{GrantChecker, Mode};

#[test]
fn proxy_variables_do_not_divert_the_watch() {
    // Nothing listens on the discard port: a request sent there fails.
    for var in [
        "ALL_PROXY",
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "all_proxy",
        "https_proxy",
        "http_proxy",
    ] {
        // Set before this process starts any other thread.
        std::env::set_var(var, "http://127.0.0.1:9");
    }
    // No exception for the fake API server's address.
    for var in ["NO_PROXY", "no_proxy"] {
        std::env::remove_var(var);
    }
    let api = FakeApi::start().unwrap();
    api.put_pod(pod("ns", "a", "u-a", "node-a", &[("nvidia.com/gpu", "1")]));
    let dir = tempfile::tempdir().unwrap();
    let checker = GrantChecker::with_mode(Mode::Requests(api.endpoint("node-a")), dir.path());
    let found = checker.cache().wait_for("u-a", Duration::from_secs(10));
    assert!(matches!(found, Lookup::Found(_)), "{found:?}");
}
