//! Pure parsers for the text of sysfs attributes and `proc` files. Each returns `None` for
//! input it does not understand; the caller turns that into a warning naming the file.

use super::model::{DevNum, LinkLayer, NvidiaMajors, RdmaCharKind};

/// The fields devgate uses from `proc/driver/nvidia/gpus/<bdf>/information` (NVIDIA kernel
/// module, nv-procfs.c): lines of `Key:<spaces and tabs>value`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GpuInformation {
    pub model: Option<String>,
    pub uuid: Option<String>,
    pub bus_location: Option<String>,
    pub minor: Option<u32>,
    /// `GPU Excluded: Yes` when the GPU is listed in `NVreg_ExcludedGpus`.
    pub excluded: bool,
}

pub(crate) fn parse_gpu_information(text: &str) -> GpuInformation {
    let mut info = GpuInformation::default();
    for line in text.lines() {
        // Split at the first colon only: `Bus Location: 0000:18:00.0` has more.
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "Model" => info.model = Some(value.to_owned()),
            "GPU UUID" => info.uuid = Some(value.to_owned()),
            "Bus Location" => info.bus_location = Some(value.to_owned()),
            "Device Minor" => info.minor = value.parse().ok(),
            // Drivers before the 460 series name it `Blacklisted`
            // (`NVreg_GpuBlacklist`), in the same place.
            "GPU Excluded" | "Blacklisted" => info.excluded = value.eq_ignore_ascii_case("yes"),
            _ => {}
        }
    }
    info
}

/// `(major, name)` pairs of the `Character devices:` section of `proc/devices` (fs/char_dev.c
/// prints `%3d %s`); the `Block devices:` section is ignored.
pub(crate) fn parse_char_majors(text: &str) -> Vec<(u32, &str)> {
    let mut in_char = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((num, name)) = line.split_once(char::is_whitespace) {
            if let Ok(major) = num.parse() {
                out.push((major, name.trim()));
            }
        }
    }
    out
}

/// NVIDIA majors from `proc/devices`. The frontend is `nvidia` since driver 550.40 and
/// `nvidia-frontend` before (nvidia-container-toolkit internal/info/proc/devices).
pub(crate) fn nvidia_majors(text: &str) -> NvidiaMajors {
    let mut majors = NvidiaMajors::default();
    for (major, name) in parse_char_majors(text) {
        let slot = match name {
            "nvidia" | "nvidia-frontend" => &mut majors.nvidia,
            "nvidia-uvm" => &mut majors.nvidia_uvm,
            "nvidia-caps" => &mut majors.nvidia_caps,
            _ => continue,
        };
        slot.get_or_insert(major);
    }
    majors
}

/// A sysfs `dev` attribute, `MAJOR:MINOR\n` (drivers/base/core.c `dev_show`).
pub(crate) fn parse_dev_num(text: &str) -> Option<DevNum> {
    let (major, minor) = text.trim().split_once(':')?;
    Some(DevNum {
        major: parse_decimal(major)?,
        minor: parse_decimal(minor)?,
    })
}

/// A kernel-given name (an ibdev, a netdev, a GPU UUID) that is safe as one path
/// component: at most `max` bytes of ASCII letters, digits, `_`, `-` and `.`,
/// and not `.` or `..`.
pub fn plain_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// An unsigned decimal attribute such as `sriov_numvfs` or a umad `port`.
pub(crate) fn parse_decimal(text: &str) -> Option<u32> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// `ports/<n>/state` is `"%d: %s"` (drivers/infiniband/core/sysfs.c `state_show`), e.g.
/// `4: ACTIVE`; the text after the number is kept.
pub(crate) fn parse_port_state(text: &str) -> Option<String> {
    let (num, name) = text.trim().split_once(':')?;
    parse_decimal(num)?;
    let name = name.trim();
    let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
    valid.then(|| name.to_owned())
}

/// `ports/<n>/link_layer`: `InfiniBand` or `Ethernet` (sysfs.c `link_layer_show`).
pub(crate) fn parse_link_layer(text: &str) -> LinkLayer {
    match text.trim() {
        "InfiniBand" => LinkLayer::InfiniBand,
        "Ethernet" => LinkLayer::Ethernet,
        _ => LinkLayer::Unknown,
    }
}

/// A PCI `class` attribute, `0x%06x` (drivers/pci/pci-sysfs.c).
pub(crate) fn parse_class(text: &str) -> Option<u32> {
    let hex = text.trim().strip_prefix("0x")?;
    if hex.is_empty() || hex.len() > 6 {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

/// Whether a function bound to `nvidia` counts as a GPU: a display
/// controller (class 0x03xxxx), not an NVSwitch (0x0680xx), which binds to
/// `nvidia` too; an unreadable class counts as one, so that a GPU is never
/// missed for it.
pub(crate) fn counts_as_gpu(class: Option<u32>) -> bool {
    class.is_none_or(|c| c >> 16 == 0x03)
}

/// Class 0x0604xx: a PCI-to-PCI bridge, which is what root ports and switch ports are.
pub(crate) fn is_bridge_class(class: u32) -> bool {
    class >> 8 == 0x0604
}

/// A PCI `numa_node` attribute: `-1` means the firmware gave no node.
/// The outer `None` means garbage.
pub(crate) fn parse_numa_node(text: &str) -> Option<Option<u32>> {
    match text.trim() {
        "-1" => Some(None),
        t => parse_decimal(t).map(Some),
    }
}

/// `N` of `virtfnN` (drivers/pci/iov.c `pci_iov_sysfs_link`).
pub(crate) fn parse_virtfn(name: &str) -> Option<u32> {
    parse_decimal(name.strip_prefix("virtfn")?)
}

/// The kind and number of an RDMA char device class entry: `uverbsN`, `umadN` or `issmN`.
pub(crate) fn parse_rdma_char_name(name: &str) -> Option<(RdmaCharKind, u32)> {
    let table = [
        ("uverbs", RdmaCharKind::Uverbs),
        ("umad", RdmaCharKind::Umad),
        ("issm", RdmaCharKind::Issm),
    ];
    table
        .into_iter()
        .find_map(|(prefix, kind)| Some((kind, parse_decimal(name.strip_prefix(prefix)?)?)))
}

/// `M` of an `mlxN_M` RDMA device name, the minor koordlet reports (`^mlx\d+_(\d+)$`).
pub fn mlx_minor(name: &str) -> Option<u32> {
    let (head, minor) = name.strip_prefix("mlx")?.split_once('_')?;
    parse_decimal(head)?;
    parse_decimal(minor)
}

/// A root complex directory `pciDDDD:BB` under `sys/devices` (drivers/pci/probe.c names the
/// host bridge device `pci%04x:%02x`).
pub(crate) fn is_pcie_root(name: &str) -> bool {
    let Some((domain, bus)) = name.strip_prefix("pci").and_then(|r| r.split_once(':')) else {
        return false;
    };
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    // Intel VMD adds domains of 5 hex digits (`pci10000:00`).
    (4..=8).contains(&domain.len()) && hex(domain) && bus.len() == 2 && hex(bus)
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
