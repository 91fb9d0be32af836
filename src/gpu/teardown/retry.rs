//! Retrying quarantined GPUs that no pod holds: each is cleaned as a release
//! would, and returns to service once clean.

use crate::ledger::{DeviceId, Ledger, Share};

use super::super::cgroup::PodCgroups;
use super::super::GpuError;
use super::GpuTeardown;

impl GpuTeardown {
    /// Retries quarantined GPUs no pod holds: those found idle and reset leave
    /// quarantine. Returns their UUIDs. Call it periodically, outside a ledger call.
    pub fn retry_quarantined(&self, ledger: &Ledger) -> Result<Vec<String>, GpuError> {
        self.retry_quarantined_of(ledger, |_| true)
    }

    /// [`Self::retry_quarantined`] for the GPUs whose UUID `wanted` picks.
    pub fn retry_quarantined_of(
        &self,
        ledger: &Ledger,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, GpuError> {
        let ledger_err = |uuid: &str, e: crate::ledger::LedgerError| GpuError::Claims {
            uuid: uuid.to_string(),
            reason: e.to_string(),
        };
        let state = ledger.snapshot().map_err(|e| ledger_err("*", e))?;
        let mut cleared = Vec::new();
        for uuid in state.devices.values().filter_map(|rec| match &rec.device {
            DeviceId::Gpu(uuid) if rec.quarantined_unheld() && wanted(uuid) => Some(uuid),
            _ => None,
        }) {
            match self.retry_one(ledger, uuid) {
                Ok(Retried::Cleared) => cleared.push(uuid.clone()),
                Ok(Retried::Dirty(reason)) => {
                    tracing::info!(gpu = %uuid, %reason, "gpu stays quarantined")
                }
                Ok(Retried::Skipped) => {}
                Err(e) => return Err(ledger_err(uuid, e)),
            }
        }
        Ok(cleared)
    }

    /// Cleans one quarantined GPU no pod holds and returns it to service.
    /// The snapshot it was picked from may be old: another retry (a hooks-only
    /// hook beside the plugin) may have cleaned it and a new pod taken it
    /// since. So it takes the GPU's turn among releases and retries, and
    /// looks again once it has it.
    pub fn retry_one(
        &self,
        ledger: &Ledger,
        uuid: &str,
    ) -> Result<Retried, crate::ledger::LedgerError> {
        let device = DeviceId::Gpu(uuid.to_string());
        let _turn = ledger.lock_device(&device)?;
        let now = ledger.snapshot()?;
        if !now
            .devices
            .get(&device.to_string())
            .is_some_and(crate::ledger::DeviceRecord::quarantined_unheld)
        {
            return Ok(Retried::Skipped);
        }
        let errors = match self.target(uuid, Share::Exclusive, None) {
            Ok(mut t) => {
                t.whole = false; // its MIG layout may be the node's, not a tenant's
                let faults = self.clean(&PodCgroups::none(), &PodCgroups::none(), &[t]);
                faults.into_iter().map(|f| f.error).collect()
            }
            Err(e) => vec![e],
        };
        if !errors.is_empty() {
            return Ok(Retried::Dirty(nri::ErrorChain::join(&errors)));
        }
        ledger.clear_quarantine(&device)?;
        Ok(Retried::Cleared)
    }
}

/// What a retry of one quarantined GPU did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retried {
    /// Found idle and reset: back in service.
    Cleared,
    /// Not quarantined, or held by a pod (whose release retries it): untouched.
    Skipped,
    /// Still in use, or a step failed (why): it stays quarantined.
    Dirty(String),
}
