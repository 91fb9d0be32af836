//! Ending the released pod's users of its GPUs, and which GPUs a process of
//! the pod still holds when that fails: those GPUs stay the pod's; the others
//! go on to their checks and reset.

use std::collections::BTreeSet;

use super::super::cgroup::PodCgroups;
use super::super::kill;
use super::super::scan::{
    add_nvml_users, pod_processes, pod_processes_pinned, scan, split, NotUsers, Split, Users,
};
use super::super::GpuError;
use super::{GpuTeardown, Target, END_ROUNDS};

/// A teardown error and the GPUs it leaves in doubt.
#[derive(Debug)]
pub(super) struct Fault {
    pub gpus: Vec<String>,
    pub error: GpuError,
}

impl Fault {
    /// An error of one GPU's own step.
    pub fn of(target: &Target, error: GpuError) -> Fault {
        Fault {
            gpus: vec![target.uuid.clone()],
            error,
        }
    }

    /// An error that leaves every target in doubt.
    pub fn all(targets: &[Target], error: GpuError) -> Fault {
        Fault {
            gpus: targets.iter().map(|t| t.uuid.clone()).collect(),
            error,
        }
    }

    /// Puts `gpus` in doubt too, beside what each fault names (only the
    /// union counts: [`Fault::gpus_of`]).
    pub fn widen<'a>(faults: &mut [Fault], gpus: impl Iterator<Item = &'a str> + Clone) {
        for f in faults {
            for g in gpus.clone() {
                if !f.gpus.iter().any(|h| h == g) {
                    f.gpus.push(g.to_string());
                }
            }
        }
    }

    /// The GPUs in doubt.
    pub fn gpus_of(faults: &[Fault]) -> BTreeSet<&str> {
        faults
            .iter()
            .flat_map(|f| f.gpus.iter().map(String::as_str))
            .collect()
    }
}

/// What ending the pod's users left.
pub(super) struct Ended {
    /// The holders of every watched GPU, as last scanned.
    pub users: Users,
    /// The last scan split into the pod's processes and others.
    pub split: Split,
    /// The GPUs a process of the pod still holds, and why it was not ended.
    pub stuck: Option<Fault>,
}

impl GpuTeardown {
    /// Ends the pod's processes holding `targets` and looks again, until none
    /// is left or a process cannot be ended (it outlived SIGKILL, or forked
    /// faster than it was ended for `END_ROUNDS` rounds); with none holding
    /// them, ends the processes of `granted` (the pod's recorded containers)
    /// likewise. An error here is a scan that failed, which leaves every
    /// target in doubt.
    pub(super) fn end_pod_users(
        &self,
        pod: &PodCgroups,
        granted: &PodCgroups,
        targets: &[Target],
        skip: &[u32],
    ) -> Result<Ended, GpuError> {
        let watched = self.watched(targets);
        let all_gpus = self.all_gpu_devs();
        // Every GPU's holders, to tell a daemon pod holding them all.
        let mut rdevs: Vec<u64> = watched.iter().map(|(_, r)| *r).collect();
        for r in &all_gpus {
            if !rdevs.contains(r) {
                rdevs.push(*r);
            }
        }
        let users_now = || -> Result<Users, GpuError> {
            let mut users = scan(self.host.as_ref(), &rdevs, skip)?;
            add_nvml_users(self.nvml.as_ref(), &watched, skip, &mut users);
            Ok(users)
        };
        let target_devs: Vec<u64> = targets.iter().map(|t| t.rdev).collect();
        let not_users = NotUsers {
            cgroups: self.ignored.clone(),
            daemon_pods: self.known_pods.cgroups_of(&self.config.ignored_pods),
            all_gpus,
        };
        let split_now =
            |users: &Users| split(self.host.as_ref(), users, &target_devs, pod, &not_users);
        let mut users = users_now()?;
        let mut round = 0;
        loop {
            let found = split_now(&users);
            // With no holder left, a process of a container the ledger
            // recorded that runs on (one the runtime lost, its cgroup and
            // device rules alive, or one still dying of the runtime's
            // SIGKILL) could open any of the GPUs later: ended too.
            let to_end = match found.pod.is_empty() {
                true => pod_processes_pinned(self.host.as_ref(), granted)?,
                false => found.pod.clone(),
            };
            if to_end.is_empty() {
                return Ok(Ended {
                    users,
                    split: found,
                    stuck: None,
                });
            }
            // Still the pod's after the rounds: a process that forks as it is
            // ended, faster than it is ended.
            let (error, now) = if round == END_ROUNDS {
                let pids = to_end.keys().copied().collect();
                let rounds = END_ROUNDS;
                (GpuError::StillForking { pids, rounds }, found)
            } else {
                match kill::end(self.host.as_ref(), &to_end, self.times()) {
                    Ok(ended) => {
                        tracing::info!(terminated = ?ended.terminated, killed = ?ended.killed, "ended the released pod's gpu users");
                        // A process ended can leave a child it forked
                        // meanwhile holding the GPU (a handler that forks and
                        // exits): looked for again, so the GPU is never reset
                        // or handed on under it.
                        users = users_now()?;
                        round += 1;
                        continue;
                    }
                    // Looked at once more after the signals, for the
                    // outside users of the GPUs that go on to their checks.
                    Err(e) => {
                        users = users_now()?;
                        (e, split_now(&users))
                    }
                }
            };
            // Only where every process of the pod still there, holding a GPU
            // or not, is one that outlived SIGKILL: a child forked meanwhile,
            // or one that never opened a GPU, was never signalled and runs.
            let survivors_only = match &error {
                GpuError::Survived { pids } => pod_processes(self.host.as_ref(), pod)?
                    .iter()
                    .all(|p| pids.contains(p)),
                _ => false,
            };
            let stuck = if survivors_only {
                // Killed, and stuck in the driver: such a process never
                // runs code of its own again (SIGKILL is taken on the way
                // back to user mode), so it can open nothing more. The GPUs
                // it holds now stay in doubt; the others go on.
                let held = |t: &&Target| users.of(t.rdev).iter().any(|p| now.pod.contains_key(p));
                let gpus: Vec<String> = targets
                    .iter()
                    .filter(held)
                    .map(|t| t.uuid.clone())
                    .collect();
                match gpus.is_empty() {
                    // Gone in between: the error still stands, for all of them.
                    true => Fault::all(targets, error),
                    false => Fault { gpus, error },
                }
            } else {
                // A process still running (it forks as it is ended, could
                // not be signalled, or could not be read): its container's
                // device rules let it open any GPU of the pod later, so
                // none of them is handed on.
                Fault::all(targets, error)
            };
            return Ok(Ended {
                users,
                split: now,
                stuck: Some(stuck),
            });
        }
    }
}
