//! The `device-allocated` parser: serde into permissive raw shapes, then one
//! validation pass that turns them into typed entries with precise errors.
//!
//! Each entry is parsed from its own raw JSON text so that an error can name it
//! (`gpu[1]`), and objects are read with duplicate-key detection: Go's decoder keeps
//! the last duplicate, and devgate must not read a different device than koordlet.
use std::collections::BTreeMap;

use serde_json::value::RawValue;

use super::entry_error::{malformed, missing, negative, out_of_range, too_many};
use super::raw::{RawEntry, RawQuantity, RawVf, UniqueMap};
use super::*;
use crate::inventory::PciAddr;

#[path = "parse_containers.rs"]
mod containers;
#[path = "parse_unapplied.rs"]
mod unapplied;

pub(crate) use containers::is_dns_label;
pub(super) use containers::parse_containers;

const ANN: &str = DEVICE_ALLOCATED;
/// Longest value echoed back in an error message.
const MAX_ECHO: usize = 64;

/// Parses the value of `scheduling.koordinator.sh/device-allocated`.
pub fn parse_allocation(bytes: &[u8]) -> Result<Allocation, AllocationError> {
    if bytes.len() > MAX_ANNOTATION_BYTES {
        return Err(AllocationError::TooLarge {
            annotation: ANN,
            len: bytes.len(),
            limit: MAX_ANNOTATION_BYTES,
        });
    }
    if nesting_depth(bytes) > GO_MAX_NESTING {
        return Err(AllocationError::Malformed {
            annotation: ANN,
            entry: "-".into(),
            reason: format!("nested deeper than {GO_MAX_NESTING} levels, which koordinator's json reader refuses"),
        });
    }
    let top: UniqueMap<Box<RawValue>> =
        serde_json::from_slice(bytes).map_err(|e| malformed("-", e))?;
    if top.0.len() > MAX_TYPES {
        return Err(too_many("-", "device types", MAX_TYPES));
    }
    let mut p = Parser::default();
    for (kind, raw) in &top.0 {
        check_name("-", "device type", kind, MAX_TYPE_LEN, NameRule::Token)?;
        match kind.as_str() {
            "gpu" | "rdma" | "fpga" => p.device_type(kind, raw)?,
            _ => {
                unapplied::device_type(kind, raw)?;
                p.out.ignored_types.push(kind.clone());
            }
        }
    }
    Ok(p.out)
}

/// Go's `encoding/json`, which koordlet and koord-scheduler read the
/// annotation with, refuses text nested deeper than this (`maxNestingDepth`,
/// scanner.go): devgate refuses it too, so that it never grants devices from
/// an annotation they cannot read (and so never counted).
const GO_MAX_NESTING: usize = 10_000;

/// The deepest nesting of arrays and objects in JSON text, strings skipped;
/// bytes, not a parse: malformed text is serde_json's to refuse.
fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[derive(Default)]
struct Parser {
    out: Allocation,
    entries: usize,
    /// Every device seen so far (e.g. `gpu minor 3`, `vf 0000:19:00.2`) → its entry.
    seen: BTreeMap<String, String>,
}

impl Parser {
    fn device_type(&mut self, kind: &str, raw: &RawValue) -> Result<(), AllocationError> {
        for (i, raw) in entries(kind, raw)?.iter().enumerate() {
            let entry = format!("{kind}[{i}]");
            self.count(&entry)?;
            super::spelling::check_entry(&entry, raw)?;
            let e: RawEntry = serde_json::from_str(raw.get()).map_err(|e| malformed(&entry, e))?;
            match kind {
                "gpu" => {
                    let gpu = self.gpu(&entry, e)?;
                    self.out.gpus.push(gpu);
                }
                "rdma" => {
                    let rdma = self.rdma(&entry, e)?;
                    self.out.rdma.push(rdma);
                }
                _ => {
                    let fpga = self.fpga(&entry, e)?;
                    self.out.fpga.push(fpga);
                }
            }
        }
        Ok(())
    }

    fn count(&mut self, entry: &str) -> Result<(), AllocationError> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES {
            return Err(too_many(entry, "entries", MAX_ENTRIES));
        }
        Ok(())
    }

    /// Records `key` as taken by `entry`, or fails naming the first holder.
    fn unique(&mut self, entry: &str, key: String) -> Result<(), AllocationError> {
        if let Some(first) = self.seen.get(&key) {
            return Err(AllocationError::Duplicate {
                annotation: ANN,
                entry: entry.to_string(),
                what: key,
                first: first.clone(),
            });
        }
        self.seen.insert(key, entry.to_string());
        Ok(())
    }

    fn gpu(&mut self, entry: &str, e: RawEntry) -> Result<GpuEntry, AllocationError> {
        unapplied::unapplied_vfs(entry, e.extension.as_ref())?;
        let minor = device_minor(entry, e.minor)?;
        self.unique(entry, format!("gpu minor {minor}"))?;
        let uuid = non_empty(e.id);
        if let Some(id) = &uuid {
            check_name(entry, "id", id, MAX_ID_LEN, NameRule::Token)?;
            self.unique(entry, format!("gpu id {id}"))?;
        }
        let mut res = GpuResources::default();
        for (name, value) in resources(entry, e.resources)? {
            match name.as_str() {
                RES_GPU_CORE => res.core_percent = Some(percent(entry, &name, value, 0)?),
                RES_GPU_MEMORY_RATIO => {
                    res.memory_ratio_percent = Some(percent(entry, &name, value, 0)?)
                }
                RES_GPU_MEMORY => res.memory_bytes = Some(value),
                _ => {}
            }
        }
        Ok(GpuEntry {
            minor,
            uuid,
            resources: res,
        })
    }

    fn rdma(&mut self, entry: &str, e: RawEntry) -> Result<RdmaEntry, AllocationError> {
        let minor = device_minor(entry, e.minor)?;
        self.unique(entry, format!("rdma minor {minor}"))?;
        let pf = match non_empty(e.id) {
            Some(id) => {
                let pf = bus_id(entry, "id", &id)?;
                self.unique(entry, format!("pf {pf}"))?;
                Some(pf)
            }
            None => None,
        };
        let mut share_percent = FULL_SHARE;
        for (name, value) in resources(entry, e.resources)? {
            if name == RES_RDMA {
                share_percent = percent(entry, &name, value, 1)?;
            }
        }
        let mut vfs = Vec::new();
        let raw_vfs = e.extension.and_then(|x| x.vfs).unwrap_or_default();
        for (j, vf) in raw_vfs.into_iter().enumerate() {
            let entry = format!("{entry}.vfs[{j}]");
            self.count(&entry)?;
            let vf: RawVf = serde_json::from_str(vf.get()).map_err(|e| malformed(&entry, e))?;
            let text = vf.bus_id.ok_or_else(|| missing(&entry, "busID"))?;
            let bus = bus_id(&entry, "busID", &text)?;
            self.unique(&entry, format!("vf {bus}"))?;
            let minor = match vf.minor {
                None => None,
                Some(m) if m < -1 => return Err(negative(&entry, "minor", m)),
                Some(m) => Some(
                    i32::try_from(m)
                        .map_err(|_| out_of_range(&entry, "minor", m, "-1..=2147483647"))?,
                ),
            };
            vfs.push(VfRef { bus_id: bus, minor });
        }
        Ok(RdmaEntry {
            minor,
            pf,
            share_percent,
            vfs,
        })
    }

    fn fpga(&mut self, entry: &str, e: RawEntry) -> Result<FpgaEntry, AllocationError> {
        unapplied::unapplied_vfs(entry, e.extension.as_ref())?;
        let minor = device_minor(entry, e.minor)?;
        self.unique(entry, format!("fpga minor {minor}"))?;
        let id = non_empty(e.id);
        if let Some(id) = &id {
            check_name(entry, "id", id, MAX_ID_LEN, NameRule::Token)?;
        }
        resources(entry, e.resources)?;
        Ok(FpgaEntry { minor, id })
    }
}

/// The entries of device type `kind` (`null`: none), each as its JSON text.
fn entries(kind: &str, raw: &RawValue) -> Result<Vec<Box<RawValue>>, AllocationError> {
    let list: Option<Vec<Box<RawValue>>> =
        serde_json::from_str(raw.get()).map_err(|e| malformed(kind, e))?;
    Ok(list.unwrap_or_default())
}

/// Go's `omitempty` drops empty strings, so an empty `id` means "not filled".
fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// A device minor: Koordinator's int32, never negative for a device.
fn device_minor(entry: &str, minor: Option<i64>) -> Result<u32, AllocationError> {
    let m = minor.ok_or_else(|| missing(entry, "minor"))?;
    if m < 0 {
        return Err(negative(entry, "minor", m));
    }
    match i32::try_from(m) {
        Ok(v) => Ok(v.unsigned_abs()),
        Err(_) => Err(out_of_range(entry, "minor", m, "0..=2147483647")),
    }
}

/// Checks resource names and parses every quantity; returns (name, value) in order.
fn resources(
    entry: &str,
    raw: Option<UniqueMap<RawQuantity>>,
) -> Result<Vec<(String, u64)>, AllocationError> {
    let raw = raw.map(|m| m.0).unwrap_or_default();
    if raw.len() > MAX_RESOURCES {
        return Err(too_many(entry, "resources", MAX_RESOURCES));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (name, q) in raw {
        check_name(
            entry,
            "resource name",
            &name,
            MAX_RESOURCE_NAME_LEN,
            NameRule::Qualified,
        )?;
        let field = format!("resources[{name}]");
        let value = q.value().map_err(|reason| AllocationError::Quantity {
            annotation: ANN,
            entry: entry.to_string(),
            field,
            reason,
        })?;
        out.push((name, value));
    }
    Ok(out)
}

/// A share in percent of one device: at most 100, at least `min`.
fn percent(entry: &str, name: &str, value: u64, min: u64) -> Result<u32, AllocationError> {
    let range = if min == 0 { "0..=100" } else { "1..=100" };
    match u32::try_from(value) {
        Ok(v) if value >= min && v <= FULL_SHARE => Ok(v),
        _ => Err(AllocationError::OutOfRange {
            annotation: ANN,
            entry: entry.to_string(),
            field: format!("resources[{name}]"),
            // A quantity past int64 is refused before (Go's `Quantity`).
            value: i64::try_from(value).unwrap_or(i64::MAX),
            range,
        }),
    }
}

fn bus_id(entry: &str, field: &'static str, text: &str) -> Result<PciAddr, AllocationError> {
    check_name(entry, field, text, 16, NameRule::Token)?;
    text.parse().map_err(|_| AllocationError::BadBusId {
        annotation: ANN,
        entry: entry.to_string(),
        field,
        value: clip(text),
    })
}

#[derive(Clone, Copy)]
enum NameRule {
    /// Letters, digits, `-`, `_`, `.`, `:` (UUIDs, PCI addresses, type names).
    Token,
    /// A Kubernetes qualified name: a Token with at most one `/` (prefix/name).
    Qualified,
}

/// Rejects anything that could act as a path: `/` (beyond a qualified name's one),
/// `..`, NUL and every other character outside a conservative set.
fn check_name(
    entry: &str,
    field: &str,
    value: &str,
    max: usize,
    rule: NameRule,
) -> Result<(), AllocationError> {
    if value.len() > max {
        return Err(AllocationError::TooLong {
            annotation: ANN,
            entry: entry.to_string(),
            field: field.to_string(),
            limit: max,
        });
    }
    let token = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':');
    let slashes = value.bytes().filter(|&b| b == b'/').count();
    let ok = !value.is_empty()
        && !value.contains("..")
        && value.bytes().all(|b| token(b) || b == b'/')
        && match rule {
            NameRule::Token => slashes == 0,
            NameRule::Qualified => slashes <= 1 && !value.starts_with('/') && !value.ends_with('/'),
        };
    if ok {
        return Ok(());
    }
    Err(AllocationError::BadName {
        annotation: ANN,
        entry: entry.to_string(),
        field: field.to_string(),
        value: clip(value),
    })
}

/// At most [`MAX_ECHO`] characters of untrusted text, for error messages.
pub(super) fn clip(s: &str) -> String {
    s.chars().take(MAX_ECHO).collect()
}
