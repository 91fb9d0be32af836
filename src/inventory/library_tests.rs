//! What a GPU library (NVML) adds to discovery: its index, memory and health
//! win over what sysfs and procfs give; a GPU it does not know keeps those.

use std::collections::BTreeMap;

use super::*;
use crate::fixture::HostRootBuilder;

/// A GPU library answering from a table.
struct Table(BTreeMap<PciAddr, GpuFacts>);

impl GpuLibrary for Table {
    fn gpu(&self, bus_id: PciAddr, _uuid: &str) -> Option<GpuFacts> {
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
            assert_eq!(
                gpu.index,
                10 + last as u32,
                "unknown to the library: after its indices"
            );
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

/// NVML numbers only the GPUs it knows, so one it lost shifts the rest down
/// a place: the lost GPU's PCI position is the next GPU's index. It takes a
/// number after the library's instead, so no two GPUs share one.
#[test]
fn a_gpu_the_library_lost_takes_no_index_another_gpu_has() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx().build(dir.path()).unwrap();
    let buses: Vec<PciAddr> = discover(fixture.root())
        .gpus
        .iter()
        .map(|g| g.bus_id)
        .collect();
    let table = buses
        .iter()
        .enumerate()
        .filter(|(pos, _)| *pos != 1)
        .map(|(pos, bus)| {
            let index = if pos == 0 { 0 } else { pos as u32 - 1 };
            let facts = GpuFacts {
                index: Some(index),
                ..GpuFacts::default()
            };
            (*bus, facts)
        })
        .collect();
    let inv = discover_with(fixture.root(), &Table(table));
    let mut indices: Vec<u32> = inv.gpus.iter().map(|g| g.index).collect();
    assert_eq!(indices[1], buses.len() as u32 - 1, "after the library's");
    indices.sort_unstable();
    indices.dedup();
    assert_eq!(indices.len(), buses.len(), "{indices:?}");
}

/// A library that records the GPUs it is asked about and knows none.
#[derive(Default)]
struct Asked(std::sync::Mutex<Vec<PciAddr>>);

impl GpuLibrary for Asked {
    fn gpu(&self, bus_id: PciAddr, _uuid: &str) -> Option<GpuFacts> {
        self.0.lock().unwrap().push(bus_id);
        None
    }
}

/// A GPU excluded by `NVreg_ExcludedGpus` is never asked about: the library
/// lists none, and a GPU it misses makes every read start it again.
#[test]
fn an_excluded_gpu_is_not_asked_about() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx().build(dir.path()).unwrap();
    let excluded = fixture.expected().gpus[2].bus_id;
    let info = fixture
        .root()
        .join(format!("proc/driver/nvidia/gpus/{excluded}/information"));
    let text = std::fs::read_to_string(&info).unwrap();
    std::fs::write(
        &info,
        text.replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"),
    )
    .unwrap();
    let asked = Asked::default();
    let inv = discover_with(fixture.root(), &asked);
    let asked = asked.0.into_inner().unwrap();
    assert_eq!(asked.len(), fixture.expected().gpus.len() - 1, "{asked:?}");
    assert!(!asked.contains(&excluded), "{asked:?}");
    let gpu = inv.gpus.iter().find(|g| g.bus_id == excluded).unwrap();
    assert!(matches!(gpu.health, Health::Unhealthy { .. }), "{gpu:?}");
}
