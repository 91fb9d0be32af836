//! The watch's thread: a list, then watches from its version, and the pauses
//! between failed requests (see the parent module's doc).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ListFrom, PodClient, WatchError};
use crate::grant::cache::PodCache;
use crate::grant::settings::{Endpoint, Mode};

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A watch ended by the server sooner than this with no event is taken as
/// refused rather than done (client-go's reflector: "very short watch"):
/// a proxy or server that closes each watch at once would otherwise be
/// asked again without a pause, as fast as the node can.
const SHORT_WATCH: Duration = Duration::from_secs(1);

/// The watch thread; dropping the handle asks it to stop at its next step.
pub struct PodWatch {
    stop: Arc<AtomicBool>,
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl PodWatch {
    /// Starts the list/watch loop on its own thread, filling `cache`.
    pub fn spawn(client: PodClient, cache: Arc<PodCache>) -> std::io::Result<PodWatch> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("devgate-pod-watch".into())
            .spawn(move || run(&client, &cache, &flag))?;
        Ok(PodWatch { stop })
    }
}

fn run(client: &PodClient, cache: &PodCache, stop: &AtomicBool) {
    let mut backoff = BACKOFF_MIN;
    let pause = |wait: Duration, backoff: &mut Duration| {
        std::thread::sleep(wait);
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
    };
    let mut from = ListFrom::Cache;
    // A list after a watch event skipped keeps the backoff grown: a watch
    // that fails so again after a list that works would otherwise list and
    // watch ten times a second.
    let mut skipped = false;
    while !stop.load(Ordering::Relaxed) {
        let mut version = match client.list(&from) {
            Ok((pods, version)) => {
                tracing::info!(pods = pods.len(), version = %version, "pod list loaded");
                cache.set_error(None);
                cache.replace_all(pods);
                if !std::mem::take(&mut skipped) {
                    backoff = BACKOFF_MIN;
                }
                version
            }
            Err(e) => {
                let wait = pause_after(backoff, Some(&e));
                tracing::warn!(error = %nri::ErrorChain(&e), retry_ms = wait.as_millis() as u64, "pod list failed");
                cache.set_error(Some(e.to_string()));
                // A version the cache cannot serve (410, or 504 "Too large
                // resource version" from a cache that lags it, after an etcd
                // restore; other 504s are timeouts): read from etcd, never
                // older than the cache was, as client-go's reflector does.
                let unservable =
                    matches!(e, WatchError::Status { code: 410, .. }) || e.too_large_version();
                if unservable {
                    from = ListFrom::Etcd;
                }
                pause(wait, &mut backoff);
                continue;
            }
        };
        let mut watches = 0;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let resumed_at = version.clone();
            watches += 1;
            match client.watch(&mut version, cache) {
                Ok(()) if started.elapsed() < SHORT_WATCH && version == resumed_at => {
                    let wait = pause_after(backoff, None);
                    tracing::warn!(version = %version, retry_ms = wait.as_millis() as u64, "watch ended at once with no event; resuming after a pause");
                    pause(wait, &mut backoff);
                }
                Ok(()) => {
                    tracing::debug!(version = %version, "watch ended; resuming");
                    backoff = BACKOFF_MIN;
                }
                Err(e @ WatchError::Gone { .. }) => {
                    tracing::info!(error = %nri::ErrorChain(&e), "watch expired; listing again");
                    from = ListFrom::NotOlderThan(version);
                    // Gone at the version just listed (API servers behind one
                    // address whose caches differ): not again at once.
                    if watches == 1 {
                        pause(pause_after(backoff, None), &mut backoff);
                    }
                    break;
                }
                // A watch cache that lags the version (after an etcd
                // restore) answers each watch from it so, for as long as it
                // lags: read from etcd and watch from what it gives, as
                // client-go's reflector does.
                Err(e) if e.too_large_version() => {
                    let wait = pause_after(backoff, None);
                    tracing::warn!(error = %nri::ErrorChain(&e), retry_ms = wait.as_millis() as u64, "pod watch from a version the server's cache lacks; listing from etcd");
                    from = ListFrom::Etcd;
                    pause(wait, &mut backoff);
                    break;
                }
                // Resuming from the same version would read the same event
                // again, for ever: the list has the pod without the event
                // (one too large), or fails steadily until the watch counts
                // as down (one that does not decode, from a server or proxy
                // that does not speak the API), where each resumed watch's
                // answer would keep it up. An ERROR event (a 500 from the
                // server's watch) lists again too, as client-go's reflector
                // does: its ListAndWatch returns on any error event, and the
                // next round lists.
                Err(
                    e @ (WatchError::EventTooLarge { .. }
                    | WatchError::Decode { .. }
                    | WatchError::ErrorEvent { .. }),
                ) => {
                    // A watch that served for a while before it failed so
                    // starts its pauses from the shortest, as below.
                    if started.elapsed() > BACKOFF_MAX {
                        backoff = BACKOFF_MIN;
                    }
                    let wait = pause_after(backoff, None);
                    tracing::warn!(error = %nri::ErrorChain(&e), retry_ms = wait.as_millis() as u64, "pod watch event skipped; listing again");
                    from = ListFrom::NotOlderThan(version);
                    skipped = true;
                    pause(wait, &mut backoff);
                    break;
                }
                Err(e) => {
                    if started.elapsed() > BACKOFF_MAX {
                        backoff = BACKOFF_MIN;
                    }
                    let wait = pause_after(backoff, Some(&e));
                    tracing::warn!(error = %nri::ErrorChain(&e), retry_ms = wait.as_millis() as u64, "pod watch failed");
                    cache.set_error(Some(e.to_string()));
                    pause(wait, &mut backoff);
                }
            }
        }
    }
}

/// The pause before the next request: between half and all of the backoff's
/// step; after a server said when to come back (429 from API Priority and
/// Fairness, 503 while it starts), no sooner than that, and spread over half
/// as long again, since it tells every node the same.
fn pause_after(backoff: Duration, told: Option<&WatchError>) -> Duration {
    let step = backoff / 2 + jitter(backoff / 2);
    match told.and_then(WatchError::retry_after) {
        Some(asked) if asked > step => asked + jitter(asked / 2),
        _ => step,
    }
}

/// A duration drawn evenly from zero to `most`, different in each process
/// and call (std's hasher keys are random per process and change with each
/// `RandomState`, and the clock is hashed too): enough to spread nodes apart,
/// with no generator to keep.
pub(in crate::grant) fn jitter(most: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    h.write_u128(now.unwrap_or_default().as_nanos());
    h.write_u64(std::process::id().into());
    let nanos = u64::try_from(most.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(h.finish() % nanos.saturating_add(1))
}

/// Starts the watch of `ep`: the mode is `Requests`, or `Unavailable` when the
/// watch cannot start.
pub(in crate::grant) fn start(ep: Endpoint, cache: &Arc<PodCache>) -> (Mode, Option<PodWatch>) {
    let started = PodClient::new(&ep)
        .map_err(|e| e.to_string())
        .and_then(|client| PodWatch::spawn(client, Arc::clone(cache)).map_err(|e| e.to_string()));
    match started {
        Ok(w) => {
            tracing::info!(api = %ep.base, node = %ep.node_name, "grant check: watching this node's pods");
            (Mode::Requests(ep), Some(w))
        }
        Err(reason) => {
            tracing::error!(api = %ep.base, error = %reason, "grant check: cannot start the pod watch");
            (
                Mode::Unavailable(format!("pod watch not started: {reason}")),
                None,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(secs: u64) -> WatchError {
        WatchError::Status {
            url: "u".into(),
            code: 429,
            message: String::new(),
            retry_after: Some(Duration::from_secs(secs)),
        }
    }

    /// The backoff's step, or the server's word spread over half as long
    /// again: nodes the same answer reached do not all come back at once.
    #[test]
    fn a_pause_is_the_step_or_the_servers_word_spread() {
        let step = Duration::from_millis(200);
        let mut after_word = Vec::new();
        for _ in 0..64 {
            let p = pause_after(step, None);
            assert!(p >= step / 2 && p <= step, "{p:?}");
            let p = pause_after(step, Some(&told(2)));
            assert!(
                p >= Duration::from_secs(2) && p <= Duration::from_secs(3),
                "{p:?}"
            );
            after_word.push(p);
            // A word shorter than the step leaves the step.
            let p = pause_after(Duration::from_secs(4), Some(&told(1)));
            assert!(
                p >= Duration::from_secs(2) && p <= Duration::from_secs(4),
                "{p:?}"
            );
        }
        assert!(after_word.iter().any(|p| *p != after_word[0]), "spread");
    }
}
