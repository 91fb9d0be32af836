//! What the ledger records: devices with their holders, and pods with the containers
//! devgate applied a plan to. Serialized as one JSON document, readable by people.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::inventory::PciAddr;

/// A device a pod can hold. GPUs are keyed by UUID (stable across driver reloads,
/// unlike minors); NICs by PCI address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum DeviceId {
    Gpu(String),
    /// An RDMA NIC physical function used whole.
    Pf(PciAddr),
    /// An SR-IOV virtual function.
    Vf(PciAddr),
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::Gpu(uuid) => write!(f, "gpu {uuid}"),
            DeviceId::Pf(addr) => write!(f, "pf {addr}"),
            DeviceId::Vf(addr) => write!(f, "vf {addr}"),
        }
    }
}

/// How a pod holds a device. Shares are percentages of one GPU (Koordinator's
/// gpu-core and gpu-memory-ratio count 100 per GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Share {
    Exclusive,
    Shared { core: u32, memory_ratio: u32 },
}

/// One device a pod asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub device: DeviceId,
    pub share: Share,
    /// A VF's PF. A PF used whole by one pod excludes its VFs from every other
    /// pod, as the scheduler counts them (a VF takes 1 of the PF's
    /// `koordinator.sh/rdma` 100). Claims recorded before this field existed
    /// have none and are not checked against their PF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf: Option<PciAddr>,
}

impl Claim {
    /// The GPU's UUID, for a claim of a GPU.
    pub fn gpu(&self) -> Option<&str> {
        match &self.device {
            DeviceId::Gpu(uuid) => Some(uuid),
            _ => None,
        }
    }

    /// A VF claim recorded before claims named their PF.
    pub fn lacks_pf(&self) -> bool {
        matches!(self.device, DeviceId::Vf(_)) && self.pf.is_none()
    }
}

/// The pod sandbox that holds claims; claims live and die with the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PodRef {
    pub sandbox_id: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One holder of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub sandbox_id: String,
    pub share: Share,
}

/// Why a device must not be handed out, whatever its holders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantine {
    pub reason: String,
    pub since_unix: u64,
    /// The pod whose own processes, outliving its teardown, alone set it
    /// (`None`: set otherwise, or by several): a GPU other pods still share
    /// is returned to them once that pod's release succeeds (see
    /// `rules::lift_restored`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_by: Option<String>,
}

/// A device's entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub device: DeviceId,
    pub holders: Vec<Holder>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<Quarantine>,
}

impl DeviceRecord {
    /// Quarantined and held by no pod: what a quarantine retry may clean.
    pub fn quarantined_unheld(&self) -> bool {
        self.quarantine.is_some() && self.holders.is_empty()
    }
}

/// What devgate applied to one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub name: String,
    /// Device nodes given to the container (paths inside it).
    pub devices: Vec<String>,
    pub applied_unix: u64,
    /// The container's init as the host saw it at creation (hooks-only mode,
    /// where no long-running process watches containers): gone when no
    /// process `pid` with that start time exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitProcess>,
    /// The container's own cgroup paths as `/proc/<init>/cgroup` showed them
    /// (hooks-only mode): its processes belong to the pod at GPU teardown
    /// even where the runtime names its cgroups without the pod UID (podman).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<String>,
    /// The `devgate.io/resolved` annotation the plugin gave the container (its
    /// network owner only), as written by releases before `resolved_sha256`:
    /// the hook acts on that annotation only when it is exactly this, since a
    /// pod can write annotations of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    /// The SHA-256 (hex) of that annotation, as the plugin records it now: the
    /// same check without a kilobyte of escaped JSON in every line the ledger
    /// writes for the owner's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_sha256: Option<String>,
    /// Admitted by `devgate-hook --hooks-only` rather than the NRI plugin: on a
    /// runtime with both (CRI-O with NRI and a hooks.d file), each leaves the
    /// other's containers alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hooks_only: bool,
}

impl ContainerRecord {
    /// Whether the record vouches for `annotation` as the container's
    /// `devgate.io/resolved`: the text recorded, or its digest.
    pub fn vouches_for(&self, annotation: &str) -> bool {
        match (&self.resolved, &self.resolved_sha256) {
            (Some(text), _) => text == annotation,
            (None, Some(digest)) => *digest == resolved_digest(annotation),
            (None, None) => false,
        }
    }

    /// Vouches for no annotation from now on.
    pub fn forget_resolved(&mut self) {
        self.resolved = None;
        self.resolved_sha256 = None;
    }

    /// Whether the NRI plugin admitted the container (records from before
    /// `hooks_only` existed carry the init only hooks-only mode records).
    pub fn by_plugin(&self) -> bool {
        !self.hooks_only && self.init.is_none()
    }
}

/// The digest a record keeps of a resolved annotation: SHA-256, lower-case hex.
/// Collision resistance is what makes it a check: a pod that writes its own
/// annotation cannot find another text with the recorded digest.
pub fn resolved_digest(annotation: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, annotation.as_bytes());
    let mut hex = String::with_capacity(2 * digest.as_ref().len());
    for byte in digest.as_ref() {
        hex.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        hex.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    hex
}

/// A process identity that survives pid reuse: the pid and its start time in
/// clock ticks after boot (proc(5) `/proc/<pid>/stat` field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitProcess {
    pub pid: u32,
    pub start_ticks: u64,
}

/// A pod's entry: its claims and its containers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub pod: PodRef,
    pub claims: Vec<Claim>,
    pub claimed_unix: u64,
    /// Container id → record.
    #[serde(default)]
    pub containers: BTreeMap<String, ContainerRecord>,
    /// The container whose hooks move the pod's VFs into its network namespace.
    /// The namespace is the pod's, so one container carries the network actions;
    /// when it is removed the next container created takes over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_owner: Option<String>,
    /// How many containers were ever recorded in the pod, counted as each is
    /// first recorded (see [`PodRecord::put_container`]); read through
    /// [`PodRecord::admitted`]. Kubelet removes a dead container while its pod
    /// lives on, so an empty `containers` does not tell a claim made at the
    /// sandbox's start, which a refused first container gives back, from a
    /// live pod whose containers came and went, which keeps its devices until
    /// its sandbox stops.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub admitted: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl PodRecord {
    /// The pod's network given up by its owner `container_id`, whose record
    /// no longer vouches for one.
    pub fn give_up_network(&mut self, container_id: &str) {
        self.network_owner = None;
        if let Some(rec) = self.containers.get_mut(container_id) {
            rec.forget_resolved();
        }
    }

    /// Records `record` as `container_id`'s, counting a container not
    /// recorded before. The journal's lines carry the count the writer
    /// reached, so every reader holds the same.
    pub fn put_container(&mut self, container_id: String, record: ContainerRecord) {
        if self.containers.insert(container_id, record).is_none() {
            self.admitted = self.admitted.saturating_add(1);
        }
    }

    /// Forgets `container_id`'s record; whether there was one. The count of
    /// containers ever recorded keeps at least those the pod held, for a
    /// record written before the count existed.
    pub fn remove_container(&mut self, container_id: &str) -> bool {
        self.admitted = self.admitted();
        self.containers.remove(container_id).is_some()
    }

    /// Whether the pod holds no container and at most `at_most` were ever
    /// recorded in it: a claim made for containers that never ran (0: one
    /// made at the sandbox's start that no container joined).
    pub fn unjoined(&self, at_most: u32) -> bool {
        self.containers.is_empty() && self.admitted() <= at_most
    }

    /// Containers ever recorded in the pod, at least those it holds now (a
    /// record written before the count existed counts those) and its network
    /// owner, kept while a VF it moved is away.
    pub fn admitted(&self) -> u32 {
        let held = u32::try_from(self.containers.len()).unwrap_or(u32::MAX);
        self.admitted
            .max(held)
            .max(u32::from(self.network_owner.is_some()))
    }

    /// The pod's network owner when its record went while a VF it moved
    /// stayed away ([`super::Ledger::remove_container`] keeps it so): no
    /// init of its runs, and its VFs still wait for their restore.
    pub fn forgotten_owner(&self) -> Option<&String> {
        self.network_owner
            .as_ref()
            .filter(|owner| !self.containers.contains_key(*owner))
    }

    /// The VFs the pod claims, in claim order.
    pub fn vfs(&self) -> impl Iterator<Item = PciAddr> + '_ {
        self.claims.iter().filter_map(|c| match c.device {
            DeviceId::Vf(vf) => Some(vf),
            _ => None,
        })
    }
}

/// The whole ledger document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerState {
    pub version: u32,
    /// Bumped by every write of the whole document; the journal's lines name
    /// the generation they follow (see `journal`).
    #[serde(default)]
    pub generation: u64,
    /// Keyed by the device's display form, so the file reads well.
    pub devices: BTreeMap<String, DeviceRecord>,
    /// Keyed by sandbox id.
    pub pods: BTreeMap<String, PodRecord>,
}

impl LedgerState {
    /// The record of a container, whichever pod holds it (container ids are unique).
    pub fn container(&self, container_id: &str) -> Option<&ContainerRecord> {
        self.pod_of(container_id)
            .and_then(|p| p.containers.get(container_id))
    }

    /// A holder as people read it: its pod's `namespace/name`, or the sandbox
    /// id when the ledger has no record of the pod.
    pub fn holder_name(&self, sandbox_id: &str) -> String {
        match self.pods.get(sandbox_id) {
            Some(p) => p.pod.to_string(),
            None => sandbox_id.to_string(),
        }
    }

    /// The pod that holds a container's record.
    pub fn pod_of(&self, container_id: &str) -> Option<&PodRecord> {
        self.pods
            .values()
            .find(|p| p.containers.contains_key(container_id))
    }
}

impl Default for LedgerState {
    fn default() -> Self {
        LedgerState {
            version: LEDGER_VERSION,
            generation: 0,
            devices: BTreeMap::new(),
            pods: BTreeMap::new(),
        }
    }
}

pub const LEDGER_VERSION: u32 = 1;
