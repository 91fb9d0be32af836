//! `[comm_env]`: the communication-library variables devgate derives from the
//! allocation (NCCL, UCX, CUDA), and templated variables of the node's own.
//!
//! ```toml
//! [comm_env]
//! NCCL_SOCKET_IFNAME = false          # off
//! NCCL_IB_HCA = "MY_HCA"              # renamed
//! gid_family = "ipv6"
//! [comm_env.extra]
//! GLOO_SOCKET_IFNAME = "{netdevs}"
//! ```
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ConfigError;

/// Most templated variables a node may add; each is set per container.
pub const MAX_EXTRA: usize = 32;
/// Longest template; values grow only by the lists substituted into them.
pub const MAX_TEMPLATE: usize = 1024;
/// Longest variable name accepted.
pub const MAX_NAME: usize = 128;

/// A variable devgate derives from the allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CommVar {
    NcclIbHca,
    UcxNetDevices,
    NcclSocketIfname,
    NcclIbGidIndex,
    CudaDeviceOrder,
}

impl CommVar {
    pub const ALL: [CommVar; 5] = [
        CommVar::NcclIbHca,
        CommVar::UcxNetDevices,
        CommVar::NcclSocketIfname,
        CommVar::NcclIbGidIndex,
        CommVar::CudaDeviceOrder,
    ];

    /// The library's own name for it, also its config key.
    pub fn default_name(self) -> &'static str {
        match self {
            CommVar::NcclIbHca => "NCCL_IB_HCA",
            CommVar::UcxNetDevices => "UCX_NET_DEVICES",
            CommVar::NcclSocketIfname => "NCCL_SOCKET_IFNAME",
            CommVar::NcclIbGidIndex => "NCCL_IB_GID_INDEX",
            CommVar::CudaDeviceOrder => "CUDA_DEVICE_ORDER",
        }
    }
}

/// One derived variable: `true` (set under its own name), `false` (not set), or
/// the name to set it under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VarSetting {
    On(bool),
    Rename(String),
}

impl Default for VarSetting {
    fn default() -> Self {
        VarSetting::On(true)
    }
}

impl Serialize for VarSetting {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            VarSetting::On(on) => s.serialize_bool(*on),
            VarSetting::Rename(name) => s.serialize_str(name),
        }
    }
}

impl<'de> Deserialize<'de> for VarSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = VarSetting;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true, false or a variable name")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<VarSetting, E> {
                Ok(VarSetting::On(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<VarSetting, E> {
                Ok(VarSetting::Rename(v.to_string()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The address family whose RoCE v2 GID `NCCL_IB_GID_INDEX` names, as NCCL's
/// `NCCL_IB_ADDR_FAMILY` (default `AF_INET`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GidFamily {
    #[default]
    Ipv4,
    Ipv6,
}

/// `[comm_env]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommEnvConfig {
    /// Off: none of these variables, derived or templated, is set.
    pub enabled: bool,
    pub gid_family: GidFamily,
    #[serde(rename = "NCCL_IB_HCA")]
    pub nccl_ib_hca: VarSetting,
    #[serde(rename = "UCX_NET_DEVICES")]
    pub ucx_net_devices: VarSetting,
    #[serde(rename = "NCCL_SOCKET_IFNAME")]
    pub nccl_socket_ifname: VarSetting,
    #[serde(rename = "NCCL_IB_GID_INDEX")]
    pub nccl_ib_gid_index: VarSetting,
    #[serde(rename = "CUDA_DEVICE_ORDER")]
    pub cuda_device_order: VarSetting,
    /// Name → template with `{rdma_devices}`, `{netdevs}`, `{gpu_uuids}`, `{numa_nodes}`.
    pub extra: BTreeMap<String, String>,
}

impl Default for CommEnvConfig {
    fn default() -> Self {
        CommEnvConfig {
            enabled: true,
            gid_family: GidFamily::Ipv4,
            nccl_ib_hca: VarSetting::default(),
            ucx_net_devices: VarSetting::default(),
            nccl_socket_ifname: VarSetting::default(),
            nccl_ib_gid_index: VarSetting::default(),
            cuda_device_order: VarSetting::default(),
            extra: BTreeMap::new(),
        }
    }
}

/// Names devgate sets for other reasons; a communication variable must not take them.
const RESERVED: [&str; 3] = ["NVIDIA_VISIBLE_DEVICES", "LD_PRELOAD", "DEVGATE_PROBE"];
const RESERVED_PREFIXES: [&str; 2] = ["CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_"];
/// The container's own to set, never the node's (see `check_name`).
const RENUMBERS_GPUS: &str = "CUDA_VISIBLE_DEVICES";

impl CommEnvConfig {
    pub fn setting(&self, var: CommVar) -> &VarSetting {
        match var {
            CommVar::NcclIbHca => &self.nccl_ib_hca,
            CommVar::UcxNetDevices => &self.ucx_net_devices,
            CommVar::NcclSocketIfname => &self.nccl_socket_ifname,
            CommVar::NcclIbGidIndex => &self.nccl_ib_gid_index,
            CommVar::CudaDeviceOrder => &self.cuda_device_order,
        }
    }

    /// The name `var` is set under; `None` when it is turned off.
    pub fn name_of(&self, var: CommVar) -> Option<&str> {
        if !self.enabled {
            return None;
        }
        match self.setting(var) {
            VarSetting::On(true) => Some(var.default_name()),
            VarSetting::On(false) => None,
            VarSetting::Rename(name) => Some(name),
        }
    }

    /// Names, templates and their count; no two variables under one name.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: String, reason: String| ConfigError::Invalid { key, reason };
        let mut seen: BTreeMap<&str, String> = BTreeMap::new();
        let derived = CommVar::ALL.iter().filter_map(|&v| {
            self.name_of(v)
                .map(|n| (n, format!("comm_env.{}", v.default_name())))
        });
        let extra = self
            .extra
            .keys()
            .map(|n| (n.as_str(), format!("comm_env.extra.{}", printable(n))));
        for (name, key) in derived.chain(extra) {
            check_name(name).map_err(|reason| invalid(key.clone(), reason))?;
            if let Some(first) = seen.insert(name, key.clone()) {
                return Err(invalid(key, format!("sets {name}, as {first} does")));
            }
        }
        if self.extra.len() > MAX_EXTRA {
            return Err(invalid(
                "comm_env.extra".into(),
                format!("at most {MAX_EXTRA} variables"),
            ));
        }
        for (name, template) in &self.extra {
            parse_template(template)
                .map_err(|reason| invalid(format!("comm_env.extra.{}", printable(name)), reason))?;
        }
        Ok(())
    }
}

fn printable(s: &str) -> String {
    s.chars()
        .take(MAX_NAME)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A POSIX portable variable name (`[A-Za-z_][A-Za-z0-9_]*`), bounded, and none of
/// the names devgate sets for other reasons.
fn check_name(name: &str) -> Result<(), String> {
    let portable = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !portable {
        return Err(format!(
            "{:?} is not a variable name of 1 to {MAX_NAME} characters [A-Za-z0-9_], not starting with a digit",
            printable(name)
        ));
    }
    if RESERVED.contains(&name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err(format!("{name} is set by devgate for another purpose"));
    }
    // CUDA numbers the GPUs in the order this lists them, and HAMi-core's
    // per-GPU limits name those numbers: a node-wide list (`{gpu_uuids}`
    // is in the annotation's order) would put one GPU's limit on another.
    if name == RENUMBERS_GPUS {
        return Err(format!(
            "{name} renumbers the container's GPUs, whose HAMi-core limits are set by number"
        ));
    }
    Ok(())
}

/// A list a template can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholder {
    /// RDMA device names as the container sees them, `mlx5_8,mlx5_9`.
    RdmaDevices,
    /// Container names of moved VF netdevs, `net1,net2`.
    Netdevs,
    GpuUuids,
    /// NUMA nodes of the allocated GPUs and NICs, ascending.
    NumaNodes,
}

impl Placeholder {
    const ALL: [Placeholder; 4] = [
        Placeholder::RdmaDevices,
        Placeholder::Netdevs,
        Placeholder::GpuUuids,
        Placeholder::NumaNodes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Placeholder::RdmaDevices => "rdma_devices",
            Placeholder::Netdevs => "netdevs",
            Placeholder::GpuUuids => "gpu_uuids",
            Placeholder::NumaNodes => "numa_nodes",
        }
    }
}

/// A piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    List(Placeholder),
}

/// Splits a template into text and placeholders. Braces are only for
/// placeholders, so a misspelt one is an error rather than literal text.
pub fn parse_template(template: &str) -> Result<Vec<Piece<'_>>, String> {
    if template.len() > MAX_TEMPLATE {
        return Err(format!("template longer than {MAX_TEMPLATE} bytes"));
    }
    if template.chars().any(char::is_control) {
        return Err("template has a control character".into());
    }
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        let (text, tail) = rest.split_at(open);
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        let close = tail.find('}').filter(|_| tail.starts_with('{'));
        let Some(close) = close else {
            return Err("a brace outside {placeholder}".into());
        };
        let word = &tail[1..close];
        let placeholder = Placeholder::ALL
            .into_iter()
            .find(|p| p.name() == word)
            .ok_or_else(|| {
                format!(
                    "unknown placeholder {{{}}}; known: {{rdma_devices}}, {{netdevs}}, {{gpu_uuids}}, {{numa_nodes}}",
                    printable(word)
                )
            })?;
        pieces.push(Piece::List(placeholder));
        rest = &tail[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    Ok(pieces)
}

#[cfg(test)]
#[path = "comm_env_tests.rs"]
mod tests;
