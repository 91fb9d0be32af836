//! GPU part of a plan: device nodes, `NVIDIA_VISIBLE_DEVICES`, HAMi-core limits.
use super::{plain_name, Builder, Mount, PlanError, ANN};
use crate::allocation::{GpuEntry, PodDevices};
use crate::inventory::{Gpu, Health, Inventory};
use crate::ledger::{Claim, DeviceId, Share};

/// `/dev/nvidiactl` is minor 255 of the `nvidia` major (libnvidia-container
/// `nvc_internal.h`): (path, minor).
pub const CTL_NODE: (&str, u32) = ("/dev/nvidiactl", 255);
/// `nvidia-uvm` and `nvidia-uvm-tools` are minors 0 and 1 of their major.
pub const UVM_NODES: [(&str, u32); 2] = [("/dev/nvidia-uvm", 0), ("/dev/nvidia-uvm-tools", 1)];

/// A GPU's node, `/dev/nvidia<minor>`.
pub fn gpu_node(minor: u32) -> String {
    format!("/dev/nvidia{minor}")
}
const LD_PRELOAD: &str = "LD_PRELOAD";

pub(super) fn plan_gpus(
    out: &mut Builder,
    inv: &Inventory,
    pod: &PodDevices,
) -> Result<(), PlanError> {
    let entries = &pod.allocation.gpus;
    if entries.is_empty() {
        return Ok(());
    }
    let no_major = |device| PlanError::NoMajor {
        annotation: ANN,
        entry: "gpu".into(),
        device,
    };
    let nvidia = inv.nvidia_majors.nvidia.ok_or_else(|| no_major("nvidia"))?;
    let uvm = inv
        .nvidia_majors
        .nvidia_uvm
        .ok_or_else(|| no_major("nvidia-uvm"))?;

    let mut gpus: Vec<&Gpu> = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let entry = format!("gpu[{i}]");
        let gpu = resolve(inv, e, &entry)?;
        check_ratio_fits_memory(e, gpu, &entry)?;
        // The UUID goes into a comma-separated env value; sysfs text is not trusted.
        plain_name(&entry, &gpu.uuid, 128)?;
        if let Health::Unhealthy { reason } = &gpu.health {
            out.plan.warnings.push(format!(
                "{entry}: gpu minor {} is unhealthy: {reason}",
                gpu.minor
            ));
        }
        let share = share(e);
        // Koordinator never writes it (a memory request below 1 % is counted
        // as 1 by `share`): the device with nothing counted against the GPU
        // would fit beside holders that have it all.
        if share
            == (Share::Shared {
                core: 0,
                memory_ratio: 0,
            })
        {
            return Err(PlanError::EmptyGpuShare {
                annotation: ANN,
                entry,
                minor: e.minor,
            });
        }
        out.device(gpu_node(gpu.minor), nvidia, gpu.minor);
        out.claim(
            &entry,
            Claim {
                device: DeviceId::Gpu(gpu.uuid.clone()),
                share,
                pf: None,
            },
        );
        out.comm
            .gpus
            .push((gpu.uuid.clone(), gpu.topology.numa_node));
        gpus.push(gpu);
    }
    out.device(CTL_NODE.0.into(), nvidia, CTL_NODE.1);
    for (path, minor) in UVM_NODES {
        out.device(path.into(), uvm, minor);
    }
    // UUIDs, never minors or indices: nvidia-container-runtime reads integers as NVML
    // indices, which need not equal minors (NVIDIA/nvidia-docker#1432).
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    out.plan
        .env
        .insert("NVIDIA_VISIBLE_DEVICES".into(), uuids.join(","));

    let shared = entries.iter().any(|e| e.resources.is_shared());
    if shared && pod.hami_core {
        hami_core(out, entries, &gpus)?;
    } else if shared {
        out.plan.warnings.push(
            "gpu: shared gpu without the HAMi-core label: core and memory shares are not enforced"
                .into(),
        );
    }
    Ok(())
}

/// The inventory GPU of an entry: by minor, with the UUID checked when present.
fn resolve<'a>(inv: &'a Inventory, e: &GpuEntry, entry: &str) -> Result<&'a Gpu, PlanError> {
    let gpu = inv
        .gpus
        .iter()
        .find(|g| g.minor == e.minor)
        .ok_or_else(|| PlanError::UnknownGpu {
            annotation: ANN,
            entry: entry.to_string(),
            minor: e.minor,
        })?;
    let Some(id) = &e.uuid else {
        return Ok(gpu);
    };
    if *id == gpu.uuid {
        return Ok(gpu);
    }
    Err(match inv.gpus.iter().find(|g| g.uuid == *id) {
        Some(owner) => PlanError::GpuIdOfOther {
            annotation: ANN,
            entry: entry.to_string(),
            id: id.clone(),
            minor: e.minor,
            owner: owner.minor,
        },
        None => PlanError::GpuIdMismatch {
            annotation: ANN,
            entry: entry.to_string(),
            id: id.clone(),
            minor: e.minor,
            actual: gpu.uuid.chars().take(64).collect(),
        },
    })
}

fn share(e: &GpuEntry) -> Share {
    if !e.resources.is_shared() {
        return Share::Exclusive;
    }
    let r = &e.resources;
    let memory_ratio = match (r.memory_ratio_percent, r.memory_bytes) {
        // Koordinator derives the ratio from the bytes rounding down
        // (`fillGPUTotalMem`, `memoryBytesToRatio`): a request below 1 % of
        // the GPU's memory (512Mi of 80Gi) is written as 0. It holds memory
        // all the same, less than 1 %: counted as 1, so that it is not a
        // share of nothing beside holders that have the GPU's memory.
        (Some(0), Some(bytes)) if bytes > 0 => 1,
        (ratio, _) => ratio.unwrap_or(100),
    };
    Share::Shared {
        core: r.core_counted(),
        memory_ratio,
    }
}

/// HAMi-core's per-device limits, `<prefix><n>` ([`hami_core`]).
const MEMORY_LIMIT_PREFIX: &str = "CUDA_DEVICE_MEMORY_LIMIT_";
const SM_LIMIT_PREFIX: &str = "CUDA_DEVICE_SM_LIMIT_";

/// HAMi-core reads per-device limits `CUDA_DEVICE_MEMORY_LIMIT_<n>` and
/// `CUDA_DEVICE_SM_LIMIT_<n>` (HAMi-core README), `n` being the CUDA device
/// ordinal it intercepts, and is loaded through `LD_PRELOAD`. Per-device
/// values, unlike koordlet's single `CUDA_DEVICE_MEMORY_LIMIT`, keep each
/// GPU's own share. The plan sets `CUDA_DEVICE_ORDER=PCI_BUS_ID`, under which
/// CUDA numbers the visible GPUs in PCI bus order, whatever their order in
/// `NVIDIA_VISIBLE_DEVICES` (CUDA C Programming Guide, "CUDA Environment
/// Variables"): so `n` is each GPU's rank by bus id among the pod's, and an
/// allocation listed in another order keeps each limit on its own GPU.
fn hami_core(out: &mut Builder, entries: &[GpuEntry], gpus: &[&Gpu]) -> Result<(), PlanError> {
    for (i, (e, gpu)) in entries.iter().zip(gpus).enumerate() {
        let n = gpus.iter().filter(|g| g.bus_id < gpu.bus_id).count();
        check_memory_fits_ratio(e, gpu, i)?;
        unchecked_memory_warning(out, e, gpu, i);
        // 0 means "no limit" to HAMi-core: a shared GPU must carry a real limit.
        match (memory_limit(e, gpu), e.resources.is_shared()) {
            (Some(bytes), _) => {
                out.plan
                    .env
                    .insert(format!("{MEMORY_LIMIT_PREFIX}{n}"), bytes.to_string());
            }
            (None, true) => {
                return Err(PlanError::NoGpuMemory {
                    annotation: ANN,
                    entry: format!("gpu[{i}]"),
                });
            }
            (None, false) => {}
        }
        if let Some(core) = e.resources.core_percent {
            out.plan
                .env
                .insert(format!("{SM_LIMIT_PREFIX}{n}"), core.to_string());
        }
    }
    let hami = &out.config.hami;
    out.plan
        .env
        .insert(LD_PRELOAD.into(), hami.library_path.clone());
    out.plan.mounts.push(host_bind(&hami.library_path, "ro"));
    // Shared by every HAMi-core container on the node (HAMi issue #696),
    // from a directory of devgate's own.
    out.plan.mounts.push(Mount {
        destination: hami.lock_dir.clone(),
        ..host_bind(&hami.host_lock_dir, "rw")
    });
    Ok(())
}

/// The ledger claims `gpu-memory-ratio`; a `gpu-memory` beyond it would let
/// HAMi-core give the container memory its co-tenants were promised. One
/// percentage point of slack allows for a ratio Koordinator rounded down.
fn check_memory_fits_ratio(e: &GpuEntry, gpu: &Gpu, i: usize) -> Result<(), PlanError> {
    let Some((bytes, ratio, total)) = memory_terms(e, gpu) else {
        return Ok(());
    };
    if u128::from(bytes) * 100 <= u128::from(total) * (u128::from(ratio) + 1) {
        return Ok(());
    }
    Err(PlanError::GpuMemoryOverRatio {
        annotation: ANN,
        entry: format!("gpu[{i}]"),
        bytes,
        ratio,
        total,
    })
}

/// A shared GPU's `gpu-memory` where the GPU's memory is unknown (`gpu.nvml`
/// off, or NVML not loaded) is taken as the annotation gives it: it cannot be
/// compared with the ratio the ledger claims. Refusing would refuse every
/// HAMi-core pod on such a node (the scheduler always writes both), so the
/// plan says so instead, for the log.
fn unchecked_memory_warning(out: &mut Builder, e: &GpuEntry, gpu: &Gpu, i: usize) {
    let r = &e.resources;
    let Some(bytes) = r.memory_bytes.filter(|&b| b > 0) else {
        return;
    };
    if r.is_shared() && r.memory_ratio_percent.is_some() && gpu.memory_bytes.is_none() {
        out.plan.warnings.push(format!(
            "gpu[{i}]: the gpu's memory is unknown on this node (nvml off or not loaded): hami-core's limit of {bytes} bytes is taken as the annotation gives it, unchecked against gpu-memory-ratio"
        ));
    }
}

/// An entry's `gpu-memory` and `gpu-memory-ratio` with the GPU's memory, when
/// all three are known: what both checks between them compare.
fn memory_terms(e: &GpuEntry, gpu: &Gpu) -> Option<(u64, u32, u64)> {
    let r = &e.resources;
    Some((r.memory_bytes?, r.memory_ratio_percent?, gpu.memory_bytes?))
}

/// The ledger claims `gpu-memory-ratio`, and a ratio of 100 claims the GPU
/// whole: it may not exceed the `gpu-memory` it was derived from (one point of
/// slack for rounding), or a pod granted a few GiB would hold the whole GPU.
fn check_ratio_fits_memory(e: &GpuEntry, gpu: &Gpu, entry: &str) -> Result<(), PlanError> {
    let Some((bytes, ratio, total)) = memory_terms(e, gpu) else {
        return Ok(());
    };
    if u128::from(ratio) * u128::from(total) <= u128::from(bytes) * 100 + u128::from(total) {
        return Ok(());
    }
    Err(PlanError::GpuRatioOverMemory {
        annotation: ANN,
        entry: entry.to_string(),
        bytes,
        ratio,
        total,
    })
}

/// `gpu-memory`, or else the ratio of the GPU's total memory, as Koordinator's
/// `fillGPUTotalMem` derives one from the other. `None` when neither gives a limit.
fn memory_limit(e: &GpuEntry, gpu: &Gpu) -> Option<u64> {
    let derived = || {
        let ratio = u128::from(e.resources.memory_ratio_percent?);
        let total = u128::from(gpu.memory_bytes?);
        u64::try_from(total * ratio / 100).ok()
    };
    e.resources.memory_bytes.or_else(derived).filter(|&b| b > 0)
}

const CUDA_DEVICE_ORDER: &str = "CUDA_DEVICE_ORDER";
const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// The container's variables that decide CUDA's device numbers.
pub(super) const CUDA_ORDER_INPUTS: [&str; 2] = [CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES];

/// HAMi-core's limits name CUDA device numbers, which are each GPU's rank by
/// bus id only under `CUDA_DEVICE_ORDER=PCI_BUS_ID` with every GPU visible in
/// that order ([`hami_core`]). The plan sets the order where the container
/// does not (also where `comm_env` is off). Where the pod's GPUs carry
/// different limits, a container that orders or narrows its GPUs itself (its
/// own `CUDA_DEVICE_ORDER` other than `PCI_BUS_ID`, a `CUDA_VISIBLE_DEVICES`
/// other than `0,1,...` or its start) would have them fall on other GPUs than
/// granted, taking memory promised to a co-tenant: it is refused.
pub(super) fn hami_order(plan: &mut super::Plan, env: &[String]) -> Result<(), PlanError> {
    // Any GPU's (an exclusive one of unknown memory and no core share has
    // none), set by `hami_core` alone: without one, nothing to order, and
    // nothing formatted for the plan of every GPU container.
    let limited = plan
        .env
        .keys()
        .any(|k| k.starts_with(MEMORY_LIMIT_PREFIX) || k.starts_with(SM_LIMIT_PREFIX));
    if !limited {
        return Ok(());
    }
    let gpus = plan
        .env
        .get("NVIDIA_VISIBLE_DEVICES")
        .map_or(0, |v| v.split(',').count());
    let limits: Vec<[Option<&String>; 2]> = (0..gpus)
        .map(|n| {
            [
                plan.env.get(&format!("{MEMORY_LIMIT_PREFIX}{n}")),
                plan.env.get(&format!("{SM_LIMIT_PREFIX}{n}")),
            ]
        })
        .collect();
    let same = limits.iter().all(|l| *l == limits[0]);
    let user = |name| super::comm_env::user_value(env, name);
    if user(CUDA_DEVICE_ORDER).is_none() {
        plan.env
            .insert(CUDA_DEVICE_ORDER.into(), "PCI_BUS_ID".into());
    }
    if same {
        return Ok(());
    }
    // CUDA numbers the GPUs it is shown in the order listed: the first k by
    // bus id keep each limit on its own GPU, and an empty list shows none.
    // Compared exactly, as a value CUDA might read otherwise is refused.
    let in_bus_order = |v: &str| {
        v.is_empty()
            || v.split(',')
                .enumerate()
                .all(|(n, listed)| n < gpus && listed == n.to_string())
    };
    let reordered = match (user(CUDA_DEVICE_ORDER), user(CUDA_VISIBLE_DEVICES)) {
        (Some(order), _) if order != "PCI_BUS_ID" => Some((CUDA_DEVICE_ORDER, order)),
        (_, Some(visible)) if !in_bus_order(visible) => Some((CUDA_VISIBLE_DEVICES, visible)),
        _ => None,
    };
    match reordered {
        Some((name, value)) => Err(PlanError::HamiReordered {
            annotation: ANN,
            entry: "gpu".into(),
            name,
            value: crate::untrusted::one_line(value, 64),
        }),
        None => Ok(()),
    }
}

/// `LD_PRELOAD` is the container's too (an image preloading tcmalloc or
/// jemalloc): HAMi-core's library goes first, the container's own list after
/// it (ld.so(8): separated by colons or spaces), rather than replacing it.
pub(super) fn keep_own_preload(plan: &mut super::Plan, env: &[String]) {
    let Some(ours) = plan.env.get_mut(LD_PRELOAD) else {
        return;
    };
    // Read as the plan cache's key reads it (`comm_env::env_inputs`), so that
    // two containers with one key get one value.
    let own = super::comm_env::user_value(env, LD_PRELOAD);
    if let Some(own) = own.filter(|o| !o.trim().is_empty()) {
        let has_ours = own.split([':', ' ']).any(|lib| lib == ours.as_str());
        *ours = if has_ours {
            own.to_string()
        } else {
            format!("{ours}:{own}")
        };
    }
}

/// A host path bound at the same path in the container, `ro` or `rw`.
fn host_bind(path: &str, mode: &str) -> Mount {
    Mount {
        source: path.to_string(),
        destination: path.to_string(),
        kind: "bind".into(),
        options: ["rbind", mode, "nosuid", "nodev"]
            .map(String::from)
            .to_vec(),
    }
}
