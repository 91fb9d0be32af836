//! The pod list: whole from the API server's cache, or page by page from
//! etcd where that is over the byte bound (see the parent module's doc).
//! A list after the first is asked no older than what the watch saw, as
//! client-go's reflector asks: an API server whose cache lags another's
//! (`resourceVersion=0` is any version) would take the cache back in time;
//! where the cache cannot serve that version, the list is read from etcd.

use std::io::BufReader;

use super::{percent_encode, PodClient, WatchError, MAX_LISTED, PAGE};
use crate::grant::cache::MAX_PODS;
use crate::grant::model::{PodList, PodSummary};

/// The most pages one list reads. A page filtered by the node's field
/// selector may hold no pod and still name a continuation (etcd reads
/// `limit` pods of the cluster, then the selector keeps this node's), so
/// pods alone do not bound a list of empty pages: 4096 pages of [`PAGE`]
/// read 163840 pods, past the 150000 of Kubernetes' largest tested clusters.
pub const MAX_PAGES: usize = 4096;

/// Where a list is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListFrom {
    /// The API server's cache, at any version (`resourceVersion=0`): the
    /// first list.
    Cache,
    /// The cache, no older than this version the watch saw
    /// (`resourceVersionMatch=NotOlderThan`): a list again.
    NotOlderThan(String),
    /// etcd, page by page, at its latest version (no `resourceVersion`): where
    /// the cache cannot serve the version, as client-go's reflector falls back.
    Etcd,
}

impl PodClient {
    /// Every pod of the node and the list's resourceVersion, read `from`;
    /// from the cache, page by page from etcd where it is over the byte bound
    /// (see the module doc).
    pub fn list(&self, from: &ListFrom) -> Result<(Vec<PodSummary>, String), WatchError> {
        let mut pods = Vec::new();
        let mut listed = 0;
        let mut pages = 0;
        let mut cont = String::new();
        // `None`: the cached list, which the API server does not page.
        let mut limit: Option<u32> = (*from == ListFrom::Etcd).then_some(PAGE);
        loop {
            let page = match self.page(limit, &cont, from) {
                Ok(page) => page,
                Err(e @ WatchError::PageTooLarge { .. }) if limit.is_none() && cont.is_empty() => {
                    tracing::warn!(error = %e, limit = PAGE, "grant check: the cached pod list is too large; listing from etcd page by page");
                    limit = Some(PAGE);
                    continue;
                }
                // A page over the byte bound (pods of several MiB each): the
                // same page again, half as long; one pod always fits.
                Err(e @ WatchError::PageTooLarge { .. }) if limit.is_some_and(|l| l > 1) => {
                    let shorter = limit.map(|l| l / 2);
                    tracing::warn!(error = %e, limit = shorter, "grant check: a pod list page asked for again shorter");
                    limit = shorter;
                    continue;
                }
                Err(e) => return Err(e),
            };
            listed += page.items.count;
            pods.extend(page.items.pods);
            // Pages of a bounded size, but a server that never ends the list
            // must not grow it without bound.
            pages += 1;
            if pods.len() > MAX_PODS || listed > MAX_LISTED || pages > MAX_PAGES {
                return Err(WatchError::TooManyPods {
                    url: format!("{}/api/v1/pods", self.base),
                });
            }
            if page.metadata.continue_token.is_empty() {
                return Ok((pods, page.metadata.resource_version));
            }
            cont = page.metadata.continue_token;
        }
    }

    /// One page of at most `limit` pods, from `cont` on (from etcd); with no
    /// limit, the list from the API server's cache as `from` says (a
    /// continue token goes without a version: the API server refuses both).
    fn page(&self, limit: Option<u32>, cont: &str, from: &ListFrom) -> Result<PodList, WatchError> {
        let mut query = match (limit, cont.is_empty(), from) {
            (Some(limit), ..) => format!("limit={limit}&"),
            (None, true, ListFrom::Cache) => "resourceVersion=0&".to_string(),
            (None, true, ListFrom::NotOlderThan(version)) => format!(
                "resourceVersion={}&resourceVersionMatch=NotOlderThan&",
                percent_encode(version)
            ),
            (None, ..) => String::new(),
        };
        if !cont.is_empty() {
            query.push_str("continue=");
            query.push_str(&percent_encode(cont));
        }
        let query = query.trim_end_matches('&');
        let (url, body) = self.get(query)?;
        let max = self.max_list_bytes;
        let reader = BufReader::new(body.into_with_config().limit(max).reader());
        serde_json::from_reader(reader).map_err(|source| {
            if !source.is_io() {
                return WatchError::Decode {
                    url,
                    what: "pod list",
                    source,
                };
            }
            // The body's reader failed: over the bound, or the connection.
            match ureq::Error::from(std::io::Error::from(source)) {
                ureq::Error::BodyExceedsLimit(_) => WatchError::PageTooLarge { url, max },
                other => WatchError::Http {
                    url,
                    source: Box::new(other),
                },
            }
        })
    }
}
