//! The typed inventory: what a host root holds, as read from its `sys/` and `proc/`.
//!
//! These types are shared by discovery, the plan and the CLI; they carry no I/O.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A PCI address in the canonical sysfs form `DDDD:BB:DD.F` (lower-case hex).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddr {
    /// 16 bits on most hosts; Intel VMD puts its devices in domains from
    /// 0x10000 (drivers/pci/controller/vmd.c), which sysfs names with 5 digits.
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a pci address (want DDDD:BB:DD.F): {input:?}")]
pub struct PciAddrError {
    pub input: String,
}

impl FromStr for PciAddr {
    type Err = PciAddrError;

    /// Accepts `DDDD:BB:DD.F` (a VMD domain has 5 digits) and the short `BB:DD.F`
    /// (domain 0), any hex case.
    /// Device is 5 bits and function 3 bits (PCI spec), so larger values are rejected.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PciAddrError {
            input: s.chars().take(64).collect(),
        };
        if s.len() > 16 || !s.is_ascii() {
            return Err(err());
        }
        let (head, func) = s.rsplit_once('.').ok_or_else(err)?;
        let mut parts: Vec<&str> = head.split(':').collect();
        if parts.len() == 2 {
            parts.insert(0, "0000");
        }
        if parts.len() != 3 {
            return Err(err());
        }
        let hex = |p: &str, max_len: usize| -> Result<u32, PciAddrError> {
            if p.is_empty() || p.len() > max_len || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            u32::from_str_radix(p, 16).map_err(|_| err())
        };
        // sysfs pads the domain to 4 digits and adds none beyond (`%04x`):
        // a longer one with a leading zero names no device.
        if parts[0].len() > 4 && parts[0].starts_with('0') {
            return Err(err());
        }
        let domain = hex(parts[0], 8)?;
        let bus = hex(parts[1], 2)?;
        let device = hex(parts[2], 2)?;
        let function = hex(func, 1)?;
        if device > 0x1f || function > 7 {
            return Err(err());
        }
        Ok(PciAddr {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl PciAddr {
    /// The sysfs form, `{:04x}:{:02x}:{:02x}.{:x}`, written into `buf` by hand:
    /// every claim of every ledger line carries addresses, and the formatting
    /// machinery (one call per field, each escaped again by the JSON writer)
    /// cost more than the rest of a claim's serialization. At most 17 bytes:
    /// 8 domain digits, `:bb:dd.` and 2 function digits.
    fn text<'a>(&self, buf: &'a mut [u8; 18]) -> &'a str {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut n = 0;
        let mut put = |byte: u8| {
            buf[n] = byte;
            n += 1;
        };
        let domain_digits = (8 - self.domain.leading_zeros() as usize / 4).max(4);
        for i in (0..domain_digits).rev() {
            put(HEX[(self.domain >> (4 * i)) as usize & 0xf]);
        }
        for (byte, sep) in [(self.bus, b':'), (self.device, b':')] {
            put(sep);
            put(HEX[usize::from(byte >> 4)]);
            put(HEX[usize::from(byte & 0xf)]);
        }
        put(b'.');
        if self.function > 0xf {
            put(HEX[usize::from(self.function >> 4)]);
        }
        put(HEX[usize::from(self.function & 0xf)]);
        // Only ASCII digits and separators were written.
        std::str::from_utf8(&buf[..n]).unwrap_or_default()
    }
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.text(&mut [0; 18]))
    }
}

impl Serialize for PciAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.text(&mut [0; 18]))
    }
}

impl<'de> Deserialize<'de> for PciAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A character device number, read from sysfs `dev` files or `proc/devices`, never computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Where a PCI device sits: NUMA node, root complex, nearest switch, resolved sysfs path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Topology {
    /// `numa_node` from sysfs; `None` when the kernel says -1 or the file is missing.
    pub numa_node: Option<u32>,
    /// The PCIe root complex, `pciDDDD:BB`, the first component of the resolved sysfs path.
    pub pcie_root: String,
    /// The PCIe switch the device hangs off, named by the switch's upstream port (class
    /// 0x0604xx), so that a GPU and a NIC behind the same switch compare equal; `None` for a
    /// device on a root port or on the root bus. See `topology::switch_of`.
    pub pcie_switch: Option<PciAddr>,
    /// Bridges from the root complex down to the device (exclusive), as resolved from sysfs.
    pub pci_path: Vec<PciAddr>,
    /// The resolved sysfs directory of the device, relative to the host root's `sys/devices`.
    pub sysfs_path: PathBuf,
}

/// Health of a device, with the reason when it is not healthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Health {
    #[default]
    Healthy,
    Unhealthy {
        reason: String,
    },
}

/// One NVIDIA GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index when NVML is present, else position in PCI bus order.
    pub index: u32,
    /// `Device Minor` from `proc/driver/nvidia/gpus/<bdf>/information`: the N of `/dev/nvidiaN`.
    pub minor: u32,
    /// `GPU UUID`, e.g. `GPU-57047317-...`.
    pub uuid: String,
    pub bus_id: PciAddr,
    pub model: String,
    /// Total framebuffer memory in bytes, when a GPU library (NVML) reported it.
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    pub topology: Topology,
    pub health: Health,
}

/// Majors of NVIDIA's dynamic char devices, from `proc/devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NvidiaMajors {
    /// `nvidia` (or the older `nvidia-frontend`); 195 on every released driver.
    pub nvidia: Option<u32>,
    pub nvidia_uvm: Option<u32>,
    pub nvidia_caps: Option<u32>,
}

/// The kind of an RDMA char device (kernel drivers/infiniband/core/{uverbs_main,user_mad}.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RdmaCharKind {
    Uverbs,
    Umad,
    Issm,
}

/// One RDMA char device: `/dev/infiniband/<name>`, number from sysfs `dev`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaCharDev {
    pub kind: RdmaCharKind,
    /// e.g. `uverbs40`, `umad3`, `issm3`.
    pub name: String,
    /// Port number for umad/issm (one node per port); `None` for uverbs.
    pub port: Option<u32>,
    pub dev: DevNum,
}

/// Link layer of an RDMA port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    Unknown,
}

/// One GID table entry type (`ports/<p>/gid_attrs/types/<i>`), e.g. "RoCE v2".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidEntry {
    pub index: u32,
    pub gid_type: String,
    /// The GID itself (`ports/<p>/gids/<i>`), when readable.
    pub gid: Option<String>,
    /// The netdev of the entry (`gid_attrs/ndevs/<i>`), when readable.
    pub ndev: Option<String>,
}

/// One port of an RDMA device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaPort {
    pub num: u32,
    /// Text after the numeric prefix of `ports/<n>/state`, e.g. `ACTIVE`, `DOWN`.
    pub state: String,
    pub link_layer: LinkLayer,
    /// Populated GID entries (only those whose type file is readable).
    pub gids: Vec<GidEntry>,
}

/// The RDMA device (ibdev) bound to a PCI function, PF or VF.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaDev {
    /// ibdev name, e.g. `mlx5_3`, `rocep25s0f0`.
    pub name: String,
    pub node_guid: Option<String>,
    pub ports: Vec<RdmaPort>,
    pub char_devs: Vec<RdmaCharDev>,
}

/// An SR-IOV virtual function of a PF.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vf {
    /// N of the PF's `virtfnN`.
    pub index: u32,
    pub bus_id: PciAddr,
    /// Host netdev name, `None` when bound to vfio-pci or already moved away.
    pub netdev: Option<String>,
    /// Its other host netdevs, sorted: a function with a netdev per port (a
    /// dual-port VF, as ConnectX-3's were). The hook moves one netdev per VF,
    /// and one left behind would read as the VF being on the host, so the
    /// plan refuses such a VF.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_netdevs: Vec<String>,
    pub rdma: Option<RdmaDev>,
    pub driver: Option<String>,
}

/// One RDMA-capable NIC physical function with its VFs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaNic {
    pub bus_id: PciAddr,
    pub driver: Option<String>,
    pub rdma: RdmaDev,
    /// Netdevs of the PF (`net/*` of the PCI device).
    pub netdevs: Vec<String>,
    pub topology: Topology,
    pub sriov_total_vfs: u32,
    pub sriov_num_vfs: u32,
    pub vfs: Vec<Vf>,
    pub health: Health,
}

/// The whole inventory of a host root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    pub nvidia_majors: NvidiaMajors,
    pub rdma: Vec<RdmaNic>,
    /// `/dev/infiniband/rdma_cm` (a misc device), from `sys/class/misc/rdma_cm/dev`.
    pub rdma_cm: Option<DevNum>,
    /// The kernel's RDMA netns mode, read where RDMA devices exist and ib_core
    /// is loaded (`sys/module/ib_core/parameters/netns_mode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_netns_mode: Option<crate::config::RdmaNetnsMode>,
    /// What could not be read, one line each; never fatal.
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addr_round_trips_and_rejects_garbage() {
        let table = [
            ("0000:19:00.2", Some("0000:19:00.2")),
            ("19:00.2", Some("0000:19:00.2")),
            ("0000:AB:1F.7", Some("0000:ab:1f.7")),
            ("0000:ab:20.0", None),
            ("0000:ab:00.8", None),
            ("../../etc", None),
            ("0000:19:00", None),
            ("", None),
            ("00000:19:00.0", None),
            ("10000:01:00.0", Some("10000:01:00.0")),
            ("FFFFFFFF:01:00.0", Some("ffffffff:01:00.0")),
            ("100000000:01:00.0", None),
            ("0000:19:00.0\n", None),
        ];
        for (input, want) in table {
            let got = input.parse::<PciAddr>().ok().map(|a| a.to_string());
            assert_eq!(got.as_deref(), want, "input {input:?}");
        }
    }

    /// The hand-written text is the sysfs `printf` form for every field value,
    /// including ones no parse produces; JSON and padding go through it too.
    #[test]
    fn pci_addr_text_is_the_printf_form() {
        let domains = [0, 1, 0xabc, 0xffff, 0x1_0000, 0xfff_ffff, u32::MAX];
        for domain in domains {
            for (bus, device, function) in [
                (0, 0, 0),
                (0x3b, 0x1f, 7),
                (0xff, 0xff, 0xff),
                (9, 0xa0, 0x10),
            ] {
                let addr = PciAddr {
                    domain,
                    bus,
                    device,
                    function,
                };
                let want = format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}");
                assert_eq!(addr.to_string(), want);
                assert_eq!(serde_json::to_string(&addr).unwrap(), format!("\"{want}\""));
                assert_eq!(format!("[{addr:>20}]"), format!("[{want:>20}]"));
            }
        }
    }
}
