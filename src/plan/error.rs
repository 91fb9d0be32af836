//! Why a plan cannot be made: one line naming the annotation, the entry and
//! the reason, as kubelet shows it.

use crate::inventory::PciAddr;

/// Why an allocation cannot be applied on this node. Each variant names the
/// annotation, the entry and the reason; `Display` is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{annotation}: rdma: the node's devices changed during each read of them (devices being made, reloaded or moved): refused until they settle")]
    HostChanging { annotation: &'static str },
    #[error("{annotation}: {entry}: no gpu with minor {minor} on this node")]
    UnknownGpu {
        annotation: &'static str,
        entry: String,
        minor: u32,
    },
    #[error(
        "{annotation}: {entry}: id {id} is the uuid of gpu minor {owner}, not of minor {minor}"
    )]
    GpuIdOfOther {
        annotation: &'static str,
        entry: String,
        id: String,
        minor: u32,
        owner: u32,
    },
    #[error("{annotation}: {entry}: gpu minor {minor} claims no core and no memory (gpu-core and gpu-memory-ratio are 0): a share of nothing would not be counted against the gpu")]
    EmptyGpuShare {
        annotation: &'static str,
        entry: String,
        minor: u32,
    },
    #[error("{annotation}: {entry}: id {id} is not the uuid of gpu minor {minor} ({actual})")]
    GpuIdMismatch {
        annotation: &'static str,
        entry: String,
        id: String,
        minor: u32,
        actual: String,
    },
    #[error("{annotation}: {entry}: no {device} major in proc/devices")]
    NoMajor {
        annotation: &'static str,
        entry: String,
        device: &'static str,
    },
    /// `value` is the container's, bounded and made one line.
    #[error("{annotation}: {entry}: HAMi-core keys the pod's per-gpu limits by CUDA device number, which the container's {name}={value} changes: its gpus carry different limits, so each would fall on another gpu than it was granted for")]
    HamiReordered {
        annotation: &'static str,
        entry: String,
        name: &'static str,
        value: String,
    },
    #[error("{annotation}: {entry}: HAMi-core needs a memory limit (resources gpu-memory, or gpu-memory-ratio and a known gpu memory) for a shared gpu")]
    NoGpuMemory {
        annotation: &'static str,
        entry: String,
    },
    #[error("{annotation}: {entry}: resources gpu-memory {bytes} is more than gpu-memory-ratio {ratio}% of the gpu's {total} bytes, which is all the pod claims")]
    GpuMemoryOverRatio {
        annotation: &'static str,
        entry: String,
        bytes: u64,
        ratio: u32,
        total: u64,
    },
    #[error("{annotation}: {entry}: resources gpu-memory-ratio {ratio}% is more than gpu-memory {bytes} of the gpu's {total} bytes: the claim would exceed the memory granted")]
    GpuRatioOverMemory {
        annotation: &'static str,
        entry: String,
        bytes: u64,
        ratio: u32,
        total: u64,
    },
    #[error("{annotation}: {entry}: no rdma device with minor {minor} on this node")]
    UnknownRdma {
        annotation: &'static str,
        entry: String,
        minor: u32,
    },
    #[error("{annotation}: {entry}: id {id} is not an rdma pf on this node")]
    UnknownPf {
        annotation: &'static str,
        entry: String,
        id: PciAddr,
    },
    #[error("{annotation}: {entry}: id {id} is a vf of pf {pf}, not a pf")]
    IdIsVf {
        annotation: &'static str,
        entry: String,
        id: PciAddr,
        pf: PciAddr,
    },
    #[error("{annotation}: {entry}: id {id} is rdma minor {owner}, not minor {minor}")]
    PfMinorMismatch {
        annotation: &'static str,
        entry: String,
        id: PciAddr,
        minor: u32,
        owner: u32,
    },
    #[error("{annotation}: {entry}: pf {pf} is also in {first}")]
    DuplicatePf {
        annotation: &'static str,
        entry: String,
        pf: PciAddr,
        first: String,
    },
    #[error("{annotation}: {entry}: vf {vf} belongs to pf {owner}, not to pf {pf}")]
    VfOfOtherPf {
        annotation: &'static str,
        entry: String,
        vf: PciAddr,
        pf: PciAddr,
        owner: PciAddr,
    },
    #[error("{annotation}: {entry}: busID {bus} is a pf, not a vf")]
    BusIsPf {
        annotation: &'static str,
        entry: String,
        bus: PciAddr,
    },
    #[error(
        "{annotation}: {entry}: not among the settings this node lets pods set ([vf] pod_settings)"
    )]
    VfSettingNotAllowed {
        annotation: &'static str,
        entry: String,
    },
    /// The node's settings for a PF, which no config check could see whole
    /// (`[vf.defaults]` for a PF without a section of its own).
    #[error("{annotation}: {entry}: the node's [vf] settings for pf {pf}: {setting} {reason}")]
    VfNodeSettings {
        annotation: &'static str,
        entry: String,
        setting: &'static str,
        reason: &'static str,
        pf: PciAddr,
    },
    /// A setting the PF applies to its VF, where the PF has no netdev on
    /// the host to take it.
    #[error("{annotation}: {entry}: {setting} is set through the vf's pf, and pf {pf} has no netdev on this host")]
    VfSettingWithoutPf {
        annotation: &'static str,
        entry: String,
        setting: &'static str,
        pf: PciAddr,
    },
    /// A whole PF's RDMA device stays in the host's network namespace, which
    /// the kernel's exclusive mode keeps from the pod's own.
    #[error("{annotation}: {entry}: pf {pf} is used without vfs, so its rdma device stays in the host network namespace, which this node's exclusive rdma netns mode keeps from the pod's own: allocate its vfs or run the pod on the host network")]
    PfInHostNetns {
        annotation: &'static str,
        entry: String,
        pf: PciAddr,
    },
    /// The pod's settings over the node's: each within its range, together not.
    #[error("{annotation}: {entry}: {setting} {reason} over the node's settings for pf {pf}")]
    VfSettingsConflict {
        annotation: &'static str,
        entry: String,
        setting: &'static str,
        reason: &'static str,
        pf: PciAddr,
    },
    #[error("{annotation}: {entry}: busID {bus} is not a vf of any rdma pf on this node")]
    UnknownVf {
        annotation: &'static str,
        entry: String,
        bus: PciAddr,
    },
    /// A VF with a netdev per port: the hook moves one netdev per VF into the
    /// pod, and the one left on the host would make the VF read as home.
    #[error("{annotation}: {entry}: rdma vf {bus} has more than one netdev ({netdev}, {}); devgate moves exactly one per vf into a pod", more.join(", "))]
    VfNetdevs {
        annotation: &'static str,
        entry: String,
        bus: PciAddr,
        netdev: String,
        more: Vec<String>,
    },
    #[error("{annotation}: {entry}: {bus} has no rdma device")]
    NoRdmaDevice {
        annotation: &'static str,
        entry: String,
        bus: PciAddr,
    },
    #[error("{annotation}: {entry}: {bus} has no uverbs device")]
    NoUverbs {
        annotation: &'static str,
        entry: String,
        bus: PciAddr,
    },
    #[error("{annotation}: {entry}: no rdma_cm device on this node")]
    NoRdmaCm {
        annotation: &'static str,
        entry: String,
    },
    #[error("{annotation}: {entry}: inventory name {name:?} is not a plain device name")]
    UnsafeName {
        annotation: &'static str,
        entry: String,
        name: String,
    },
    /// The hook carries a container's VFs in one bounded annotation.
    #[error("{annotation}: {entry}: more than {max} vfs for one container")]
    TooManyVfs {
        annotation: &'static str,
        entry: String,
        max: usize,
    },
    #[error("config key {key}: {reason}")]
    Config { key: String, reason: String },
}
