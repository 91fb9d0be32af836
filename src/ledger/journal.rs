//! The ledger's journal: changes to one pod's record that move no claim (a
//! container admitted to a pod that holds its devices already, a container
//! removed, the pod's network handed back), appended as one line each instead
//! of rewriting the whole document.
//!
//! A pod's further containers and every removal change nothing but their pod's
//! record, yet a replace of the whole document creates and frees an inode each
//! time (`openat`, `renameat` and the eviction of the old version: most of a
//! transaction's cost, see docs/performance.md). An append is one `write`.
//!
//! Each line carries the generation of the document it follows; every whole
//! write of the document bumps the generation (with the journal folded in) and
//! then empties the journal, so lines a crash left behind between the two are
//! ignored. A line is the pod's whole record, or null for a pod gone: replaying
//! a line twice changes nothing, and the last line of a pod wins. A line
//! without its newline is an append cut short (a writer killed in the middle of
//! `write`, which the kernel may leave partly done between pages,
//! mm/filemap.c `generic_perform_write`) or still in progress: it is no part of
//! the ledger, and the next writer cuts it off under the lock before appending.

use serde::{Deserialize, Serialize};

use super::model::{LedgerState, PodRecord};

pub(super) const JOURNAL_FILE: &str = "ledger.journal";

/// A line that would take the journal past this length is not appended: its
/// transaction writes the whole document instead,
/// which empties the journal: it bounds what every reader parses on top of
/// the document (the hook reads the ledger on the container start path).
pub(super) const COMPACT_AT: u64 = 32 * 1024;

#[derive(Serialize)]
struct LineOut<'a> {
    g: u64,
    sandbox: &'a str,
    pod: Option<&'a PodRecord>,
}

#[derive(Deserialize)]
struct LineIn {
    g: u64,
    sandbox: String,
    pod: Option<PodRecord>,
}

/// Appends to `buf` the line that sets `sandbox`'s record to what `state` holds
/// (or removes it).
pub(super) fn encode(
    buf: &mut Vec<u8>,
    state: &LedgerState,
    sandbox: &str,
) -> Result<(), serde_json::Error> {
    let line = LineOut {
        g: state.generation,
        sandbox,
        pod: state.pods.get(sandbox),
    };
    // Compact JSON escapes every newline inside strings: one line per change.
    serde_json::to_writer(&mut *buf, &line)?;
    buf.push(b'\n');
    Ok(())
}

/// Applies the complete lines of `text` written for `state`'s generation, and
/// returns the length of those complete lines: the rest is a tail without its
/// newline, no part of the ledger.
pub(super) fn replay(state: &mut LedgerState, text: &[u8]) -> Result<usize, String> {
    let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut offset = 0;
    for line in text[..complete].split_inclusive(|&b| b == b'\n') {
        let at = offset;
        offset += line.len();
        if line == b"\n" {
            continue;
        }
        let line: LineIn =
            serde_json::from_slice(line).map_err(|e| format!("journal line at byte {at}: {e}"))?;
        if line.g != state.generation {
            continue;
        }
        match line.pod {
            Some(pod) => state.pods.insert(line.sandbox, pod),
            None => state.pods.remove(&line.sandbox),
        };
    }
    Ok(complete)
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
