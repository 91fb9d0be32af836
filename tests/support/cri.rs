//! A blocking CRI client over containerd's unix socket, with the calls kubelet
//! makes for a pod's lifecycle. Calls that the runtime may refuse return the
//! gRPC status so that tests can assert on the message (e.g. a plugin's
//! CreateContainerError); calls that must not fail panic with context.
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerState, ContainerStatus, ContainerStatusRequest, CreateContainerRequest,
    ExecSyncRequest, ListPodSandboxRequest, PodSandboxConfig, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest, VersionRequest, VersionResponse,
};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::Status;

use super::spec::{ContainerSpec, PodSpec};
use super::{wait_for, SLOW};

/// Upper bound for one CRI call: sandbox creation on a loaded 2-core machine
/// runs CNI, runc and a shim.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A running pod sandbox and the config it was created with (CreateContainer
/// needs it again, as kubelet sends it).
#[derive(Clone)]
pub struct Pod {
    pub id: String,
    pub config: PodSandboxConfig,
}

/// What a container that ran to completion left behind.
#[derive(Debug)]
pub struct ContainerRun {
    pub id: String,
    pub exit_code: i32,
    /// stdout and stderr, interleaved, without the CRI log prefixes.
    pub log: String,
}

pub struct Cri {
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
    log_root: PathBuf,
}

impl Cri {
    /// Connects lazily: the first call dials, so the daemon may still be starting.
    pub fn connect(socket: &Path, log_root: &Path) -> Cri {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let socket = socket.to_path_buf();
        let channel = rt.block_on(async {
            Endpoint::from_static("http://[::]")
                .timeout(CALL_TIMEOUT)
                .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        tokio::net::UnixStream::connect(socket)
                            .await
                            .map(TokioIo::new)
                    }
                }))
        });
        Cri {
            rt,
            client: RuntimeServiceClient::new(channel),
            log_root: log_root.to_path_buf(),
        }
    }

    pub fn version(&self) -> Result<VersionResponse, Status> {
        let mut c = self.client.clone();
        self.rt
            .block_on(c.version(VersionRequest::default()))
            .map(|r| r.into_inner())
    }

    /// RunPodSandbox; container logs go to a per-pod directory, as with kubelet.
    pub fn run_pod(&self, spec: &PodSpec) -> Result<Pod, Status> {
        let log_dir = self
            .log_root
            .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid));
        std::fs::create_dir_all(&log_dir).expect("create pod log dir");
        let config = spec.to_config(&log_dir);
        let request = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let mut c = self.client.clone();
        let id = self
            .rt
            .block_on(c.run_pod_sandbox(request))?
            .into_inner()
            .pod_sandbox_id;
        Ok(Pod { id, config })
    }

    /// CreateContainer; the error carries the runtime's (and NRI plugins') message.
    pub fn create_container(&self, pod: &Pod, spec: &ContainerSpec) -> Result<String, Status> {
        let request = CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(spec.to_config(&pod.config)),
            sandbox_config: Some(pod.config.clone()),
        };
        let mut c = self.client.clone();
        Ok(self
            .rt
            .block_on(c.create_container(request))?
            .into_inner()
            .container_id)
    }

    pub fn start_container(&self, id: &str) -> Result<(), Status> {
        let request = StartContainerRequest {
            container_id: id.to_string(),
        };
        let mut c = self.client.clone();
        self.rt.block_on(c.start_container(request)).map(drop)
    }

    pub fn container_status(&self, id: &str) -> Result<ContainerStatus, Status> {
        let request = ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        };
        let mut c = self.client.clone();
        let status = self
            .rt
            .block_on(c.container_status(request))?
            .into_inner()
            .status;
        Ok(status.expect("ContainerStatus without status"))
    }

    /// The OCI runtime spec containerd generated for the container (with every
    /// NRI adjustment applied), from the verbose ContainerStatus. Lets a test
    /// check env, mounts, devices and hooks without starting the container.
    pub fn runtime_spec(&self, id: &str) -> Result<serde_json::Value, Status> {
        let request = ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: true,
        };
        let mut c = self.client.clone();
        let info = self
            .rt
            .block_on(c.container_status(request))?
            .into_inner()
            .info;
        let raw = info
            .get("info")
            .expect("verbose ContainerStatus has no \"info\"");
        let mut info: serde_json::Value =
            serde_json::from_str(raw).expect("ContainerStatus info is JSON");
        Ok(info["runtimeSpec"].take())
    }

    /// The path of the network namespace the container's OCI spec joins: the
    /// pod's, while its sandbox runs.
    pub fn netns_path(&self, id: &str) -> Result<String, Status> {
        let spec = self.runtime_spec(id)?;
        let path = spec["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["type"] == "network")
            .and_then(|n| n["path"].as_str())
            .expect("the container joins a network namespace by path");
        Ok(path.to_string())
    }

    /// Waits until the container has exited; returns its exit code.
    pub fn wait_exited(&self, id: &str, timeout: Duration) -> i32 {
        wait_for(&format!("container {id} to exit"), timeout, || {
            let status = self.container_status(id).expect("ContainerStatus");
            (status.state == ContainerState::ContainerExited as i32).then_some(status.exit_code)
        })
    }

    /// The container's output so far, with the CRI log prefixes stripped.
    pub fn container_log(&self, id: &str) -> String {
        let status = self.container_status(id).expect("ContainerStatus");
        let raw = std::fs::read_to_string(&status.log_path).unwrap_or_default();
        strip_cri_log(&raw)
    }

    /// Create, start, wait for exit and read the log: one short-lived container.
    pub fn run_container(&self, pod: &Pod, spec: &ContainerSpec) -> Result<ContainerRun, Status> {
        let id = self.create_container(pod, spec)?;
        self.start_container(&id)?;
        let exit_code = self.wait_exited(&id, SLOW);
        let log = self.container_log(&id);
        Ok(ContainerRun { id, exit_code, log })
    }

    /// ExecSync in a running container; returns (exit code, stdout, stderr).
    pub fn exec(&self, id: &str, cmd: &[&str]) -> Result<(i32, String, String), Status> {
        let request = ExecSyncRequest {
            container_id: id.to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: CALL_TIMEOUT.as_secs() as i64,
        };
        let mut c = self.client.clone();
        let out = self.rt.block_on(c.exec_sync(request))?.into_inner();
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
        Ok((out.exit_code, text(out.stdout), text(out.stderr)))
    }

    /// StopContainer: SIGTERM, then SIGKILL after `timeout_secs` (0 kills at once).
    pub fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<(), Status> {
        let request = StopContainerRequest {
            container_id: id.to_string(),
            timeout: timeout_secs,
        };
        let mut c = self.client.clone();
        self.rt.block_on(c.stop_container(request)).map(drop)
    }

    pub fn remove_container(&self, id: &str) -> Result<(), Status> {
        let request = RemoveContainerRequest {
            container_id: id.to_string(),
        };
        let mut c = self.client.clone();
        self.rt.block_on(c.remove_container(request)).map(drop)
    }

    /// Deletes `pod` as kubelet does: each of `containers` stopped (5 s grace)
    /// and removed, then the sandbox stopped and removed. Panics on a failure.
    pub fn delete_pod(&self, pod: &Pod, containers: &[&str]) {
        for id in containers {
            self.stop_container(id, 5).expect("StopContainer");
            self.remove_container(id).expect("RemoveContainer");
        }
        self.stop_pod(pod).expect("StopPodSandbox");
        self.remove_pod(pod).expect("RemovePodSandbox");
    }

    pub fn stop_pod(&self, pod: &Pod) -> Result<(), Status> {
        self.stop_pod_id(&pod.id)
    }

    pub fn remove_pod(&self, pod: &Pod) -> Result<(), Status> {
        self.remove_pod_id(&pod.id)
    }

    pub fn stop_pod_id(&self, id: &str) -> Result<(), Status> {
        let request = StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        let mut c = self.client.clone();
        self.rt.block_on(c.stop_pod_sandbox(request)).map(drop)
    }

    pub fn remove_pod_id(&self, id: &str) -> Result<(), Status> {
        let request = RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        let mut c = self.client.clone();
        self.rt.block_on(c.remove_pod_sandbox(request)).map(drop)
    }

    pub fn list_pod_ids(&self) -> Result<Vec<String>, Status> {
        let mut c = self.client.clone();
        let pods = self
            .rt
            .block_on(c.list_pod_sandbox(ListPodSandboxRequest::default()))?
            .into_inner()
            .items;
        Ok(pods.into_iter().map(|p| p.id).collect())
    }
}

/// CRI log lines are `<RFC3339Nano time> <stream> <P|F> <content>`; a `P`
/// (partial) line continues on the next one without a newline.
fn strip_cri_log(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for line in raw.lines() {
        let mut fields = line.splitn(4, ' ');
        let (_time, _stream, tag) = (fields.next(), fields.next(), fields.next());
        out.push_str(fields.next().unwrap_or(""));
        if tag != Some("P") {
            out.push('\n');
        }
    }
    out
}
