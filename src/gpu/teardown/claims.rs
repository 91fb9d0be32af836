//! What GPU teardown asks of the ledger: who holds a device, and whether
//! another sandbox of the released pod is alive.

use crate::ledger::{DeviceId, Ledger, PodRef};

/// Who holds a device now.
pub trait ClaimView: Send + Sync {
    /// The sandbox ids holding `device`.
    fn holders(&self, device: &DeviceId) -> Result<Vec<String>, String>;

    /// The sandboxes other than `pod`'s own with a record of the same pod UID:
    /// a pod whose sandbox kubelet recreated has two for a while.
    fn siblings(&self, pod: &PodRef) -> Result<Vec<String>, String>;
}

impl ClaimView for Ledger {
    fn holders(&self, device: &DeviceId) -> Result<Vec<String>, String> {
        self.holders_now(device).map_err(|e| e.to_string())
    }

    fn siblings(&self, pod: &PodRef) -> Result<Vec<String>, String> {
        if pod.uid.is_empty() {
            return Ok(Vec::new());
        }
        let state = self.snapshot().map_err(|e| e.to_string())?;
        Ok(state
            .pods
            .values()
            .filter(|p| p.pod.uid == pod.uid && p.pod.sandbox_id != pod.sandbox_id)
            .map(|p| p.pod.sandbox_id.clone())
            .collect())
    }
}
