//! The ledger's journal: changes appended as one line each instead of
//! rewriting the whole document. A change to one pod's record that moves no
//! claim (a container admitted to a pod that holds its devices already, a
//! container removed, the pod's network handed back), or a pod's claim: its
//! new record and the records of the devices it claimed.
//!
//! A pod's containers and every removal change little of the document, yet a
//! replace of the whole document creates and frees an inode each time
//! (`openat`, `renameat` and the eviction of the old version: most of a
//! transaction's cost, see docs/performance.md). An append is one `write`.
//!
//! Each line carries the generation of the document it follows; every whole
//! write of the document bumps the generation (with the journal folded in) and
//! then empties the journal, so lines a crash left behind between the two are
//! ignored. A line is a change to one pod: the records of the containers it
//! touched (null for one removed), the pod's network owner and its count of
//! containers ever recorded, in the field `gen`. Lines of the first form,
//! which releases before it wrote (the pod's whole record, or null for a pod
//! gone, in the field `g`), are still read. A change carries `g` too, as
//! [`NO_GENERATION`], so that a reader of that release skips it as a line of
//! another generation: after a downgrade that followed a crash (no fold at
//! exit), such a reader lacks the changes' container records. A claim (field `set`: records set whole) names no generation in the
//! fields of either earlier form, so that every reader of those refuses the
//! ledger ("a line names no generation") rather than miss a claim and give
//! its devices out twice. Replaying a line twice changes nothing, and lines
//! apply in order. A line
//! without its newline is an append cut short (a writer killed in the middle of
//! `write`, which the kernel may leave partly done between pages,
//! mm/filemap.c `generic_perform_write`) or still in progress: it is no part of
//! the ledger, and the next writer cuts it off under the lock before appending.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, Serializer};

use super::model::{ContainerRecord, DeviceRecord, LedgerState, PodRecord};

pub(super) const JOURNAL_FILE: &str = "ledger.journal";

/// A line that would take the journal past this length is not appended: its
/// transaction writes the whole document instead,
/// which empties the journal: it bounds what every reader parses on top of
/// the document (the hook reads the ledger on the container start path).
pub(super) const COMPACT_AT: u64 = 32 * 1024;

/// The `g` of a change: a generation no document reaches (each whole write
/// adds one), so that readers of the first form skip the line.
const NO_GENERATION: u64 = u64::MAX;

/// A change to one pod (the form written now).
#[derive(Serialize)]
struct ChangeOut<'a> {
    g: u64,
    gen: u64,
    sandbox: &'a str,
    containers: Touched<'a>,
    owner: Option<&'a str>,
    admitted: u32,
}

/// The records of the containers a change touched, as a map, null for one gone.
struct Touched<'a> {
    pod: &'a PodRecord,
    ids: &'a [&'a str],
}

impl Serialize for Touched<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.ids.iter().map(|id| (id, self.pod.containers.get(*id))))
    }
}

/// Records set whole: one pod's, and those of the devices named (null for
/// one gone). Neither `g` nor `gen`: readers of the forms before refuse it.
#[derive(Serialize)]
struct SetOut<'a> {
    set: u64,
    sandbox: &'a str,
    pod: Option<&'a PodRecord>,
    devices: DevicesOut<'a>,
}

/// The records of the devices a line sets, as a map, null for one gone.
struct DevicesOut<'a> {
    state: &'a LedgerState,
    keys: &'a [String],
}

impl Serialize for DevicesOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.keys.iter().map(|k| (k, self.state.devices.get(k))))
    }
}

/// A line of any form.
#[derive(Deserialize)]
struct LineIn {
    g: Option<u64>,
    gen: Option<u64>,
    set: Option<u64>,
    sandbox: String,
    pod: Option<PodRecord>,
    #[serde(default)]
    containers: BTreeMap<String, Option<ContainerRecord>>,
    owner: Option<String>,
    /// The pod's count of containers ever recorded; absent from the lines
    /// of releases before it, whose pods read it from their containers.
    #[serde(default)]
    admitted: Option<u32>,
    #[serde(default)]
    devices: BTreeMap<String, Option<DeviceRecord>>,
}

/// Appends to `buf` the line that sets, in `pod`'s record (`sandbox` in a
/// document of `generation`), the records of `containers` (removing those
/// `pod` lacks) and the network owner to what `pod` holds.
pub(super) fn encode(
    buf: &mut Vec<u8>,
    generation: u64,
    sandbox: &str,
    pod: &PodRecord,
    containers: &[&str],
) -> Result<(), serde_json::Error> {
    let line = ChangeOut {
        g: NO_GENERATION,
        gen: generation,
        sandbox,
        containers: Touched {
            pod,
            ids: containers,
        },
        owner: pod.network_owner.as_deref(),
        admitted: pod.admitted,
    };
    // Compact JSON escapes every newline inside strings: one line per change.
    serde_json::to_writer(&mut *buf, &line)?;
    buf.push(b'\n');
    Ok(())
}

/// Appends to `buf` the line that sets `sandbox`'s record and those of the
/// devices keyed `devices` to what `state` (of its generation) holds: a claim.
pub(super) fn encode_set(
    buf: &mut Vec<u8>,
    state: &LedgerState,
    sandbox: &str,
    devices: &[String],
) -> Result<(), serde_json::Error> {
    let line = SetOut {
        set: state.generation,
        sandbox,
        pod: state.pods.get(sandbox),
        devices: DevicesOut {
            state,
            keys: devices,
        },
    };
    serde_json::to_writer(&mut *buf, &line)?;
    buf.push(b'\n');
    Ok(())
}

/// What [`replay`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Replayed {
    /// The length of the complete lines: the rest is a tail without its
    /// newline, no part of the ledger.
    pub complete: usize,
    /// Lines of another generation were skipped: the text is not the journal
    /// of `state`'s document alone (a reader without the lock that read the
    /// journal between a replace of the document and the journal's emptying,
    /// or lines a crash left), so its length names no content of this
    /// generation.
    pub other_generations: bool,
}

/// Applies the complete lines of `text` written for `state`'s generation.
pub(super) fn replay(state: &mut LedgerState, text: &[u8]) -> Result<Replayed, String> {
    let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut other_generations = false;
    let mut offset = 0;
    for line in text[..complete].split_inclusive(|&b| b == b'\n') {
        let at = offset;
        offset += line.len();
        if line == b"\n" {
            continue;
        }
        let line: LineIn =
            serde_json::from_slice(line).map_err(|e| format!("journal line at byte {at}: {e}"))?;
        let applied = apply(state, line).map_err(|e| format!("journal line at byte {at}: {e}"))?;
        other_generations |= !applied;
    }
    Ok(Replayed {
        complete,
        other_generations,
    })
}

/// Applies one line; `false` when it is of another generation.
fn apply(state: &mut LedgerState, line: LineIn) -> Result<bool, &'static str> {
    let now = state.generation;
    match (line.set, line.gen, line.g) {
        (Some(set), _, _) if set == now => {
            put(&mut state.pods, line.sandbox, line.pod);
            for (key, record) in line.devices {
                put(&mut state.devices, key, record);
            }
        }
        (None, Some(gen), _) if gen == now => {
            // Written under the lock while the pod was in this generation's
            // document, which only a whole write (a new generation) drops it from.
            let pod = state
                .pods
                .get_mut(&line.sandbox)
                .ok_or("a change to a pod the ledger does not hold")?;
            for (id, record) in line.containers {
                put(&mut pod.containers, id, record);
            }
            pod.network_owner = line.owner;
            // Set, as every field a line carries: replayed twice, the same.
            if let Some(admitted) = line.admitted {
                pod.admitted = admitted;
            }
        }
        (None, None, Some(g)) if g == now && g != NO_GENERATION => {
            put(&mut state.pods, line.sandbox, line.pod);
        }
        (Some(_), _, _) | (None, Some(_), _) | (None, None, Some(_)) => return Ok(false),
        (None, None, None) => return Err("a line names no generation"),
    }
    Ok(true)
}

/// Sets `key` to `value`, or removes it for none: every line sets values.
fn put<V>(map: &mut BTreeMap<String, V>, key: String, value: Option<V>) {
    match value {
        Some(value) => map.insert(key, value),
        None => map.remove(&key),
    };
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
