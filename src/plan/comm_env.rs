//! Communication-library variables: NCCL and UCX use exactly the allocated HCAs
//! and interfaces, CUDA numbers GPUs in the PCI order the allocation was made in.
//!
//! - `NCCL_IB_HCA=` `=mlx5_8:1,...`: a leading `=` makes NCCL match names exactly
//!   (NCCL environment variables, "NCCL_IB_HCA"), so `mlx5_1` does not also pick
//!   `mlx5_10`.
//! - `UCX_NET_DEVICES` `mlx5_8:1,...`: UCX's `<device>:<port>` form.
//! - `NCCL_SOCKET_IFNAME` `net1,...`: the container names of the VF netdevs moved in.
//! - `NCCL_IB_GID_INDEX`: the RoCE v2 GID of the configured address family, read from
//!   `ports/<p>/gid_attrs/types/<i>` only for RoCE ports this container gets.
//! - `CUDA_DEVICE_ORDER=PCI_BUS_ID`: CUDA's default order is "fastest first".
//!
//! A variable the container already sets (image or pod spec) is left alone.
use std::collections::BTreeSet;
use std::net::Ipv6Addr;
use std::path::Path;

use super::{Builder, ContainerContext};
use crate::config::comm_env::{parse_template, Piece, Placeholder};
use crate::config::{CommEnvConfig, CommVar, GidFamily};
use crate::inventory::{self, LinkLayer, RdmaPort};

/// One port's GID table, read slot by slot.
pub(super) trait GidTable {
    /// The table's slots, in ascending order.
    fn indices(&self) -> &[u32];
    /// The type of slot `index`; `None` for an empty slot.
    fn gid_type(&self, index: u32) -> Option<String>;
    /// The GID in slot `index`.
    fn gid(&self, index: u32) -> Option<String>;
}

/// GID tables: the one OS touch of this module.
pub trait GidSource {
    /// [`roce_v2_index`] of port `port` of RDMA device `ibdev`; `None` when its
    /// table is unreadable.
    fn roce_v2_index(&self, ibdev: &str, port: u32, family: GidFamily) -> Option<u32>;
}

/// GID tables of the host whose `sys/` is below `root`, opened at each use.
#[derive(Debug, Clone, Copy)]
pub struct HostGids<'a> {
    pub root: &'a Path,
}

impl GidSource for HostGids<'_> {
    fn roce_v2_index(&self, ibdev: &str, port: u32, family: GidFamily) -> Option<u32> {
        let table = inventory::PortGids::open(self.root, ibdev, port)?;
        roce_v2_index(&table, family)
    }
}

impl GidTable for inventory::PortGids {
    fn indices(&self) -> &[u32] {
        inventory::PortGids::indices(self)
    }
    fn gid_type(&self, index: u32) -> Option<String> {
        inventory::PortGids::gid_type(self, index)
    }
    fn gid(&self, index: u32) -> Option<String> {
        inventory::PortGids::gid(self, index)
    }
}

/// No GID tables: `NCCL_IB_GID_INDEX` is never derived.
#[derive(Debug, Clone, Copy)]
pub struct NoGids;

impl GidSource for NoGids {
    fn roce_v2_index(&self, _: &str, _: u32, _: GidFamily) -> Option<u32> {
        None
    }
}

/// An allocated RDMA device, as the GPU and RDMA parts of the plan found it.
#[derive(Debug, Clone)]
pub(super) struct RdmaUse {
    /// ibdev name; RDMA devices keep it inside the container.
    pub name: String,
    pub ports: Vec<RdmaPort>,
    pub numa: Option<u32>,
    /// A VF whose netdev the hook moves into the pod netns.
    pub netdev_moved: bool,
}

/// What the variables are made from, gathered while the plan is built.
#[derive(Debug, Clone, Default)]
pub(super) struct Inputs {
    /// GPU UUIDs and NUMA nodes in annotation order.
    pub gpus: Vec<(String, Option<u32>)>,
    pub rdma: Vec<RdmaUse>,
}

/// The type string the kernel gives RoCE v2 entries (`ib_cache_gid_type_str`).
const ROCE_V2: &str = "RoCE v2";
const NCCL_IB_ADDR_FAMILY: &str = "NCCL_IB_ADDR_FAMILY";
/// The container's own narrowing of NCCL's GID selection, which an explicit
/// `NCCL_IB_GID_INDEX` would override (NCCL's `ncclIbGetGidIndex` returns a
/// set index before it looks at either).
const GID_CHOICE: [&str; 2] = ["NCCL_IB_ADDR_RANGE", "NCCL_IB_ROCE_VERSION_NUM"];

pub(super) fn plan_comm_env(out: &mut Builder, ctx: &ContainerContext) {
    let cfg = &out.config.comm_env;
    if !cfg.enabled {
        return;
    }
    for var in CommVar::ALL {
        let Some(name) = cfg.name_of(var) else {
            continue;
        };
        if user_value(ctx.env, name).is_some() {
            continue;
        }
        if let Some(value) = derive(out, ctx, var) {
            set(out, name, value);
        }
    }
    for (name, template) in &cfg.extra {
        if user_value(ctx.env, name).is_some() {
            continue;
        }
        if let Some(value) = render(out, template) {
            set(out, name, value);
        }
    }
}

/// The container's own values of every variable the plan reads (the names
/// `plan_comm_env` and `gid_index` look up), in a fixed order: two containers of
/// a pod with equal inputs get equal variables. Empty when the plan reads none.
pub fn env_inputs(config: &CommEnvConfig, selected: bool, env: &[String]) -> Vec<Option<String>> {
    if !selected {
        return Vec::new();
    }
    // HAMi-core's LD_PRELOAD keeps the container's own after it, and its
    // limits need CUDA's device numbers as the plan sets them.
    let preload = std::iter::once("LD_PRELOAD").chain(super::gpu::CUDA_ORDER_INPUTS);
    if !config.enabled {
        return preload
            .map(|name| user_value(env, name).map(str::to_owned))
            .collect();
    }
    let derived = CommVar::ALL.iter().filter_map(|&v| config.name_of(v));
    let extra = config.extra.keys().map(String::as_str);
    derived
        .chain(extra)
        .chain([NCCL_IB_ADDR_FAMILY])
        .chain(GID_CHOICE)
        .chain(preload)
        .map(|name| user_value(env, name).map(str::to_owned))
        .collect()
}

/// Never over a value the plan set for another reason (config validation keeps
/// the names apart; this keeps the plan right for configs built in memory).
fn set(out: &mut Builder, name: &str, value: String) {
    out.plan.env.entry(name.to_string()).or_insert(value);
}

/// The container's own value of `name`. NRI sends the env as `NAME=value`;
/// a bare `NAME` is someone's entry too, read as empty and left alone. A
/// name given twice (an image's env and the pod's both name it) is read as
/// its last entry, the one the process gets: runc sets the entries in order
/// (libcontainer `populateProcessEnvironment`), so the last one wins.
pub(super) fn user_value<'e>(env: &'e [String], name: &str) -> Option<&'e str> {
    env.iter().rev().find_map(|e| match e.split_once('=') {
        Some((k, v)) if k == name => Some(v),
        None if e == name => Some(""),
        _ => None,
    })
}

fn derive(out: &mut Builder, ctx: &ContainerContext, var: CommVar) -> Option<String> {
    match var {
        CommVar::CudaDeviceOrder => (!out.comm.gpus.is_empty()).then(|| "PCI_BUS_ID".into()),
        CommVar::NcclIbHca => hca_list(out).map(|l| format!("={}", l.join(","))),
        CommVar::UcxNetDevices => hca_list(out).map(|l| l.join(",")),
        CommVar::NcclSocketIfname => non_empty(netdevs(out)),
        CommVar::NcclIbGidIndex => gid_index(out, ctx).map(|i| i.to_string()),
    }
}

fn non_empty(list: Vec<String>) -> Option<String> {
    (!list.is_empty()).then(|| list.join(","))
}

fn netdevs(out: &Builder) -> Vec<String> {
    let names = out.plan.network.iter();
    names.map(|a| a.container_ifname.clone()).collect()
}

/// The ports a device is used through: its ACTIVE ones, or all of them when none
/// is (a port still training its link keeps its place in the list).
fn used_ports(dev: &RdmaUse) -> Vec<&RdmaPort> {
    let active: Vec<&RdmaPort> = dev.ports.iter().filter(|p| p.state == "ACTIVE").collect();
    if active.is_empty() {
        dev.ports.iter().collect()
    } else {
        active
    }
}

/// `dev:port` for every allocated device; `None` (with a warning) when a device
/// has no known port, because a list without it would steer traffic away from it.
fn hca_list(out: &mut Builder) -> Option<Vec<String>> {
    if out.comm.rdma.is_empty() {
        return None;
    }
    let mut list = Vec::new();
    let mut complete = true;
    for dev in &out.comm.rdma {
        let ports = used_ports(dev);
        let warning = if ports.is_empty() {
            complete = false;
            Some(format!(
                "comm_env: rdma device {} has no ports in the inventory: NCCL_IB_HCA and UCX_NET_DEVICES not set",
                dev.name
            ))
        } else if ports.iter().all(|p| p.state != "ACTIVE") {
            Some(format!(
                "comm_env: rdma device {} has no ACTIVE port: listed with all its ports",
                dev.name
            ))
        } else {
            None
        };
        list.extend(ports.iter().map(|p| format!("{}:{}", dev.name, p.num)));
        // Both list variables come here; one warning is enough.
        if let Some(w) = warning.filter(|w| !out.plan.warnings.contains(w)) {
            out.plan.warnings.push(w);
        }
    }
    complete.then_some(list)
}

/// The one GID index every allocated RoCE port agrees on, for the address family
/// the container asks NCCL for (`NCCL_IB_ADDR_FAMILY`) or else the config's.
/// InfiniBand ports take no part: NCCL uses the index for RoCE only.
///
/// Only ports whose netdev stays where it is have a table that holds: a VF's
/// netdev loses its addresses when it moves into the pod, and the pod's own
/// take the free slots in the order it adds them (`ib_cache_gid_add`), so the
/// host's table (a VF that NetworkManager gave SLAAC and DHCP addresses has
/// its IPv4 GID at 5, where the pod's IPv4-only one lands at 3) says nothing
/// of the pod's. An index naming an empty or wrong slot fails NCCL's queue
/// pairs, while NCCL 2.21 and later pick the GID themselves when no index is
/// set; so does a container that narrows the choice with
/// `NCCL_IB_ADDR_RANGE` or `NCCL_IB_ROCE_VERSION_NUM`, which an explicit
/// index would override.
fn gid_index(out: &mut Builder, ctx: &ContainerContext) -> Option<u32> {
    if let Some(name) = GID_CHOICE.iter().find(|n| user_value(ctx.env, n).is_some()) {
        out.plan.notes.push(format!(
            "comm_env: NCCL_IB_GID_INDEX not set: the container sets {name}, and NCCL selects the GID by it"
        ));
        return None;
    }
    let family = match user_value(ctx.env, NCCL_IB_ADDR_FAMILY) {
        Some("AF_INET6") => GidFamily::Ipv6,
        Some("AF_INET") => GidFamily::Ipv4,
        _ => out.config.comm_env.gid_family,
    };
    let mut found: Vec<(String, u32)> = Vec::new();
    for dev in &out.comm.rdma {
        let roce = used_ports(dev)
            .into_iter()
            .filter(|p| p.link_layer == LinkLayer::Ethernet);
        for port in roce {
            let at = format!("{}:{}", dev.name, port.num);
            if dev.netdev_moved {
                out.plan.notes.push(format!(
                    "comm_env: NCCL_IB_GID_INDEX not set: {at}'s netdev moves into the pod, whose addresses decide its GID slots; NCCL selects the GID there"
                ));
                return None;
            }
            match ctx.gids.roce_v2_index(&dev.name, port.num, family) {
                Some(i) => found.push((at, i)),
                None => {
                    out.plan.warnings.push(format!(
                        "comm_env: NCCL_IB_GID_INDEX not set: {at} has no RoCE v2 GID of family {}",
                        family_text(family)
                    ));
                    return None;
                }
            }
        }
    }
    let first = found.first()?.1;
    if found.iter().all(|(_, i)| *i == first) {
        return Some(first);
    }
    let all: Vec<String> = found.iter().map(|(at, i)| format!("{at}={i}")).collect();
    out.plan.warnings.push(format!(
        "comm_env: NCCL_IB_GID_INDEX not set: the RoCE v2 GID indices differ ({})",
        all.join(", ")
    ));
    None
}

fn family_text(f: GidFamily) -> &'static str {
    match f {
        GidFamily::Ipv4 => "ipv4",
        GidFamily::Ipv6 => "ipv6",
    }
}

/// The lowest RoCE v2 entry whose GID is an address of `family`. As NCCL's own
/// selection does, link-local GIDs (derived from the MAC, not routable) and the
/// zero GID do not count; an IPv4 address appears as `::ffff:a.b.c.d` (RFC 4291
/// 2.5.5.2), as the kernel stores it (`rdma_ip2gid`). Slots are read in index
/// order up to the first match, and a GID only for a RoCE v2 slot: a table has
/// up to 256 slots, each a sysfs file.
pub(super) fn roce_v2_index(table: &dyn GidTable, family: GidFamily) -> Option<u32> {
    table.indices().iter().copied().find(|&i| {
        table.gid_type(i).as_deref() == Some(ROCE_V2)
            && table
                .gid(i)
                .as_deref()
                .and_then(parse_gid)
                .is_some_and(|a| gid_family(&a) == Some(family))
    })
}

/// sysfs prints a GID as eight groups of four hex digits (`%pI6`); `Ipv6Addr`
/// accepts that form too.
fn parse_gid(text: &str) -> Option<Ipv6Addr> {
    if text.len() > 64 {
        return None;
    }
    text.trim().parse().ok()
}

fn gid_family(a: &Ipv6Addr) -> Option<GidFamily> {
    let s = a.segments();
    if a.is_unspecified() || s[0] & 0xffc0 == 0xfe80 {
        return None;
    }
    if s[..5] == [0; 5] && s[5] == 0xffff {
        return Some(GidFamily::Ipv4);
    }
    Some(GidFamily::Ipv6)
}

/// A template with its lists filled in; `None` when a list it names is empty,
/// so that no variable is set to a half-formed value.
fn render(out: &Builder, template: &str) -> Option<String> {
    // Validated with the config; a template that does not parse sets nothing.
    let pieces = parse_template(template).ok()?;
    let mut value = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => value.push_str(t),
            Piece::List(p) => value.push_str(&non_empty(list(out, p))?),
        }
    }
    Some(value)
}

fn list(out: &Builder, p: Placeholder) -> Vec<String> {
    let comm = &out.comm;
    match p {
        Placeholder::RdmaDevices => comm.rdma.iter().map(|d| d.name.clone()).collect(),
        Placeholder::Netdevs => netdevs(out),
        Placeholder::GpuUuids => comm.gpus.iter().map(|(u, _)| u.clone()).collect(),
        Placeholder::NumaNodes => {
            let gpus = comm.gpus.iter().filter_map(|(_, n)| *n);
            let nics = comm.rdma.iter().filter_map(|d| d.numa);
            let nodes: BTreeSet<u32> = gpus.chain(nics).collect();
            nodes.iter().map(u32::to_string).collect()
        }
    }
}
