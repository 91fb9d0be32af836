//! What a GPU library (NVML) adds to discovery: its index, memory and health
//! win over what sysfs and procfs give; a GPU it does not know keeps those.

use std::collections::BTreeMap;

use super::*;
use crate::fixture::HostRootBuilder;

/// A GPU library answering from a table.
struct Table(BTreeMap<PciAddr, GpuFacts>);

impl GpuLibrary for Table {
    fn gpu(&self, bus_id: PciAddr) -> Option<GpuFacts> {
        self.0.get(&bus_id).cloned()
    }
}

#[test]
fn the_librarys_index_memory_and_health_win() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx().build(dir.path()).unwrap();
    let plain = discover(fixture.root());
    let buses: Vec<PciAddr> = plain.gpus.iter().map(|g| g.bus_id).collect();
    let mut table = BTreeMap::new();
    // Every GPU but the last, with indices NVML would never give PCI order.
    for (pos, bus) in buses[..buses.len() - 1].iter().enumerate() {
        table.insert(
            *bus,
            GpuFacts {
                index: Some(10 + pos as u32),
                memory_bytes: Some(80 << 30),
                health: (pos == 1).then(|| Health::Unhealthy {
                    reason: "xid 79".to_string(),
                }),
            },
        );
    }
    let inv = discover_with(fixture.root(), &Table(table));
    assert_eq!(inv.gpus.len(), buses.len());
    let last = buses.len() - 1;
    for (pos, gpu) in inv.gpus.iter().enumerate() {
        assert_eq!(gpu.bus_id, buses[pos]);
        if pos == last {
            assert_eq!(gpu.index, pos as u32, "unknown to the library: PCI order");
            assert_eq!(gpu.memory_bytes, None);
            assert_eq!(gpu.health, Health::Healthy);
            continue;
        }
        assert_eq!(gpu.index, 10 + pos as u32);
        assert_eq!(gpu.memory_bytes, Some(80 << 30));
        let want = if pos == 1 {
            Health::Unhealthy {
                reason: "xid 79".to_string(),
            }
        } else {
            Health::Healthy
        };
        assert_eq!(gpu.health, want, "gpu {pos}");
        // Everything else is the host's.
        assert_eq!(gpu.uuid, plain.gpus[pos].uuid);
        assert_eq!(gpu.minor, plain.gpus[pos].minor);
    }
}
