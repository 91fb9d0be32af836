//! The stub against the fake runtime, over real unix sockets.

mod events;
mod handshake;
mod raw;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use ttrpc::Code;

use super::*;
use crate::{
    api::{Container, ContainerUpdate, CreateContainerResponse, Event, KeyValue, PodSandbox},
    testing::{handshake, FakeConfig, FakeError, FakeRuntime, PluginConn},
    EventMask,
};

const LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("refused {what}")]
struct Refusal {
    what: String,
    code: Code,
}

impl RpcError for Refusal {
    fn code(&self) -> Code {
        self.code
    }
}

/// Records every call; behaviour is set per test.
#[derive(Default)]
struct Recorder {
    events: EventMask,
    calls: Mutex<Vec<String>>,
    synced: Mutex<Vec<(usize, usize)>>,
    refuse_with: Option<Code>,
    /// Delays the first CreateContainer this long.
    stall: Mutex<Option<Duration>>,
    /// Delays each Synchronize this long.
    sync_stall: Option<Duration>,
    /// Told when that CreateContainer's stall begins.
    stalling: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    decode: crate::Decode,
    /// The runtime's deadline each CreateContainer handler saw.
    deadlines: Mutex<Vec<Option<Duration>>>,
}

impl Recorder {
    fn new(events: EventMask) -> Recorder {
        Recorder {
            events,
            ..Recorder::default()
        }
    }

    fn note(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl Plugin for Recorder {
    type Error = Refusal;

    fn events(&self) -> EventMask {
        self.events
    }

    fn decode(&self) -> crate::Decode {
        self.decode
    }

    fn configure(&self, runtime: &RuntimeInfo) -> Result<(), Refusal> {
        self.note(format!("configure {} {}", runtime.name, runtime.events));
        Ok(())
    }

    fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, Refusal> {
        if let Some(stall) = self.sync_stall {
            std::thread::sleep(stall);
        }
        self.synced
            .lock()
            .unwrap()
            .push((pods.len(), containers.len()));
        let update = ContainerUpdate {
            container_id: "c0".to_string(),
            ..Default::default()
        };
        Ok(vec![update])
    }

    fn on_close(&self) {
        self.note("close".to_string());
    }

    fn run_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), Refusal> {
        self.note(format!("run_pod {}", pod.name));
        Ok(())
    }

    fn create_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<CreateContainerResponse, Refusal> {
        self.deadlines
            .lock()
            .unwrap()
            .push(crate::stub::request_timeout());
        if let Some(stall) = self.stall.lock().unwrap().take() {
            if let Some(tx) = self.stalling.lock().unwrap().take() {
                let _ = tx.send(());
            }
            std::thread::sleep(stall);
        }
        if let Some(code) = self.refuse_with {
            return Err(Refusal {
                what: format!("container {}", ctr.name),
                code,
            });
        }
        // A container named `huge-error` gets an error over it.
        if ctr.name == "huge-error" {
            return Err(Refusal {
                what: "x".repeat(crate::frame::TTRPC_MAX_PAYLOAD + 1),
                code: Code::INTERNAL,
            });
        }
        self.note(format!(
            "create {} in {}: env {:?}, mounts {}, pod labels {}",
            ctr.name,
            pod.name,
            ctr.env,
            ctr.mounts.len(),
            pod.labels.len()
        ));
        let mut reply = CreateContainerResponse::default();
        // A container named `huge` gets a reply over ttrpc's 4 MiB limit.
        let value = match ctr.name.as_str() {
            "huge" => "x".repeat(crate::frame::TTRPC_MAX_PAYLOAD + 1),
            _ => pod.name.clone(),
        };
        reply.adjust.mut_or_insert_default().env.push(KeyValue {
            key: "POD".to_string(),
            value,
            ..Default::default()
        });
        Ok(reply)
    }

    fn remove_container(&self, _pod: &PodSandbox, ctr: &Container) -> Result<(), Refusal> {
        self.note(format!("remove {}", ctr.name));
        Ok(())
    }

    fn update_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
        resources: &crate::api::LinuxResources,
    ) -> Result<crate::api::UpdateContainerResponse, Refusal> {
        let devices = resources.devices.len();
        self.note(format!(
            "update {} in {}: {devices} device rules",
            ctr.name, pod.name
        ));
        Ok(crate::api::UpdateContainerResponse {
            update: vec![ContainerUpdate {
                container_id: ctr.id.clone(),
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    fn stop_container(
        &self,
        pod: &PodSandbox,
        ctr: &Container,
    ) -> Result<Vec<ContainerUpdate>, Refusal> {
        self.note(format!("stop {} in {}", ctr.name, pod.name));
        Ok(vec![ContainerUpdate {
            container_id: format!("{}-sibling", ctr.id),
            ..Default::default()
        }])
    }
}

fn pod(name: &str) -> PodSandbox {
    PodSandbox {
        id: format!("{name}-id"),
        name: name.to_string(),
        ..Default::default()
    }
}

fn ctr(name: &str) -> Container {
    Container {
        id: format!("{name}-id"),
        name: name.to_string(),
        ..Default::default()
    }
}

fn create_and_remove() -> EventMask {
    EventMask::of(Event::CREATE_CONTAINER).with(Event::REMOVE_CONTAINER)
}

/// A short socket path: unix socket paths are limited to 107 bytes.
fn socket_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("nri")
        .tempdir_in("/tmp")
        .unwrap();
    let path = dir.path().join("s");
    (dir, path)
}

/// Starts `plugin` dialling the socket `path` for ever, on a thread that
/// ends with the test process; returns the plugin.
fn dialling(plugin: Recorder, path: &std::path::Path) -> Arc<Recorder> {
    let stub = Stub::new(plugin)
        .with_name("test")
        .with_idx("42")
        .with_socket_path(path);
    let plugin = Arc::clone(stub.plugin());
    std::thread::spawn(move || stub.run());
    plugin
}

/// Starts `plugin` dialling a fresh fake runtime; returns the connection.
async fn connect(
    plugin: Recorder,
    config: FakeConfig,
) -> (
    Arc<Recorder>,
    Result<PluginConn, FakeError>,
    tempfile::TempDir,
) {
    let (dir, path) = socket_dir();
    let runtime = FakeRuntime::bind(&path, config).unwrap();
    let plugin = dialling(plugin, &path);
    let conn = tokio::time::timeout(LIMIT, runtime.accept())
        .await
        .expect("plugin connects in time");
    (plugin, conn, dir)
}
