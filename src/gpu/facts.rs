//! What the plugin's inventory takes from NVML (each GPU's index and memory),
//! under `[gpu] nvml` and `nvml_library` like every other use of NVML, and
//! asked once per set of GPUs.
//!
//! The inventory is read again on the request path when a pod names a device
//! it lacks, which any pod author can make happen. Loading and initialising
//! NVML takes long on a node without persistence mode, so a re-read answers
//! from the facts of the last one while the node has the same GPUs, and asks
//! NVML again only when GPUs came or went (indices follow PCI order among the
//! GPUs present, so one leaving moves the others').

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::config::NvmlLibraries;
use crate::inventory::{discover_with, GpuFacts, GpuLibrary, Inventory, PciAddr};

/// Opens the GPU library for one read of the host; `None` when it cannot load.
pub type OpenLibrary = dyn Fn() -> Option<Box<dyn GpuLibrary>> + Send + Sync;

/// The GPU facts of the host as last read, and how to ask for them afresh.
pub struct NodeFacts {
    /// `None`: NVML is off (`[gpu] nvml = false`, or not yet configured).
    open: RwLock<Option<Arc<OpenLibrary>>>,
    /// Per GPU the last read asked about, its UUID and what it learnt;
    /// `None` before the first.
    seen: Mutex<Option<BTreeMap<PciAddr, (String, GpuFacts)>>>,
}

impl NodeFacts {
    /// NVML from the first of `libraries` that loads; `None` turns it off.
    /// It gives facts only of GPUs it names as the host root does (by UUID
    /// at the same bus id), so a simulated root never takes the driver's.
    pub fn nvml(libraries: Option<NvmlLibraries>) -> NodeFacts {
        NodeFacts::with_library(nvml_opener(libraries))
    }

    pub fn with_library(open: Option<Arc<OpenLibrary>>) -> NodeFacts {
        NodeFacts {
            open: RwLock::new(open),
            seen: Mutex::new(None),
        }
    }

    /// Puts another `[gpu]` NVML setting in force; the next read asks afresh.
    pub fn set_nvml(&self, libraries: Option<NvmlLibraries>) {
        *self.open.write().unwrap_or_else(PoisonError::into_inner) = nvml_opener(libraries);
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Reads `host_root`, with the facts of the last read where the node has
    /// the same GPUs, else with the library's.
    pub fn discover(&self, host_root: &Path) -> Inventory {
        // Held through the read: two reads at once would both ask the library.
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = seen.as_ref() {
            let kept = Kept {
                known,
                asked: RefCell::default(),
                stranger: Cell::new(false),
            };
            let inv = discover_with(host_root, &kept);
            if !kept.stranger.get() && kept.asked.into_inner().iter().eq(known.keys()) {
                return inv;
            }
        }
        let open = self
            .open
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let asking = Asking {
            open: open.as_deref(),
            library: OnceCell::new(),
            learnt: RefCell::default(),
            missed: Cell::new(false),
        };
        let inv = discover_with(host_root, &asking);
        // A library that did not load (the driver's userspace not there yet)
        // or did not know a GPU is asked again at the next read.
        *seen = (!asking.missed.get()).then(|| asking.learnt.into_inner());
        inv
    }
}

fn nvml_opener(libraries: Option<NvmlLibraries>) -> Option<Arc<OpenLibrary>> {
    let libraries = libraries?;
    Some(Arc::new(move || {
        super::nvml::NvmlGpuLibrary::open(libraries.candidates())
            .map(|l| Box::new(l) as Box<dyn GpuLibrary>)
    }))
}

/// The last read's facts; notes which GPUs this read asked about, and
/// whether one was a stranger to it (a GPU come since, or one replaced at a
/// known bus id): the library is then asked afresh.
struct Kept<'a> {
    known: &'a BTreeMap<PciAddr, (String, GpuFacts)>,
    asked: RefCell<BTreeSet<PciAddr>>,
    stranger: Cell<bool>,
}

impl GpuLibrary for Kept<'_> {
    fn gpu(&self, bus_id: PciAddr, uuid: &str) -> Option<GpuFacts> {
        self.asked.borrow_mut().insert(bus_id);
        match self.known.get(&bus_id) {
            Some((known_uuid, facts)) if known_uuid == uuid => Some(facts.clone()),
            _ => {
                self.stranger.set(true);
                None
            }
        }
    }
}

/// The library, opened at the first GPU asked about and closed with the read.
struct Asking<'a> {
    open: Option<&'a OpenLibrary>,
    library: OnceCell<Option<Box<dyn GpuLibrary>>>,
    learnt: RefCell<BTreeMap<PciAddr, (String, GpuFacts)>>,
    /// A GPU the library, which is on, gave no facts for.
    missed: Cell<bool>,
}

impl GpuLibrary for Asking<'_> {
    fn gpu(&self, bus_id: PciAddr, uuid: &str) -> Option<GpuFacts> {
        let library = self
            .library
            .get_or_init(|| self.open.and_then(|open| open()));
        let facts = library.as_ref().and_then(|l| l.gpu(bus_id, uuid));
        if facts.is_none() && self.open.is_some() {
            self.missed.set(true);
        }
        let learnt = (uuid.to_string(), facts.clone().unwrap_or_default());
        self.learnt.borrow_mut().insert(bus_id, learnt);
        facts
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::fixture::{Fixture, HostRootBuilder};

    /// A library that numbers the GPUs backwards, as NVML may, and counts its loads.
    struct Backwards;

    impl GpuLibrary for Backwards {
        fn gpu(&self, bus_id: PciAddr, _uuid: &str) -> Option<GpuFacts> {
            Some(GpuFacts {
                index: Some(255 - u32::from(bus_id.bus)),
                memory_bytes: Some(80 << 30),
                health: None,
            })
        }
    }

    fn counting() -> (Arc<AtomicUsize>, NodeFacts) {
        let loads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&loads);
        let open: Arc<OpenLibrary> = Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Some(Box::new(Backwards) as Box<dyn GpuLibrary>)
        });
        (loads, NodeFacts::with_library(Some(open)))
    }

    fn host(dir: &Path) -> Fixture {
        HostRootBuilder::hgx()
            .gpus(4)
            .build(&dir.join("host"))
            .unwrap()
    }

    fn indices(inv: &Inventory) -> Vec<u32> {
        inv.gpus.iter().map(|g| g.index).collect()
    }

    #[test]
    fn the_library_is_asked_once_while_the_gpus_stay_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = host(dir.path());
        let (loads, facts) = counting();
        let first = facts.discover(fixture.root());
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        assert_eq!(first.gpus.len(), 4);
        assert!(first.gpus.iter().all(|g| g.memory_bytes == Some(80 << 30)));
        let mut backwards = indices(&first);
        backwards.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(indices(&first), backwards, "the library's indices");
        for _ in 0..3 {
            let again = facts.discover(fixture.root());
            assert_eq!(again.gpus, first.gpus);
        }
        assert_eq!(
            loads.load(Ordering::SeqCst),
            1,
            "re-reads answer from the kept facts"
        );

        // A GPU leaves the driver: the others' indices may move, so it asks again.
        let gone = first.gpus[0].bus_id.to_string();
        let link = fixture
            .root()
            .join("sys/bus/pci/drivers/nvidia")
            .join(&gone);
        let target = std::fs::read_link(&link).unwrap();
        std::fs::remove_file(&link).unwrap();
        let fewer = facts.discover(fixture.root());
        assert_eq!(fewer.gpus.len(), 3);
        assert_eq!(loads.load(Ordering::SeqCst), 2);
        facts.discover(fixture.root());
        assert_eq!(loads.load(Ordering::SeqCst), 2);

        // It comes back: a GPU the kept facts never saw asks again too.
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let back = facts.discover(fixture.root());
        assert_eq!(back.gpus.len(), 4);
        assert_eq!(loads.load(Ordering::SeqCst), 3);
        assert!(back.gpus.iter().all(|g| g.memory_bytes == Some(80 << 30)));
    }

    /// A library that does not load yet (the driver's userspace still being
    /// installed) leaves nothing kept: the next read asks again.
    #[test]
    fn a_library_that_did_not_load_is_asked_again() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = host(dir.path());
        let loads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&loads);
        let open: Arc<OpenLibrary> =
            Arc::new(move || match counted.fetch_add(1, Ordering::SeqCst) {
                0 => None,
                _ => Some(Box::new(Backwards) as Box<dyn GpuLibrary>),
            });
        let facts = NodeFacts::with_library(Some(open));
        let without = facts.discover(fixture.root());
        assert!(without.gpus.iter().all(|g| g.memory_bytes.is_none()));
        let with = facts.discover(fixture.root());
        assert!(with.gpus.iter().all(|g| g.memory_bytes == Some(80 << 30)));
        facts.discover(fixture.root());
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn nvml_off_never_loads_it_and_gpus_follow_pci_order() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = host(dir.path());
        let (loads, facts) = counting();
        facts.set_nvml(None);
        let inv = facts.discover(fixture.root());
        assert_eq!(indices(&inv), [0, 1, 2, 3]);
        assert!(inv.gpus.iter().all(|g| g.memory_bytes.is_none()));
        assert_eq!(loads.load(Ordering::SeqCst), 0);
        // A simulated root never takes the real driver's facts, whatever the
        // config: no library here, and on a GPU node its UUIDs are not the
        // driver's GPUs'.
        let on = NodeFacts::nvml(Some(NvmlLibraries::default()));
        assert_eq!(indices(&on.discover(fixture.root())), [0, 1, 2, 3]);
    }
}
