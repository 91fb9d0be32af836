//! NVIDIA GPUs: the functions bound to the `nvidia` driver, described by the driver's procfs.

use std::path::Path;

use super::error::InventoryError;
use super::model::{Gpu, Health, NvidiaMajors, PciAddr};
use super::parse::{nvidia_majors, parse_gpu_information, GpuInformation};
use super::pci::PciFunction;
use super::Scan;

/// Where the PCI core links the functions a driver is bound to (drivers/base/bus.c).
const NVIDIA_DRIVER_DIR: &str = "sys/bus/pci/drivers/nvidia";

/// The first minor of the driver's control devices under its major:
/// `nvidia-modeset` is 254 and `nvidiactl` 255, so GPUs number below.
const FIRST_CONTROL_MINOR: u32 = 254;

/// What a GPU management library (NVML) knows about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFacts {
    /// The library's index, which `NVIDIA_VISIBLE_DEVICES` integers refer to.
    pub index: Option<u32>,
    pub memory_bytes: Option<u64>,
    pub health: Option<Health>,
}

/// A source of GPU facts beyond sysfs and procfs. Absent is normal: see [`NoGpuLibrary`].
pub trait GpuLibrary {
    /// Facts about the GPU at `bus_id`, which the host root names `uuid`;
    /// `None` when the library does not know it, or knows another GPU there
    /// (a simulated host root read on a machine with GPUs of its own).
    fn gpu(&self, bus_id: PciAddr, uuid: &str) -> Option<GpuFacts>;
}

/// No GPU library: indices follow PCI bus order, memory is unknown.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGpuLibrary;

impl GpuLibrary for NoGpuLibrary {
    fn gpu(&self, _bus_id: PciAddr, _uuid: &str) -> Option<GpuFacts> {
        None
    }
}

impl Scan<'_> {
    /// Every GPU bound to `nvidia`, in PCI bus order.
    pub(super) fn gpus(&mut self) -> Vec<Gpu> {
        let names = self.fs.list_optional(NVIDIA_DRIVER_DIR);
        let names = self.ok(names).unwrap_or_default();
        // The driver directory also holds `bind`, `unbind`, `module`, ...: keep BDF names.
        let mut found: Vec<(Gpu, Option<u32>)> = names
            .iter()
            .filter_map(|n| n.parse::<PciAddr>().ok().map(|a| (n, a)))
            .filter_map(|(name, addr)| self.gpu(name, addr))
            .collect();
        found.sort_by_key(|(gpu, _)| gpu.bus_id);
        let mut found = self.unambiguous(found);
        // NVML orders by PCI bus id too, but only NVML's own index is
        // authoritative. A GPU it does not know (lost, or excluded) numbers
        // after those it does: its PCI position may be an index NVML gave
        // another GPU. Without the library, PCI order.
        let known = found.iter().filter_map(|(_, i)| *i).max();
        let mut after = known.map_or(0, |max| max.saturating_add(1));
        for (position, (gpu, library_index)) in found.iter_mut().enumerate() {
            gpu.index = match (*library_index, known) {
                (Some(index), _) => index,
                (None, Some(_)) => {
                    after = after.saturating_add(1);
                    after - 1
                }
                (None, None) => position as u32,
            };
        }
        found.into_iter().map(|(gpu, _)| gpu).collect()
    }

    /// `found` without the GPUs whose device minor or UUID another GPU
    /// reports too, or whose minor is a control device's (`nvidia-modeset`
    /// 195:254, `nvidiactl` 195:255), each with a warning: a node
    /// `/dev/nvidia<minor>`, or an id, naming two devices would give a
    /// container another GPU than the one its allocation and its
    /// `NVIDIA_VISIBLE_DEVICES` name. The driver numbers its GPUs uniquely,
    /// so only a broken or hand-made procfs reads so.
    fn unambiguous(&mut self, found: Vec<(Gpu, Option<u32>)>) -> Vec<(Gpu, Option<u32>)> {
        let clash = |g: &Gpu| -> Option<String> {
            if g.minor >= FIRST_CONTROL_MINOR {
                return Some(format!("device minor {} is a control device's", g.minor));
            }
            let others = found.iter().map(|(o, _)| o);
            others.filter(|o| o.bus_id != g.bus_id).find_map(|o| {
                let what = if o.minor == g.minor {
                    format!("device minor {}", g.minor)
                } else if o.uuid == g.uuid {
                    format!("uuid {}", g.uuid)
                } else {
                    return None;
                };
                Some(format!("{what} is also the gpu's at {}", o.bus_id))
            })
        };
        let clashes: Vec<Option<String>> = found.iter().map(|(g, _)| clash(g)).collect();
        let mut kept = Vec::with_capacity(found.len());
        for (entry, clash) in found.into_iter().zip(clashes) {
            match clash {
                Some(what) => self.warn(InventoryError::Device {
                    device: entry.0.bus_id.to_string(),
                    what: format!("{what}: left out"),
                }),
                None => kept.push(entry),
            }
        }
        kept
    }

    fn gpu(&mut self, name: &str, addr: PciAddr) -> Option<(Gpu, Option<u32>)> {
        let link = Path::new(NVIDIA_DRIVER_DIR).join(name);
        let function = self.pci_function(&link);
        let function = self.ok(function)?;
        let path = format!("proc/driver/nvidia/gpus/{addr}/information");
        let info = match self.fs.read(&path) {
            Ok(text) => self.gpu_information(&path, &text, addr),
            // NVSwitches (class 0x0680) bind to `nvidia` too but have no information file;
            // only a display controller (class 0x03) without one is worth a warning.
            Err(e) if e.is_not_found() && !self.is_display(&function) => return None,
            Err(e) => {
                self.warn(e);
                return None;
            }
        };
        let topology = self.topology(&function);
        // The library lists no excluded GPU: asking about one would make every
        // read start it again (see `gpu::facts`).
        let facts = match &info.uuid {
            Some(uuid) if !info.excluded => self.gpu_library.gpu(addr, uuid).unwrap_or_default(),
            _ => Default::default(),
        };
        let health = match (facts.health, info.excluded) {
            (Some(health), _) => health,
            (None, true) => Health::Unhealthy {
                reason: "excluded by NVreg_ExcludedGpus".to_owned(),
            },
            (None, false) => Health::Healthy,
        };
        let gpu = Gpu {
            index: 0,
            minor: info.minor?,
            uuid: info.uuid?,
            bus_id: addr,
            model: info.model.unwrap_or_default(),
            memory_bytes: facts.memory_bytes,
            topology,
            health,
        };
        Some((gpu, facts.index))
    }

    /// The parsed information file of `addr`, with a warning for each missing field.
    fn gpu_information(&mut self, path: &str, text: &str, addr: PciAddr) -> GpuInformation {
        let info = parse_gpu_information(text);
        let required = [
            ("GPU UUID", info.uuid.is_none()),
            ("Device Minor", info.minor.is_none()),
            ("Model", info.model.is_none()),
        ];
        for (field, missing) in required {
            if missing {
                let path = path.into();
                self.warn(InventoryError::MissingField { path, field });
            }
        }
        let mut info = info;
        if let Some(uuid) = info.uuid.take_if(|u| !is_gpu_uuid(u)) {
            // A GPU whose init failed reads `GPU-????????-…`: several would
            // share one id, so none is offered.
            self.warn(InventoryError::malformed(
                format!("{path}: GPU UUID"),
                &uuid,
            ));
        }
        let location = info.bus_location.as_deref().map(str::parse::<PciAddr>);
        if location.is_some_and(|l| l != Ok(addr)) {
            self.warn(InventoryError::Device {
                device: addr.to_string(),
                what: format!("{path} says bus location {:?}", info.bus_location),
            });
        }
        info
    }

    /// Whether the function is a display controller; an unreadable class counts as one.
    fn is_display(&mut self, function: &PciFunction) -> bool {
        let class = self.class(&function.dir);
        super::counts_as_gpu(class)
    }

    /// Majors from `proc/devices`; a GPU without them is worth a warning.
    pub(super) fn nvidia_majors(&mut self, have_gpus: bool) -> NvidiaMajors {
        let text = self.fs.read("proc/devices");
        let text = if have_gpus {
            self.ok(text)
        } else {
            self.optional(text)
        };
        let majors = text.as_deref().map(nvidia_majors).unwrap_or_default();
        if have_gpus && text.is_some() && majors.nvidia.is_none() {
            self.warn(InventoryError::Device {
                device: "nvidia".to_owned(),
                what: "proc/devices has no nvidia major".to_owned(),
            });
        }
        majors
    }
}

/// `GPU-` and a UUID in its 8-4-4-4-12 hex form, as the driver prints it.
fn is_gpu_uuid(text: &str) -> bool {
    let Some(uuid) = text.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = uuid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}
