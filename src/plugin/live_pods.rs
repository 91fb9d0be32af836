//! The pods a Synchronize finds still running, whose claims stay.

use std::collections::HashSet;

/// The sandbox ids of the runtime's pods that still run, from a Synchronize.
/// The runtime also lists sandboxes that were stopped but not yet removed
/// (containerd keeps them until RemovePodSandbox, which for a finished Job's
/// pod comes only when the pod object is deleted). A pod stopped while the
/// plugin was away would keep its devices that long, refusing every pod the
/// scheduler gives them to. A stopped sandbox has no task, so containerd
/// reports its pid as 0 (`nriPodSandbox`; the sandbox exit handler clears
/// it); a pid of 0 alone is not trusted, since it is also what a failed
/// task lookup gives: such a pod counts as stopped only when none of its
/// containers runs either (the runtime lists no exited container). Only for
/// a runtime known to report stopped sandboxes so (`stopped_pid_zero`);
/// for any other, every listed pod is live. The pod of a listed container
/// is live too, listed or not: containerd leaves out of its list a sandbox
/// in an unknown state (one whose status it could not load at its own
/// restart, when a Synchronize comes, or one still starting) while it lists
/// that sandbox's running containers.
pub fn live_pods(
    pods: &[nri::api::PodSandbox],
    containers: &[nri::api::Container],
    stopped_pid_zero: bool,
) -> HashSet<String> {
    let with_running: HashSet<&str> = containers
        .iter()
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();
    pods.iter()
        .filter(|p| !stopped_pid_zero || p.pid != 0 || with_running.contains(p.id.as_str()))
        .map(|p| p.id.as_str())
        .chain(with_running.iter().copied().filter(|id| !id.is_empty()))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_sandbox_without_running_containers_is_not_live() {
        let pod = |id: &str, pid: u32| nri::api::PodSandbox {
            id: id.into(),
            pid,
            ..Default::default()
        };
        let ctr = |pod: &str| nri::api::Container {
            id: format!("{pod}-c"),
            pod_sandbox_id: pod.into(),
            ..Default::default()
        };
        let pods = [pod("running", 41), pod("stopped", 0), pod("no-pid", 0)];
        let sorted = |live: HashSet<String>| {
            let mut v: Vec<String> = live.into_iter().collect();
            v.sort();
            v
        };
        let live = live_pods(&pods, &[ctr("no-pid")], true);
        assert_eq!(sorted(live), ["no-pid", "running"]);
        let live = live_pods(&pods, &[], false);
        assert_eq!(sorted(live), ["no-pid", "running", "stopped"]);
        // A running container's pod the runtime does not list (its state
        // unknown) is live.
        let live = live_pods(&pods, &[ctr("unlisted"), ctr("")], true);
        assert_eq!(sorted(live), ["running", "unlisted"]);
    }
}
