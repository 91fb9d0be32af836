//! Containers running without what their pod's allocation gives them. The
//! runtime creates containers as usual while no plugin is connected (the
//! plugin restarting, a DaemonSet rollout, a node booting before devgate), so
//! such a container started with neither its devices nor its VFs, and nothing
//! can add them to a running container. Synchronize names each one, so that
//! an operator can restart it; the ledger, which records every container the
//! plugin admitted, tells them apart. A container the ledger records may
//! still have started without its adjustment: the plugin killed between its
//! record and its reply, or the reply later than the runtime's timeout, both
//! of which the runtime takes as the plugin's failure and creates the
//! container without it (NRI `isFatalError`). The runtime lists each
//! container with the device nodes of its final spec, so one recorded is
//! applied only where it carries the nodes its record names ([`carries`]).

use std::collections::HashMap;

use nri::api::{Container, ContainerState, PodSandbox};

use super::reads;
use super::unapplied_record::Unapplied;
use crate::allocation::{self, Metadata as _};

/// The runtime's containers that are not stopped, that their pod's
/// allocation selects, and that the plugin never admitted (`admitted`).
pub fn unapplied<'a>(
    pods: &'a [PodSandbox],
    containers: &'a [Container],
    admitted: impl Fn(&str) -> bool,
) -> Vec<(&'a PodSandbox, &'a Container)> {
    let by_id: HashMap<&str, &PodSandbox> = pods.iter().map(|p| (p.id.as_str(), p)).collect();
    containers
        .iter()
        .filter(|c| c.state.enum_value_or_default() != ContainerState::CONTAINER_STOPPED)
        .filter_map(|c| Some((*by_id.get(c.pod_sandbox_id.as_str())?, c)))
        .filter(|(pod, c)| {
            match allocation::parse_pod(&reads::annotations(pod), &reads::labels(pod)) {
                Ok(devices) => {
                    !devices.allocation.is_empty() && devices.containers.selects(&c.name)
                }
                // An allocation the plugin would have refused: the container
                // would not have started.
                Err(_) => reads::annotations(pod)
                    .get_value(allocation::DEVICE_ALLOCATED)
                    .is_some(),
            }
        })
        .filter(|(_, c)| !admitted(&c.id))
        .collect()
}

/// Whether the runtime's container `c` has every device node `paths` names
/// (the nodes the plugin gave it, paths inside the container).
pub fn carries(c: &Container, paths: &[String]) -> bool {
    let listed = c
        .linux
        .as_ref()
        .map(|l| l.devices.as_slice())
        .unwrap_or_default();
    paths.iter().all(|p| listed.iter().any(|d| d.path == *p))
}

/// Logs each container [`unapplied`] finds, and returns them for the record.
pub fn report(
    pods: &[PodSandbox],
    containers: &[Container],
    admitted: impl Fn(&str) -> bool,
) -> Vec<Unapplied> {
    let now = crate::ledger::now_unix();
    let found = unapplied(pods, containers, admitted);
    found
        .into_iter()
        .map(|(pod, ctr)| {
            tracing::error!(
                namespace = %pod.namespace, pod = %pod.name, container = %ctr.name, id = %ctr.id,
                annotation = allocation::DEVICE_ALLOCATED,
                "container runs without its allocation: created while devgate was not connected, or without its answer; restart it to get its devices"
            );
            Unapplied {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                sandbox_id: pod.id.clone(),
                container: ctr.name.clone(),
                id: ctr.id.clone(),
                found_unix: now,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(id: &str, annotations: &[(&str, &str)]) -> PodSandbox {
        PodSandbox {
            id: id.into(),
            name: format!("pod-{id}"),
            namespace: "team".into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn ctr(id: &str, pod: &str, name: &str, state: ContainerState) -> Container {
        Container {
            id: id.into(),
            pod_sandbox_id: pod.into(),
            name: name.into(),
            state: state.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_selected_running_containers_the_plugin_never_admitted() {
        use ContainerState::*;
        let gpu = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;
        let pods = [
            pod("a", &[(allocation::DEVICE_ALLOCATED, gpu)]),
            pod(
                "b",
                &[
                    (allocation::DEVICE_ALLOCATED, gpu),
                    (allocation::CONTAINERS, "main"),
                ],
            ),
            pod("plain", &[]),
            pod("bad", &[(allocation::DEVICE_ALLOCATED, "{not json")]),
        ];
        let containers = [
            ctr("a1", "a", "main", CONTAINER_RUNNING),
            ctr("a2", "a", "admitted", CONTAINER_RUNNING),
            ctr("a3", "a", "done", CONTAINER_STOPPED),
            ctr("b1", "b", "main", CONTAINER_CREATED),
            ctr("b2", "b", "sidecar", CONTAINER_RUNNING),
            ctr("p1", "plain", "main", CONTAINER_RUNNING),
            ctr("x1", "bad", "main", CONTAINER_RUNNING),
            ctr("o1", "orphan", "main", CONTAINER_RUNNING),
        ];
        let found: Vec<&str> = unapplied(&pods, &containers, |id| id == "a2")
            .into_iter()
            .map(|(_, c)| c.id.as_str())
            .collect();
        assert_eq!(found, ["a1", "b1", "x1"]);
    }
}
