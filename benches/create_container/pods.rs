//! The pods each creation's container goes into.

use std::time::{Duration, Instant};

use crate::support::{ContainerSpec, Cri, Pod, PodSpec, SLOW};

/// Where each creation's container goes: one pod for all, or a pod of its own.
pub enum Pods<'a> {
    Shared(&'a Pod),
    /// Pods made from this spec; the ledger under the path is watched for
    /// the release of each.
    Fresh(&'a PodSpec, std::path::PathBuf),
}

impl Pods<'_> {
    /// The pod for creation `i` (run now when fresh).
    pub fn get(&self, cri: &Cri, tag: &str, i: usize) -> Pod {
        match self {
            Pods::Shared(pod) => (*pod).clone(),
            Pods::Fresh(template, _) => {
                let mut spec = PodSpec::new(&format!("{}-{tag}{i}", template.name));
                spec.annotations = template.annotations.clone();
                spec.labels = template.labels.clone();
                // The template's UID-bound fields, for this pod's UID.
                let spec = if crate::kubelet() {
                    kubelet_metadata(spec)
                } else {
                    spec
                };
                cri.run_pod(&spec).expect("RunPodSandbox")
            }
        }
    }

    /// Removes a fresh pod and waits until the plugin released its devices,
    /// so that release runs in no creation's window.
    pub fn done(&self, cri: &Cri, pod: &Pod) {
        let Pods::Fresh(_, state_dir) = self else {
            return;
        };
        remove(cri, pod);
        wait_released(state_dir, pod);
    }
}

/// Stops and removes the pod, and its cgroup after it.
pub fn remove(cri: &Cri, pod: &Pod) {
    cri.stop_pod(pod).expect("StopPodSandbox");
    cri.remove_pod(pod).expect("RemovePodSandbox");
    remove_pod_cgroup(pod);
}

/// kubelet's cgroup for a pod under the cgroupfs driver (`--cgroup-root=/`):
/// `/kubepods/<qos>/pod<uid>`, the parent of its sandbox's and containers'.
fn pod_cgroup(uid: &str) -> String {
    format!("/kubepods/besteffort/pod{uid}")
}

/// Removes the pod's cgroup, as kubelet does once the pod is gone (runc
/// removes only the sandbox's and the containers' beneath it), and the QoS
/// levels above it once empty, which runc made on this host without a
/// kubelet. In the unified hierarchy, or in each of cgroup v1's.
fn remove_pod_cgroup(pod: &Pod) {
    let parent = pod.config.linux.as_ref().map(|l| l.cgroup_parent.as_str());
    if let Some(parent) = parent.filter(|p| !p.is_empty()) {
        if remove_cgroup_parent(parent) {
            made().remove(parent);
        }
    }
}

/// The pod cgroups [`kubelet_metadata`] gave pods, until removed.
fn made() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<String>> {
    static MADE: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    MADE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes, when dropped, the pod cgroups still left: made before a panic
/// ended the run, once the node (declared after this) has removed its pods
/// and their processes.
pub struct CgroupSweep;

impl Drop for CgroupSweep {
    fn drop(&mut self) {
        let left = std::mem::take(&mut *made());
        for parent in &left {
            remove_cgroup_parent(parent);
        }
    }
}

/// Whether no hierarchy holds the pod's cgroup any longer. The QoS levels
/// above it are removed only where this removed the pod's own, so that a
/// host's kubelet keeps the levels it made.
fn remove_cgroup_parent(parent: &str) -> bool {
    use std::path::{Path, PathBuf};
    let root = Path::new("/sys/fs/cgroup");
    let hierarchies: Vec<PathBuf> = if root.join("cgroup.controllers").exists() {
        vec![root.to_path_buf()]
    } else {
        let dirs = std::fs::read_dir(root).into_iter().flatten().flatten();
        dirs.map(|e| e.path()).filter(|p| p.is_dir()).collect()
    };
    let mut gone = true;
    for hierarchy in hierarchies {
        let pod_dir = hierarchy.join(parent.trim_start_matches('/'));
        match remove_cgroup(&pod_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                eprintln!("bench: pod cgroup {} left: {e}", pod_dir.display());
                gone = false;
                continue;
            }
        }
        // The QoS levels, once no other pod is in them.
        for level in pod_dir.ancestors().skip(1).take_while(|d| *d != hierarchy) {
            if std::fs::remove_dir(level).is_err() {
                break;
            }
        }
    }
    gone
}

/// `rmdir` of a cgroup, tried again while its last task is still leaving
/// (EBUSY).
fn remove_cgroup(dir: &std::path::Path) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        match std::fs::remove_dir(dir) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// The labels and annotations kubelet passes for a Deployment's pod that
/// Koordinator scheduled (`newPodLabels`, `newPodAnnotations` in kubelet's
/// `kuberuntime_sandbox.go`, and Koordinator's own annotations), beside
/// devgate's: what a node's runtime sends in every request about the pod;
/// and the pod's cgroup as the sandbox's parent, so that its containers'
/// cgroups lie beneath it as kubelet places them.
pub fn kubelet_metadata(spec: PodSpec) -> PodSpec {
    let (uid, name, namespace) = (spec.uid.clone(), spec.name.clone(), spec.namespace.clone());
    let parent = pod_cgroup(&uid);
    made().insert(parent.clone());
    spec.edit(move |c| {
        if let Some(linux) = c.linux.as_mut() {
            linux.cgroup_parent = parent.clone();
        }
    })
    .label("app", "trainer")
        .label("pod-template-hash", "7d9c6b5f4d")
        .label("io.kubernetes.pod.name", &name)
        .label("io.kubernetes.pod.namespace", &namespace)
        .label("io.kubernetes.pod.uid", &uid)
        .label("koordinator.sh/qosClass", "LSE")
        .annotation("kubernetes.io/config.seen", "2026-12-02T10:01:12.324948512Z")
        .annotation("kubernetes.io/config.source", "api")
        .annotation(
            "scheduling.koordinator.sh/resource-spec",
            r#"{"preferredCPUBindPolicy":"FullPCPUs"}"#,
        )
        .annotation(
            "scheduling.koordinator.sh/resource-status",
            r#"{"cpuset":"8-15,72-79","numaNodeResources":[{"node":0,"resources":{"cpu":"16","memory":"128Gi"}}]}"#,
        )
        .annotation("scheduling.koordinator.sh/reservation-allocated", r#"{"name":"","uid":""}"#)
        .annotation("gang.scheduling.koordinator.sh/name", "trainer-gang")
        .annotation("kubectl.kubernetes.io/restartedAt", "2026-12-01T08:00:00Z")
        .annotation("prometheus.io/scrape", "true")
        .annotation("prometheus.io/port", "9400")
}

/// The variables kubelet gives every container: the API server's service
/// links (`getServiceEnvVarMap` in kubelet's `kubelet_pods.go`, for the
/// `kubernetes` service of the `default` namespace, which every pod gets),
/// and a container's own two. A namespace's other services add seven each
/// unless the pod sets `enableServiceLinks: false`.
pub fn kubelet_env(spec: ContainerSpec) -> ContainerSpec {
    spec.env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .env("KUBERNETES_SERVICE_PORT", "443")
        .env("KUBERNETES_SERVICE_PORT_HTTPS", "443")
        .env("KUBERNETES_PORT", "tcp://10.96.0.1:443")
        .env("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443")
        .env("KUBERNETES_PORT_443_TCP_PROTO", "tcp")
        .env("KUBERNETES_PORT_443_TCP_PORT", "443")
        .env("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1")
        .env("NCCL_DEBUG", "WARN")
        .env("PYTHONUNBUFFERED", "1")
}

/// Waits until the ledger under `state_dir` no longer holds `pod` (other
/// pods, such as standing ones, may stay).
pub fn wait_released(state_dir: &std::path::Path, pod: &Pod) {
    let deadline = Instant::now() + SLOW;
    while Instant::now() < deadline {
        match devgate::ledger::Ledger::read(state_dir) {
            Ok(state) if !state.pods.contains_key(&pod.id) => return,
            _ => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    panic!("the plugin did not release the pod's devices within {SLOW:?}");
}
