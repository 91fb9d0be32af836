//! One structured log line per grant decision and counters that `devgate status`
//! (another process) reads from the state directory.
//!
//! The log line is the record of each decision, one per decision: a container
//! kubelet restarts has its line again at each start. Refusals are logged as
//! they are made. A decision that lets a
//! container through is logged by the counters' writer, with the time it was
//! made (`decided`), together with the counters' write: formatting and writing
//! the line cost a pod's first container about 30 µs of its creation with
//! caches cold (see `audit_line`). Lines still follow the order of their
//! decisions: a line logged at once (a refusal, a line the full queue does
//! not take) first logs the lines of earlier decisions still
//! waiting, after any the writer is logging.
//! The counters are diagnostics: a small JSON file that a background thread
//! replaces atomically, at most once per [`FLUSH_INTERVAL`], never sooner than
//! [`SETTLE`] after the decision that woke it (its container's creation is
//! still being answered then), and once more when the plugin stops. So
//! CreateContainer never waits on the file or the line nor shares a CPU with
//! their writes, whether the check is on or off (with `grant_check = "off"`
//! every annotated container is still counted, as `unchecked`), and a burst
//! of containers costs one write.
//! Another process (`devgate status`) sees a decision within the interval, and
//! a refusal (with every count before it) by the time its container's error
//! is returned; a plugin killed outright loses at most the last interval's
//! counts and lines of let-through decisions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::audit_line::{log_now, Line, PendingLine, MAX_PENDING};
use crate::fsutil;

/// File of the counters in the state directory.
pub const COUNTERS_FILE: &str = "grant-audit.json";
/// The counters file is a few hundred bytes; anything far larger is not ours.
const MAX_COUNTERS_BYTES: u64 = 64 * 1024;
/// Longest reason kept for `last_refusal`.
const MAX_REASON: usize = 512;
/// Least time between two writes of the counters file.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
/// How long after the decision that woke it the writer waits before it writes.
const SETTLE: Duration = Duration::from_millis(100);

/// What the grant check decided for one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The allocation matches the pod's requests.
    Granted,
    /// `grant_check = "off"`: applied as the annotation says.
    Unchecked,
    /// Not verified (no cache entry, no API server) but let through by
    /// `failure_policy = "ignore"`.
    Unverified,
    /// Refused; the kind names the rule.
    Refused(RefusalKind),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    Mismatch,
    Namespace,
    UnknownPod,
    BadRequest,
    Unavailable,
    StaticPod,
}

impl RefusalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalKind::Mismatch => "mismatch",
            RefusalKind::Namespace => "namespace",
            RefusalKind::UnknownPod => "unknown_pod",
            RefusalKind::BadRequest => "bad_request",
            RefusalKind::Unavailable => "api_unavailable",
            RefusalKind::StaticPod => "static_pod",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LastRefusal {
    pub pod: String,
    pub container: String,
    pub reason: String,
    pub unix: u64,
}

/// Totals since the state directory was created (it is a tmpfs: since boot).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GrantCounters {
    pub granted: u64,
    pub unchecked: u64,
    pub unverified: u64,
    pub refused: u64,
    pub refused_by_reason: BTreeMap<String, u64>,
    pub last_refusal: Option<LastRefusal>,
}

/// One decision, for the log line and the counters.
pub struct Decision<'a> {
    pub pod: &'a str,
    pub uid: &'a str,
    pub container: &'a str,
    pub devices: &'a str,
    pub outcome: Outcome,
    pub reason: &'a str,
}

#[derive(Default)]
struct State {
    counters: GrantCounters,
    /// Counted since the last write.
    dirty: bool,
    /// The flusher waits for the next count (not resting between writes): only
    /// then is it worth waking. Waking it for every count would cost every
    /// container creation two context switches.
    waiting: bool,
    stop: bool,
    /// Lines of decisions counted since the last write, for the writer to log.
    pending: Vec<PendingLine>,
}

struct Shared {
    path: PathBuf,
    state: Mutex<State>,
    wake: Condvar,
    /// Held from a snapshot to its rename: a flush at exit waits for a write
    /// the flusher has under way, which `dirty` no longer shows.
    writing: Mutex<()>,
    /// Held from taking lines off the queue until they are logged, by the
    /// writer and by a decision logged at once: the log keeps the order of
    /// the decisions. Taken after `writing`, before `state`, never with
    /// `state` held.
    logging: Mutex<()>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs the lines and writes the counters of the decisions counted
    /// since the last write, if any.
    fn write_if_dirty(&self) {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let logging = self.logging.lock().unwrap_or_else(PoisonError::into_inner);
        let (lines, bytes) = {
            let mut s = self.lock();
            if !s.dirty {
                return;
            }
            s.dirty = false;
            let lines = std::mem::take(&mut s.pending);
            (lines, serde_json::to_vec(&s.counters).unwrap_or_default())
        };
        lines.iter().for_each(PendingLine::log);
        drop(logging);
        // Counters are diagnostics: a failed write is logged, never fails a
        // container. No lock is shared with another plugin writing the same
        // file (one draining beside its successor): a temporary name of this
        // process's own, so that neither renames a file both wrote into.
        if let Err(e) = fsutil::replace_file_mode(&self.path, &bytes, 0o600) {
            tracing::warn!(path = %self.path.display(), error = %nri::ErrorChain(&e), "write grant counters");
        }
    }

    /// The flusher: waits for a decision, writes, then rests an interval.
    fn run(&self) {
        loop {
            {
                let mut s = self.lock();
                let mut woken = false;
                while !s.dirty && !s.stop {
                    s.waiting = true;
                    s = self.wake.wait(s).unwrap_or_else(PoisonError::into_inner);
                    woken = true;
                }
                s.waiting = false;
                // A decision that woke the writer is a container's creation
                // under way: let it answer first, so that the write does not
                // take a CPU from it.
                if woken && !s.stop {
                    drop(
                        self.wake
                            .wait_timeout_while(s, SETTLE, |s| !s.stop)
                            .unwrap_or_else(PoisonError::into_inner),
                    );
                }
            }
            self.write_if_dirty();
            let s = self.lock();
            if s.stop {
                return;
            }
            let (s, _) = self
                .wake
                .wait_timeout_while(s, FLUSH_INTERVAL, |s| !s.stop)
                .unwrap_or_else(PoisonError::into_inner);
            if s.stop {
                drop(s);
                self.write_if_dirty();
                return;
            }
        }
    }
}

pub struct Audit {
    shared: Arc<Shared>,
    /// None when the thread could not start: then each decision writes.
    flusher: Option<JoinHandle<()>>,
}

impl Audit {
    /// Continues the counters found in `state_dir`; unreadable ones start over.
    pub fn open(state_dir: &Path) -> Audit {
        let path = state_dir.join(COUNTERS_FILE);
        let counters = match read_counters(state_dir) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %nri::ErrorChain(&e), "grant counters unreadable; starting from zero");
                GrantCounters::default()
            }
        };
        let shared = Arc::new(Shared {
            path,
            state: Mutex::new(State {
                counters,
                ..State::default()
            }),
            wake: Condvar::new(),
            writing: Mutex::new(()),
            logging: Mutex::new(()),
        });
        let worker = Arc::clone(&shared);
        // The writer logs where its creator does (the global subscriber in
        // the plugin, a test's own one in tests).
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let flusher = std::thread::Builder::new()
            .name("devgate-grant-audit".into())
            .spawn(move || tracing::dispatcher::with_default(&dispatch, || worker.run()))
            .map_err(|e| tracing::warn!(error = %nri::ErrorChain(&e), "grant counters: no flush thread; writing each decision"))
            .ok();
        Audit { shared, flusher }
    }

    /// Counts the decision and logs it. A refusal's counts are written before
    /// it returns: the refused container's error is what sends an operator to
    /// `devgate status`, which must already count it. Refusals are rare and
    /// off the path of a container that starts.
    pub fn record(&self, d: &Decision<'_>) {
        let (line, earlier) = self.count(d);
        if let Some(earlier) = earlier {
            let _logging = self
                .shared
                .logging
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            earlier.iter().for_each(PendingLine::log);
            log_now(d, line);
        }
        if self.flusher.is_none() || matches!(d.outcome, Outcome::Refused(_)) {
            self.shared.write_if_dirty();
        }
    }

    /// Counts a decision, wakes the flusher, and says how to log it; for a
    /// line logged now, also the waiting lines of earlier decisions, taken off
    /// the queue to be logged before it.
    fn count(&self, d: &Decision<'_>) -> (Line, Option<Vec<PendingLine>>) {
        let mut s = self.shared.lock();
        // Every decision has its line, a container's repeated one too (the
        // issue's contract: every grant and refusal).
        let line = Line::Logged;
        // Refusals are logged as they are made; without a writer, or with
        // too many lines waiting for it, so is every decision.
        let line = match line {
            Line::Logged
                if !matches!(d.outcome, Outcome::Refused(_))
                    && self.flusher.is_some()
                    && s.pending.len() < MAX_PENDING =>
            {
                s.pending.push(PendingLine::new(d));
                Line::Deferred
            }
            other => other,
        };
        {
            let c = &mut s.counters;
            match d.outcome {
                Outcome::Granted => c.granted += 1,
                Outcome::Unchecked => c.unchecked += 1,
                Outcome::Unverified => c.unverified += 1,
                Outcome::Refused(kind) => {
                    c.refused += 1;
                    *c.refused_by_reason
                        .entry(kind.as_str().to_string())
                        .or_default() += 1;
                    c.last_refusal = Some(LastRefusal {
                        pod: d.pod.to_string(),
                        container: d.container.to_string(),
                        reason: d.reason.chars().take(MAX_REASON).collect(),
                        unix: crate::ledger::now_unix(),
                    });
                }
            }
            s.dirty = true;
            // A refusal's counters are written by `record` itself: woken for
            // it, the writer would settle from the refusal and write a
            // decision that comes just after it sooner than SETTLE, inside
            // that decision's creation.
            let refused = matches!(d.outcome, Outcome::Refused(_));
            if self.flusher.is_some() && s.waiting && !refused {
                self.shared.wake.notify_all();
            }
        }
        let now = line == Line::Logged;
        (line, now.then(|| std::mem::take(&mut s.pending)))
    }

    /// Writes what was counted and not yet written, now.
    pub fn flush(&self) {
        self.shared.write_if_dirty();
    }

    pub fn counters(&self) -> GrantCounters {
        self.shared.lock().counters.clone()
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.flusher.take() {
            let _ = t.join();
        }
        self.shared.write_if_dirty();
    }
}

#[path = "audit_read.rs"]
mod read;
pub use read::{read_counters, table, AuditError};

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;
