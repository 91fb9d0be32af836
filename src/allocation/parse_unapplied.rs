//! What the annotation carries that devgate does not apply (device types
//! other than gpu, rdma and fpga; VFs listed under a GPU or FPGA) is still
//! read with the types koordinator reads it with: an annotation it cannot
//! read (`json.Unmarshal` fails whole) leaves every device of the pod
//! uncounted by its scheduler and koordlet, those devgate would grant too.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::super::entry_error::{malformed, out_of_range};
use super::super::quantity::{parse_quantity, QuantityError};
use super::super::raw::{RawExtension, RawQuantity, RawVf, UniqueMap};
use super::AllocationError;

/// `DeviceAllocation` of a type devgate does not apply, as Go types it:
/// `null` quantities too (`Quantity.UnmarshalJSON` reads them as zero).
#[derive(Deserialize)]
struct RawOther {
    minor: Option<i64>,
    /// Read for its type only.
    #[serde(rename = "id")]
    _id: Option<String>,
    resources: Option<UniqueMap<Option<RawQuantity>>>,
    extension: Option<RawExtension>,
}

/// One entry of a type devgate does not apply (`npu[0]`): `null`, or an
/// object whose fields have Go's types (`Minor int32`, `ID string`,
/// quantities in Go's grammar, VFs as [`unapplied_vfs`] reads them).
pub(super) fn entry(entry: &str, raw: &RawValue) -> Result<(), AllocationError> {
    let e: Option<RawOther> = serde_json::from_str(raw.get()).map_err(|e| malformed(entry, e))?;
    let Some(e) = e else {
        return Ok(());
    };
    if let Some(m) = e.minor {
        i32::try_from(m)
            .map_err(|_| out_of_range(entry, "minor", m, "-2147483648..=2147483647"))?;
    }
    let quantities = e.resources.map(|m| m.0).unwrap_or_default();
    for (name, q) in quantities {
        if let Some(q) = q {
            go_quantity(&q).map_err(|reason| AllocationError::Quantity {
                annotation: super::ANN,
                entry: entry.to_string(),
                field: name,
                reason,
            })?;
        }
    }
    unapplied_vfs(entry, e.extension.as_ref())
}

/// VFs in the extension of an entry that is not RDMA: nothing devgate
/// applies, but typed as koordinator's `VirtualFunction` (a `busID` of 7
/// fails its whole annotation).
pub(super) fn unapplied_vfs(
    entry: &str,
    extension: Option<&RawExtension>,
) -> Result<(), AllocationError> {
    let vfs = extension.and_then(|x| x.vfs.as_deref()).unwrap_or_default();
    for (j, vf) in vfs.iter().enumerate() {
        let entry = format!("{entry}.vfs[{j}]");
        let _: RawVf = serde_json::from_str(vf.get()).map_err(|e| malformed(&entry, e))?;
    }
    Ok(())
}

/// Whether Go's `resource.ParseQuantity` reads `q`: one sign, then what
/// devgate's own grammar reads, of any size and fraction (values devgate
/// refuses where it applies them, a negative or fractional share, are
/// koordinator's to judge here).
fn go_quantity(q: &RawQuantity) -> Result<(), QuantityError> {
    let (RawQuantity::Text(s) | RawQuantity::Number(s)) = q;
    let unsigned = s.strip_prefix('-').unwrap_or(s);
    if s.len() != unsigned.len() && unsigned.starts_with(['+', '-']) {
        return Err(QuantityError::Malformed(s.clone()));
    }
    match parse_quantity(unsigned) {
        Ok(_) | Err(QuantityError::NotWhole(_) | QuantityError::Overflow(_)) => Ok(()),
        Err(e) => Err(e),
    }
}
