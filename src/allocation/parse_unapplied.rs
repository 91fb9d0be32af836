//! What the annotation carries that devgate does not apply (device types
//! other than gpu, rdma and fpga; VFs listed under a GPU or FPGA) is still
//! read with the types koordinator reads it with: an annotation it cannot
//! read (`json.Unmarshal` fails whole) leaves every device of the pod
//! uncounted by its scheduler and koordlet, those devgate would grant too.

use super::super::entry_error::{malformed, out_of_range};
use super::super::raw::{RawEntry, RawExtension, RawVf};
use super::{AllocationError, Parser};

impl Parser {
    /// An entry of a type devgate does not apply: only its shape is checked,
    /// with Go's types (`Minor int32`, and `resources` as quantities).
    pub(super) fn other(&mut self, entry: &str, e: RawEntry) -> Result<(), AllocationError> {
        if let Some(m) = e.minor {
            i32::try_from(m)
                .map_err(|_| out_of_range(entry, "minor", m, "-2147483648..=2147483647"))?;
        }
        self.unapplied_vfs(entry, e.extension.as_ref())
    }

    /// VFs in the extension of an entry that is not RDMA: nothing devgate
    /// applies, but typed as koordinator's `VirtualFunction` (a `busID` of
    /// 7 fails its whole annotation).
    pub(super) fn unapplied_vfs(
        &mut self,
        entry: &str,
        extension: Option<&RawExtension>,
    ) -> Result<(), AllocationError> {
        let vfs = extension.and_then(|x| x.vfs.as_deref()).unwrap_or_default();
        for (j, vf) in vfs.iter().enumerate() {
            let entry = format!("{entry}.vfs[{j}]");
            self.count(&entry)?;
            let _: RawVf = serde_json::from_str(vf.get()).map_err(|e| malformed(&entry, e))?;
        }
        Ok(())
    }
}
