//! Does an allocation match what the pod requests? Pure: the pod's request summary
//! and the parsed annotation in, the first mismatch out.
//!
//! The allocation may never exceed the request: a pod that requests no GPU gets no
//! GPU, and one that requests half a GPU's compute cannot be handed a whole one.
//! A value missing from an allocation entry counts as the whole device, as
//! [`crate::allocation::GpuResources::is_shared`] treats it when the plan is built.

use std::fmt::Write as _;

use crate::allocation::{Allocation, FULL_SHARE};

use super::request::{DeviceRequest, RdmaStrategy};

const FULL: u64 = FULL_SHARE as u64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("the pod's containers request no gpu, but {allocated} gpus are allocated")]
    GpuNotRequested { allocated: usize },
    #[error("{allocated} gpus are allocated, but the pod's requests imply {requested}")]
    GpuCount { allocated: usize, requested: u64 },
    #[error(
        "gpu {what} of {allocated} is allocated, but the pod's containers request {requested}"
    )]
    GpuOver {
        what: &'static str,
        allocated: u64,
        requested: u64,
    },
    #[error("gpu[{index}] has no gpu-memory, but the pod requests gpu memory in bytes")]
    GpuMemoryMissing { index: usize },
    /// The scheduler writes the ratio it derived from the bytes; without it
    /// the entry would claim the GPU whole (a missing value counts as 100).
    #[error("gpu[{index}] has no gpu-memory-ratio, but the pod requests gpu memory in bytes")]
    GpuMemoryRatioMissing { index: usize },
    /// An entry with memory and no core counts no core (a memory-only
    /// request), and no SM limit applies: only right when none was requested.
    #[error("gpu[{index}] has no gpu-core, but the pod requests gpu-core {requested}")]
    GpuCoreMissing { index: usize, requested: u64 },
    #[error("the pod's containers request no rdma device, but {allocated} are allocated")]
    RdmaNotRequested { allocated: usize },
    #[error("{allocated} rdma devices are allocated, but the pod's request of koordinator.sh/rdma {requested} allows {allowed}")]
    RdmaCount {
        allocated: usize,
        requested: u64,
        allowed: u64,
    },
    #[error("rdma[{index}] has a share of {share}, but the pod's containers request {requested}")]
    RdmaShare {
        index: usize,
        share: u32,
        requested: u64,
    },
    #[error("rdma[{index}] names {vfs} vfs, but a shared request gets one")]
    RdmaVfs { index: usize, vfs: usize },
}

/// GPUs a request implies: `gpu.shared` when set; otherwise N for a request of
/// N × 100, and one GPU for a share of one.
pub fn gpu_count(req: &DeviceRequest) -> u64 {
    if !req.wants_gpu() {
        0
    } else if req.gpu_shared > 0 {
        req.gpu_shared
    } else {
        req.gpu_core.max(req.gpu_memory_ratio).div_ceil(FULL).max(1)
    }
}

/// The first way in which `alloc` exceeds or contradicts `req`, if any.
pub fn check(req: &DeviceRequest, alloc: &Allocation) -> Result<(), Mismatch> {
    check_gpus(req, alloc)?;
    check_rdma(req, alloc)
}

fn check_gpus(req: &DeviceRequest, alloc: &Allocation) -> Result<(), Mismatch> {
    let allocated = alloc.gpus.len();
    if allocated == 0 {
        return Ok(());
    }
    if !req.wants_gpu() {
        return Err(Mismatch::GpuNotRequested { allocated });
    }
    let requested = gpu_count(req);
    if allocated as u64 != requested {
        return Err(Mismatch::GpuCount {
            allocated,
            requested,
        });
    }
    let sum = |f: &dyn Fn(&crate::allocation::GpuResources) -> Option<u32>| -> u64 {
        alloc
            .gpus
            .iter()
            .map(|g| u64::from(f(&g.resources).unwrap_or(FULL_SHARE)))
            .sum()
    };
    if req.gpu_core > 0 {
        let memory_only =
            |r: &crate::allocation::GpuResources| r.core_percent.is_none() && r.core_counted() == 0;
        if let Some(index) = alloc.gpus.iter().position(|g| memory_only(&g.resources)) {
            return Err(Mismatch::GpuCoreMissing {
                index,
                requested: req.gpu_core,
            });
        }
    }
    within("core", sum(&|r| Some(r.core_counted())), req.gpu_core)?;
    if req.gpu_memory_ratio == 0 && req.gpu_memory_bytes > 0 {
        // Memory requested in bytes: the scheduler derives the ratio from the
        // device's size, so the bytes are what can be compared; the plan
        // checks the ratio against the bytes and the device's size.
        let mut bytes: u64 = 0;
        for (index, g) in alloc.gpus.iter().enumerate() {
            let r = &g.resources;
            let b = r.memory_bytes.ok_or(Mismatch::GpuMemoryMissing { index })?;
            r.memory_ratio_percent
                .ok_or(Mismatch::GpuMemoryRatioMissing { index })?;
            bytes = bytes.saturating_add(b);
        }
        return within("memory bytes", bytes, req.gpu_memory_bytes);
    }
    within(
        "memory ratio",
        sum(&|r| r.memory_ratio_percent),
        req.gpu_memory_ratio,
    )
}

/// `allocated` of `what` may not exceed what the pod requested.
fn within(what: &'static str, allocated: u64, requested: u64) -> Result<(), Mismatch> {
    if allocated > requested {
        return Err(Mismatch::GpuOver {
            what,
            allocated,
            requested,
        });
    }
    Ok(())
}

fn check_rdma(req: &DeviceRequest, alloc: &Allocation) -> Result<(), Mismatch> {
    let allocated = alloc.rdma.len();
    if allocated == 0 {
        return Ok(());
    }
    if req.rdma == 0 {
        return Err(Mismatch::RdmaNotRequested { allocated });
    }
    // Above 100: N whole devices for N × 100, and none for another value, which
    // Koordinator asks as one device of that share, which no device fits
    // (`DefaultDeviceHandler.CalcDesiredRequestsAndCount`). Up to 100: one
    // device with that share, or with a joint GPU allocation up to one per
    // allocated GPU (one NIC per GPU's PCIe root). The pod's allocate hint can
    // ask otherwise.
    let (allowed, per_device) = match req.rdma_strategy {
        RdmaStrategy::RequestsAsCount { device_level } => {
            (req.rdma, if device_level { FULL } else { 1 })
        }
        RdmaStrategy::ApplyForAll => (u64::MAX, req.rdma.min(FULL)),
        RdmaStrategy::Default if req.rdma > FULL && req.rdma.is_multiple_of(FULL) => {
            (req.rdma / FULL, FULL)
        }
        RdmaStrategy::Default if req.rdma > FULL => (0, FULL),
        RdmaStrategy::Default => (alloc.gpus.len().max(1) as u64, req.rdma),
    };
    if allocated as u64 > allowed {
        return Err(Mismatch::RdmaCount {
            allocated,
            requested: req.rdma,
            allowed,
        });
    }
    for (index, e) in alloc.rdma.iter().enumerate() {
        if u64::from(e.share_percent) > per_device {
            return Err(Mismatch::RdmaShare {
                index,
                share: e.share_percent,
                requested: req.rdma,
            });
        }
        if per_device < FULL && e.vfs.len() > 1 {
            return Err(Mismatch::RdmaVfs {
                index,
                vfs: e.vfs.len(),
            });
        }
    }
    Ok(())
}

/// The allocation in one short line for logs: `gpu minors [0,2] rdma [0000:19:00.0 +1 vf]`.
pub fn describe(alloc: &Allocation) -> String {
    let mut out = String::new();
    if !alloc.gpus.is_empty() {
        let minors: Vec<String> = alloc.gpus.iter().map(|g| g.minor.to_string()).collect();
        let _ = write!(out, "gpu minors [{}]", minors.join(","));
    }
    if !alloc.rdma.is_empty() {
        let nics: Vec<String> = alloc
            .rdma
            .iter()
            .map(|r| {
                let pf =
                    r.pf.map(|p| p.to_string())
                        .unwrap_or_else(|| format!("minor {}", r.minor));
                match r.vfs.len() {
                    0 => pf,
                    n => format!("{pf} +{n} vf"),
                }
            })
            .collect();
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "rdma [{}]", nics.join(","));
    }
    if out.is_empty() {
        out.push_str("none");
    }
    out
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
