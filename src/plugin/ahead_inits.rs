//! Sandboxes claimed at their start that no container has joined yet, with
//! their init process.
//!
//! A sandbox can end with no event the plugin sees: its init dies before
//! kubelet stops it, or a runtime sends nothing after a start an NRI plugin
//! called after devgate refused (containerd's CRI plugin does send
//! StopPodSandbox and RemovePodSandbox then, in its NRI `RunPodSandbox`, and
//! they release the claim). Its claim goes when the pod's next sandbox starts
//! (`release_superseded`), but a pod deleted before kubelet starts another
//! never supersedes it, and its devices would stay held, refusing every pod
//! the scheduler gives them to, until the next Synchronize. The sandbox's init (the pause process; containerd reports its
//! pid in RunPodSandbox, the task being made before the NRI call) ends with
//! the sandbox: once it has certainly exited with still no container
//! recorded, the claim is released. No container joins a stopped sandbox.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::hook::liveness;
use crate::ledger::{InitProcess, LedgerState};

/// At most this many sandboxes are followed at once; past it a new one is not
/// (a reconnect's Synchronize still reconciles it).
const MAX_FOLLOWED: usize = 4096;

pub(super) struct AheadInits {
    proc_root: PathBuf,
    inits: Mutex<Followed>,
}

/// The followed sandboxes, each with its init and the number its note got.
#[derive(Default)]
struct Followed {
    by_id: HashMap<String, (InitProcess, u64)>,
    notes: u64,
}

/// Where the notes stood when a ledger snapshot was taken ([`AheadInits::mark`]):
/// a sandbox noted after it claimed after the snapshot was read, so the
/// snapshot's not holding it says nothing.
#[derive(Clone, Copy)]
pub(super) struct Mark(u64);

impl AheadInits {
    /// Processes read under `proc_root` (`/proc`: the runtime's pids are the
    /// host's, as GPU teardown reads them).
    pub(super) fn new(proc_root: PathBuf) -> AheadInits {
        AheadInits {
            proc_root,
            inits: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Followed> {
        self.inits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Follows `sandbox_id`, claimed at its start, whose init is `pid`; a pid
    /// of 0 (not reported) or one that cannot be identified is not followed:
    /// only a proven exit releases anything.
    pub(super) fn note(&self, sandbox_id: &str, pid: u32) {
        if pid == 0 {
            return;
        }
        let Some(init) = liveness::identify(&self.proc_root, pid) else {
            return;
        };
        let mut inits = self.lock();
        if inits.by_id.len() < MAX_FOLLOWED || inits.by_id.contains_key(sandbox_id) {
            inits.notes += 1;
            let n = inits.notes;
            inits.by_id.insert(sandbox_id.to_string(), (init, n));
        }
    }

    /// Taken before the ledger snapshot that [`AheadInits::ended`] is given.
    pub(super) fn mark(&self) -> Mark {
        Mark(self.lock().notes)
    }

    /// The runtime reported the sandbox stopped or removed: its release
    /// follows that event.
    pub(super) fn forget(&self, sandbox_id: &str) {
        self.lock().by_id.remove(sandbox_id);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.lock().by_id.is_empty()
    }

    /// The followed sandboxes to release now, by the ledger's `state`, read
    /// after `mark` was taken: their init has exited and no container of
    /// theirs is recorded. Those, and those a container joined or the ledger
    /// no longer holds, are no longer followed; a sandbox noted after the
    /// mark is left to the next look, as `state` may predate its claim.
    pub(super) fn ended(&self, state: &LedgerState, mark: Mark) -> HashSet<String> {
        let mut ended = HashSet::new();
        self.lock().by_id.retain(|id, (init, noted)| {
            if *noted > mark.0 {
                return true;
            }
            let Some(pod) = state.pods.get(id) else {
                return false;
            };
            if !pod.unjoined(0) {
                return false;
            }
            if liveness::is_gone(&self.proc_root, init) {
                ended.insert(id.clone());
                return false;
            }
            true
        });
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Claim, DeviceId, Ledger, PodRef, Share};

    fn stat(start: u64) -> String {
        format!("77 (pause) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start} 1000 10\n")
    }

    /// Sandbox `id` claims GPU `GPU-<id>`.
    fn claim(l: &Ledger, id: &str) {
        let pod = PodRef {
            sandbox_id: id.into(),
            namespace: "ns".into(),
            name: format!("pod-{id}"),
            uid: format!("uid-{id}"),
        };
        let gpu = Claim {
            device: DeviceId::Gpu(format!("GPU-{id}")),
            share: Share::Exclusive,
            pf: None,
        };
        l.claim(&pod, &[gpu]).unwrap();
    }

    /// A followed sandbox ends only when its init has certainly exited (its
    /// stat gone, or its pid reused by a later process) and no container
    /// joined it; one a container joined, or the ledger released, is dropped.
    #[test]
    fn a_claimed_sandbox_ends_with_its_init_unless_a_container_joined() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        let write = |pid: u32, start: u64| {
            let d = proc_root.join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("stat"), stat(start)).unwrap();
        };
        let l = Ledger::open(&dir.path().join("state")).unwrap();
        let inits = AheadInits::new(proc_root.clone());
        for (id, pid) in [("a", 71), ("b", 72), ("c", 73), ("d", 74)] {
            claim(&l, id);
            write(pid, 500);
            inits.note(id, pid);
        }
        inits.note("unreported", 0);
        inits.note("unreadable", 79);
        assert!(inits.ended(&l.snapshot().unwrap(), inits.mark()).is_empty());

        // a's init exits; b's pid is taken by a later process; c's init
        // exits after a container joined; d runs on.
        std::fs::remove_dir_all(proc_root.join("71")).unwrap();
        write(72, 900);
        let record = crate::ledger::tests::record("main");
        l.record_container("c", "c1", record).unwrap();
        std::fs::remove_dir_all(proc_root.join("73")).unwrap();
        let ended = inits.ended(&l.snapshot().unwrap(), inits.mark());
        assert_eq!(ended, HashSet::from(["a".to_string(), "b".to_string()]));
        // Only d is still followed, until its stop is reported.
        assert!(inits.ended(&l.snapshot().unwrap(), inits.mark()).is_empty());
        assert!(!inits.is_empty());
        inits.forget("d");
        assert!(inits.is_empty());
    }

    /// A sandbox claimed and noted while a look at the ledger was under way
    /// is not in that look's snapshot; it stays followed rather than being
    /// dropped as one the ledger no longer holds, and ends at a later look.
    #[test]
    fn a_sandbox_noted_after_the_snapshot_stays_followed() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        let d = proc_root.join("81");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("stat"), stat(500)).unwrap();
        let l = Ledger::open(&dir.path().join("state")).unwrap();
        let inits = AheadInits::new(proc_root.clone());

        let mark = inits.mark();
        let before = l.snapshot().unwrap();
        claim(&l, "s");
        inits.note("s", 81);
        assert!(inits.ended(&before, mark).is_empty());
        assert!(!inits.is_empty(), "still followed");

        std::fs::remove_dir_all(&d).unwrap();
        let ended = inits.ended(&l.snapshot().unwrap(), inits.mark());
        assert_eq!(ended, HashSet::from(["s".to_string()]));
    }
}
