//! Undoing what a tenant could change on a GPU, through NVML: MIG instances, clocks,
//! compute mode, persistence (nvidia-smi(1): `mig -dci`/`-dgi`, `-rac`, `-rgc`, `-rmc`,
//! `-c`, `-pm`), and the optional full reset (`--gpu-reset`).

use std::time::Duration;

use crate::config::{GpuConfig, GpuPersistence};

use super::host::Host;
use super::nvml::{Nvml, NvmlError};
use super::GpuError;

/// `nvidia-smi --gpu-reset` on a busy NVLink system can take tens of seconds.
const RESET_TIMEOUT: Duration = Duration::from_secs(60);

/// Resets one GPU's tenant-visible state. `whole`: the pod held the GPU exclusively,
/// so MIG instances on it were its own. Every step runs; the failures come back.
pub fn reset_gpu(nvml: &dyn Nvml, uuid: &str, config: &GpuConfig, whole: bool) -> Vec<GpuError> {
    let mut errors = Vec::new();
    if whole && config.destroy_mig {
        keep(&mut errors, destroy_mig(nvml, uuid));
    }
    if config.reset_clocks {
        keep(&mut errors, nvml.reset_application_clocks(uuid));
        keep(&mut errors, nvml.reset_locked_clocks(uuid));
    }
    keep(
        &mut errors,
        nvml.set_compute_mode(uuid, config.compute_mode.into()),
    );
    match config.persistence {
        GpuPersistence::Keep => {}
        GpuPersistence::On => keep(&mut errors, nvml.set_persistence(uuid, true)),
        GpuPersistence::Off => keep(&mut errors, nvml.set_persistence(uuid, false)),
    }
    errors
}

fn destroy_mig(nvml: &dyn Nvml, uuid: &str) -> Result<(), NvmlError> {
    if !nvml.mig_enabled(uuid)? {
        return Ok(());
    }
    let done = nvml.destroy_mig_instances(uuid)?;
    tracing::info!(
        gpu = uuid,
        compute_instances = done.compute_instances,
        gpu_instances = done.gpu_instances,
        "destroyed mig instances"
    );
    Ok(())
}

/// A step the GPU does not support (application clocks on many boards, locked clocks
/// before Volta) is not a failure.
fn keep(errors: &mut Vec<GpuError>, result: Result<(), NvmlError>) {
    match result {
        Ok(()) => {}
        Err(NvmlError::NotSupported { call, uuid }) => {
            tracing::debug!(gpu = %uuid, call, "not supported, skipped");
        }
        Err(e) => errors.push(e.into()),
    }
}

/// The configured reset command for one GPU, `{bus_id}` and `{uuid}` filled in.
pub fn reset_command(config: &GpuConfig, uuid: &str, bus_id: &str) -> Vec<String> {
    config
        .reset_command
        .iter()
        .map(|a| a.replace("{bus_id}", bus_id).replace("{uuid}", uuid))
        .collect()
}

/// Runs the full reset of one GPU. The caller has checked that nothing uses any GPU.
pub fn full_reset(
    host: &dyn Host,
    config: &GpuConfig,
    uuid: &str,
    bus_id: &str,
) -> Result<(), GpuError> {
    let command = reset_command(config, uuid, bus_id);
    host.run(&command, RESET_TIMEOUT)
        .map_err(|reason| GpuError::Reset {
            uuid: uuid.to_string(),
            command,
            reason,
        })
}

#[cfg(test)]
mod tests {
    use super::super::nvml::fake::{Call, FakeNvml};
    use super::super::nvml::ComputeMode;
    use super::*;

    #[test]
    fn whole_gpu_reset_destroys_mig_then_resets_clocks_and_mode() {
        let nvml = FakeNvml::default();
        nvml.mig.lock().unwrap().insert("GPU-a".into());
        let config = GpuConfig {
            persistence: GpuPersistence::On,
            ..GpuConfig::default()
        };
        assert!(reset_gpu(&nvml, "GPU-a", &config, true).is_empty());
        assert_eq!(
            nvml.calls(),
            vec![
                Call::DestroyMig("GPU-a".into()),
                Call::ResetApplicationClocks("GPU-a".into()),
                Call::ResetLockedClocks("GPU-a".into()),
                Call::SetComputeMode("GPU-a".into(), ComputeMode::Default),
                Call::SetPersistence("GPU-a".into(), true),
            ]
        );
    }

    #[test]
    fn shared_gpu_keeps_mig_and_failures_are_reported() {
        let nvml = FakeNvml::default();
        nvml.mig.lock().unwrap().insert("GPU-a".into());
        let config = GpuConfig {
            reset_clocks: false,
            ..GpuConfig::default()
        };
        assert!(reset_gpu(&nvml, "GPU-a", &config, false).is_empty());
        assert_eq!(
            nvml.calls(),
            vec![Call::SetComputeMode("GPU-a".into(), ComputeMode::Default)]
        );
        nvml.failing.lock().unwrap().insert("GPU-a".into());
        let errors = reset_gpu(&nvml, "GPU-a", &config, false);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].to_string().contains("no permission"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn reset_command_fills_in_the_gpu() {
        let cmd = reset_command(&GpuConfig::default(), "GPU-a", "0000:3b:00.0");
        assert_eq!(cmd, ["nvidia-smi", "--gpu-reset", "-i", "0000:3b:00.0"]);
    }
}
