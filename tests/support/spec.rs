//! What a test asks for, in kubelet's terms: builders that turn into the CRI
//! `PodSandboxConfig` and `ContainerConfig` kubelet would send.
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ImageSpec, KeyValue, LinuxContainerConfig,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
};

use super::images::WORKLOAD_IMAGE;

type PodEdit = Box<dyn Fn(&mut PodSandboxConfig)>;
type ContainerEdit = Box<dyn Fn(&mut ContainerConfig)>;

/// A pod sandbox. Host network by default: such pods need no CNI.
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub annotations: HashMap<String, String>,
    pub labels: HashMap<String, String>,
    pub host_network: bool,
    edits: Vec<PodEdit>,
}

impl PodSpec {
    /// A host-network pod in namespace `default` with a UID unique on this host.
    pub fn new(name: &str) -> PodSpec {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        PodSpec {
            name: name.to_string(),
            namespace: "default".to_string(),
            // Shaped like a Kubernetes UID; pid + sequence keeps parallel tests apart.
            uid: format!(
                "00000000-0000-4000-8000-{:06x}{:06x}",
                std::process::id() & 0xff_ffff,
                seq
            ),
            annotations: HashMap::new(),
            labels: HashMap::new(),
            host_network: true,
            edits: Vec::new(),
        }
    }

    pub fn annotation(mut self, key: &str, value: &str) -> PodSpec {
        self.annotations.insert(key.to_string(), value.to_string());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> PodSpec {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    pub fn namespace(mut self, namespace: &str) -> PodSpec {
        self.namespace = namespace.to_string();
        self
    }

    /// The pod gets its own network namespace, set up by the test CNI plugin.
    pub fn own_netns(mut self) -> PodSpec {
        self.host_network = false;
        self
    }

    /// Escape hatch for fields without a builder method.
    pub fn edit(mut self, f: impl Fn(&mut PodSandboxConfig) + 'static) -> PodSpec {
        self.edits.push(Box::new(f));
        self
    }

    /// The sandbox config, with container logs under `log_directory`.
    pub fn to_config(&self, log_directory: &Path) -> PodSandboxConfig {
        let network = if self.host_network {
            NamespaceMode::Node
        } else {
            NamespaceMode::Pod
        };
        let mut config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            // As kubelet: a host-network pod has no UTS namespace, and runc
            // refuses to set a hostname without one.
            hostname: if self.host_network {
                String::new()
            } else {
                self.name.clone()
            },
            log_directory: log_directory.to_string_lossy().into_owned(),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: network as i32,
                        pid: NamespaceMode::Container as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        for edit in &self.edits {
            edit(&mut config);
        }
        config
    }
}

/// A container of the busybox workload image.
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub annotations: HashMap<String, String>,
    edits: Vec<ContainerEdit>,
}

impl ContainerSpec {
    pub fn new(name: &str, command: &[&str]) -> ContainerSpec {
        ContainerSpec {
            name: name.to_string(),
            image: WORKLOAD_IMAGE.to_string(),
            command: command.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            annotations: HashMap::new(),
            edits: Vec::new(),
        }
    }

    /// `sh -c script`: the usual way to print something from inside.
    pub fn shell(name: &str, script: &str) -> ContainerSpec {
        ContainerSpec::new(name, &["/bin/sh", "-c", script])
    }

    pub fn image(mut self, image: &str) -> ContainerSpec {
        self.image = image.to_string();
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> ContainerSpec {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> ContainerSpec {
        self.annotations.insert(key.to_string(), value.to_string());
        self
    }

    /// Escape hatch for fields without a builder method (devices, resources, ...).
    pub fn edit(mut self, f: impl Fn(&mut ContainerConfig) + 'static) -> ContainerSpec {
        self.edits.push(Box::new(f));
        self
    }

    /// The container config for a container of `pod`; the log goes to
    /// `<pod log dir>/<name>.log`. As kubelet does, the container gets the
    /// pod's namespace modes (without them containerd would put it into the
    /// sandbox's PID namespace).
    pub fn to_config(&self, pod: &PodSandboxConfig) -> ContainerConfig {
        let namespace_options = pod
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|c| c.namespace_options.clone());
        let mut config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: self.name.clone(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: self.image.clone(),
                ..Default::default()
            }),
            command: self.command.clone(),
            envs: self
                .env
                .iter()
                .map(|(key, value)| KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            annotations: self.annotations.clone(),
            log_path: format!("{}.log", self.name),
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    namespace_options,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        for edit in &self.edits {
            edit(&mut config);
        }
        config
    }
}
