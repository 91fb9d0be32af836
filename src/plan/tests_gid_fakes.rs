//! Fake GID tables for the plan's communication-variable tests: a port's
//! table as the kernel lists it once its netdev has addresses, with every
//! slot read recorded.
use std::cell::RefCell;
use std::collections::HashMap;

use super::comm_env::{self, GidTable};
use super::GidSource;
use crate::config::GidFamily;
use crate::inventory::GidEntry;

pub(super) const V4: &str = "0000:0000:0000:0000:0000:ffff:0a00:0001";
pub(super) const V6: &str = "2001:0db8:0000:0000:0000:0000:0000:0001";
pub(super) const LINK_LOCAL: &str = "fe80:0000:0000:0000:ba3f:d2ff:fe19:0001";

pub(super) fn gid(index: u32, gid_type: &str, gid: &str) -> GidEntry {
    GidEntry {
        index,
        gid_type: gid_type.into(),
        gid: Some(gid.into()),
        ndev: Some("ens1f0".into()),
    }
}

/// The table a RoCE port has once its netdev has an IPv4 and an IPv6 address:
/// default GIDs from the MAC at 0 and 1, then v1/v2 pairs per address.
pub(super) fn roce_table() -> Vec<GidEntry> {
    vec![
        gid(0, "IB/RoCE v1", LINK_LOCAL),
        gid(1, "RoCE v2", LINK_LOCAL),
        gid(2, "IB/RoCE v1", V4),
        gid(3, "RoCE v2", V4),
        gid(4, "IB/RoCE v1", V6),
        gid(5, "RoCE v2", V6),
    ]
}

/// GID tables by device, recording every port read.
#[derive(Default)]
pub(super) struct FakeGids {
    tables: HashMap<String, Vec<GidEntry>>,
    pub reads: RefCell<Vec<String>>,
}

impl FakeGids {
    pub(super) fn with(devices: &[(&str, Vec<GidEntry>)]) -> FakeGids {
        FakeGids {
            tables: devices
                .iter()
                .map(|(d, t)| (d.to_string(), t.clone()))
                .collect(),
            reads: RefCell::default(),
        }
    }
}

impl GidSource for FakeGids {
    fn roce_v2_index(&self, ibdev: &str, port: u32, family: GidFamily) -> Option<u32> {
        self.reads.borrow_mut().push(format!("{ibdev}:{port}"));
        let entries = self.tables.get(ibdev).cloned().unwrap_or_default();
        comm_env::roce_v2_index(&FakeTable::new(entries), family)
    }
}

/// A GID table from its entries, recording each slot file read (`type 3`, `gid 3`).
pub(super) struct FakeTable {
    entries: Vec<GidEntry>,
    indices: Vec<u32>,
    pub reads: RefCell<Vec<String>>,
}

impl FakeTable {
    pub(super) fn new(entries: Vec<GidEntry>) -> FakeTable {
        let mut indices: Vec<u32> = entries.iter().map(|e| e.index).collect();
        indices.sort_unstable();
        FakeTable {
            entries,
            indices,
            reads: RefCell::default(),
        }
    }

    fn entry(&self, what: &str, index: u32) -> Option<&GidEntry> {
        self.reads.borrow_mut().push(format!("{what} {index}"));
        self.entries.iter().find(|e| e.index == index)
    }
}

impl GidTable for FakeTable {
    fn indices(&self) -> &[u32] {
        &self.indices
    }
    fn gid_type(&self, index: u32) -> Option<String> {
        self.entry("type", index).map(|e| e.gid_type.clone())
    }
    fn gid(&self, index: u32) -> Option<String> {
        self.entry("gid", index)?.gid.clone()
    }
}
