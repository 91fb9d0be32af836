//! RDMA part of a plan: char devices of the allocated PFs and VFs, and the network
//! actions the hook performs for each VF netdev.
use super::comm_env::RdmaUse;
use super::{plain_name, Builder, NetworkAction, PlanError, ANN};
use crate::allocation::{RdmaEntry, VfRef, FULL_SHARE};
use crate::config::RdmaNetnsMode;
use crate::inventory::device_cr::rdma_minors;
use crate::inventory::{
    Health, Inventory, PciAddr, RdmaCharDev, RdmaCharKind, RdmaDev, RdmaNic, Vf,
};
use crate::ledger::{Claim, DeviceId, Share};

/// Linux IFNAMSIZ without the NUL.
const MAX_IFNAME: usize = 15;

/// Whether VF RDMA devices move into the pod netns: where the config says
/// the node is exclusive, and wherever the kernel is, whatever the config
/// says. In exclusive mode a device left in the host's namespace cannot be
/// opened from the pod's (`rdma_dev_access_netns`,
/// drivers/infiniband/core/device.c), so the pod would get dead verbs nodes.
/// A configured exclusive mode on a shared kernel still moves: the hook then
/// refuses the container, since the kernel moves no RDMA device in shared
/// mode and the isolation the config asks for cannot be had.
pub(super) fn moves_rdma(config: &crate::config::Config, inv: &Inventory) -> bool {
    config.rdma.netns_mode == RdmaNetnsMode::Exclusive
        || inv.rdma_netns_mode == Some(RdmaNetnsMode::Exclusive)
}

pub(super) fn plan_rdma(
    out: &mut Builder,
    inv: &Inventory,
    entries: &[RdmaEntry],
) -> Result<(), PlanError> {
    if entries.is_empty() {
        return Ok(());
    }
    let cm = inv.rdma_cm.ok_or_else(|| PlanError::NoRdmaCm {
        annotation: ANN,
        entry: "rdma".into(),
    })?;
    out.device("/dev/infiniband/rdma_cm".into(), cm.major, cm.minor);

    let minors = rdma_minors(&inv.rdma);
    let mut used: Vec<(PciAddr, String)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let entry = format!("rdma[{i}]");
        let nic = resolve_pf(inv, &minors, e, &entry)?;
        if let Some((_, first)) = used.iter().find(|(pf, _)| *pf == nic.bus_id) {
            return Err(PlanError::DuplicatePf {
                annotation: ANN,
                entry,
                pf: nic.bus_id,
                first: first.clone(),
            });
        }
        used.push((nic.bus_id, entry.clone()));
        if let Health::Unhealthy { reason } = &nic.health {
            out.plan.warnings.push(format!(
                "{entry}: rdma pf {} is unhealthy: {reason}",
                nic.bus_id
            ));
        }
        if e.vfs.is_empty() {
            pf_whole(out, nic, e, &entry)?;
            continue;
        }
        // koordlet skips the PF when VFs are listed: a pod never gets both.
        for (j, v) in e.vfs.iter().enumerate() {
            let entry = format!("{entry}.vfs[{j}]");
            let vf = resolve_vf(inv, nic, v, &entry)?;
            let dev = vf.rdma.as_ref().ok_or_else(|| PlanError::NoRdmaDevice {
                annotation: ANN,
                entry: entry.clone(),
                bus: vf.bus_id,
            })?;
            char_devs(out, &entry, vf.bus_id, dev)?;
            network(out, nic, vf, dev, &entry)?;
            record_use(out, nic, dev, true);
            out.claim(
                &entry,
                Claim {
                    device: DeviceId::Vf(vf.bus_id),
                    share: Share::Exclusive,
                    pf: Some(nic.bus_id),
                },
            );
        }
    }
    Ok(())
}

/// A PF used without VFs: its own char devices. A share below 100 is Koordinator's
/// shared RDMA, claimed as a share so that pods on the same PF add up to 100.
fn pf_whole(out: &mut Builder, nic: &RdmaNic, e: &RdmaEntry, entry: &str) -> Result<(), PlanError> {
    char_devs(out, entry, nic.bus_id, &nic.rdma)?;
    // The name goes into comma-separated env values.
    plain_name(entry, &nic.rdma.name, 64)?;
    record_use(out, nic, &nic.rdma, false);
    let share = match e.share_percent {
        FULL_SHARE => Share::Exclusive,
        s => Share::Shared {
            core: s,
            memory_ratio: s,
        },
    };
    out.claim(
        entry,
        Claim {
            device: DeviceId::Pf(nic.bus_id),
            share,
            pf: None,
        },
    );
    host_netns(out, nic, entry)
}

/// A whole PF's RDMA device stays in the host's network namespace. Where the
/// kernel is in exclusive mode a pod with a namespace of its own could not
/// open it: refused, as nothing would work. A pod whose namespace is not told
/// (or a node whose exclusive mode only the config asks for) gets a warning.
fn host_netns(out: &mut Builder, nic: &RdmaNic, entry: &str) -> Result<(), PlanError> {
    use super::PodNetwork;
    match out.network {
        PodNetwork::Own if out.rdma_exclusive => Err(PlanError::PfInHostNetns {
            annotation: ANN,
            entry: entry.to_string(),
            pf: nic.bus_id,
        }),
        PodNetwork::Host => Ok(()),
        PodNetwork::Own | PodNetwork::Unknown => {
            if out.move_rdma {
                out.plan.warnings.push(format!(
                    "{entry}: pf {} is used without vfs while rdma netns mode is exclusive: it stays in the host netns",
                    nic.bus_id
                ));
            }
            Ok(())
        }
    }
}

/// Settings the PF applies need its netdev; without one on the host the hook
/// would refuse the container at createRuntime, after its claim and from a
/// message that names no entry. Refused here, blaming the annotation that set
/// the setting.
fn without_pf(
    out: &Builder,
    nic: &RdmaNic,
    settings: &crate::config::VfSettings,
    entry: &str,
) -> Result<(), PlanError> {
    if !nic.netdevs.is_empty() {
        return Ok(());
    }
    let Some(setting) = settings.set_names().into_iter().find(|n| n.through_pf()) else {
        return Ok(());
    };
    let by_pod = out
        .pod_vf_settings
        .is_some_and(|p| p.set_names().contains(&setting));
    Err(PlanError::VfSettingWithoutPf {
        annotation: if by_pod {
            crate::allocation::VF_SETTINGS
        } else {
            ANN
        },
        entry: entry.to_string(),
        setting: setting.as_str(),
        pf: nic.bus_id,
    })
}

/// Records a device for the communication-library variables; a VF sits below its
/// PF's switch, so the PF's NUMA node is the VF's. `moved`: its netdev goes into
/// the pod, where it gets its addresses.
fn record_use(out: &mut Builder, nic: &RdmaNic, dev: &RdmaDev, moved: bool) {
    out.comm.rdma.push(RdmaUse {
        name: dev.name.clone(),
        ports: dev.ports.clone(),
        numa: nic.topology.numa_node,
        netdev_moved: moved,
    });
}

/// The PF of an entry: by `id` when present (and then the minor must agree), else
/// by minor through the one mapping the Device CR report also uses.
fn resolve_pf<'a>(
    inv: &'a Inventory,
    minors: &[u32],
    e: &RdmaEntry,
    entry: &str,
) -> Result<&'a RdmaNic, PlanError> {
    let Some(id) = e.pf else {
        let i =
            minors
                .iter()
                .position(|&m| m == e.minor)
                .ok_or_else(|| PlanError::UnknownRdma {
                    annotation: ANN,
                    entry: entry.to_string(),
                    minor: e.minor,
                })?;
        return Ok(&inv.rdma[i]);
    };
    let Some(i) = inv.rdma.iter().position(|n| n.bus_id == id) else {
        return Err(match owner_of_vf(inv, id) {
            Some(pf) => PlanError::IdIsVf {
                annotation: ANN,
                entry: entry.to_string(),
                id,
                pf: pf.bus_id,
            },
            None => PlanError::UnknownPf {
                annotation: ANN,
                entry: entry.to_string(),
                id,
            },
        });
    };
    match minors.get(i) {
        Some(&owner) if owner != e.minor => Err(PlanError::PfMinorMismatch {
            annotation: ANN,
            entry: entry.to_string(),
            id,
            minor: e.minor,
            owner,
        }),
        _ => Ok(&inv.rdma[i]),
    }
}

/// A VF by bus id, which must be one of `nic`'s.
fn resolve_vf<'a>(
    inv: &Inventory,
    nic: &'a RdmaNic,
    v: &VfRef,
    entry: &str,
) -> Result<&'a Vf, PlanError> {
    if let Some(vf) = nic.vfs.iter().find(|vf| vf.bus_id == v.bus_id) {
        return Ok(vf);
    }
    let entry = entry.to_string();
    Err(if let Some(owner) = owner_of_vf(inv, v.bus_id) {
        PlanError::VfOfOtherPf {
            annotation: ANN,
            entry,
            vf: v.bus_id,
            pf: nic.bus_id,
            owner: owner.bus_id,
        }
    } else if inv.rdma.iter().any(|n| n.bus_id == v.bus_id) {
        PlanError::BusIsPf {
            annotation: ANN,
            entry,
            bus: v.bus_id,
        }
    } else {
        PlanError::UnknownVf {
            annotation: ANN,
            entry,
            bus: v.bus_id,
        }
    })
}

fn owner_of_vf(inv: &Inventory, bus: PciAddr) -> Option<&RdmaNic> {
    inv.rdma
        .iter()
        .find(|n| n.vfs.iter().any(|vf| vf.bus_id == bus))
}

/// uverbs (required), then umad per port, then issm per port when the config allows
/// subnet-manager access. Numbers come from sysfs via the inventory, never computed.
fn char_devs(out: &mut Builder, entry: &str, bus: PciAddr, dev: &RdmaDev) -> Result<(), PlanError> {
    if !dev.char_devs.iter().any(|c| c.kind == RdmaCharKind::Uverbs) {
        return Err(PlanError::NoUverbs {
            annotation: ANN,
            entry: entry.to_string(),
            bus,
        });
    }
    for c in granted_chars(out, dev) {
        plain_name(entry, &c.name, 32)?;
        out.device(
            format!("/dev/infiniband/{}", c.name),
            c.dev.major,
            c.dev.minor,
        );
    }
    Ok(())
}

/// The char devices of `dev` a container gets as nodes, in that order.
fn granted_chars<'d>(out: &Builder, dev: &'d RdmaDev) -> Vec<&'d RdmaCharDev> {
    let allow_issm = out.config.rdma.allow_issm;
    [RdmaCharKind::Uverbs, RdmaCharKind::Umad, RdmaCharKind::Issm]
        .into_iter()
        .filter(|&kind| kind != RdmaCharKind::Issm || allow_issm)
        .flat_map(|kind| dev.char_devs.iter().filter(move |c| c.kind == kind))
        .collect()
}

fn network(
    out: &mut Builder,
    nic: &RdmaNic,
    vf: &Vf,
    dev: &RdmaDev,
    entry: &str,
) -> Result<(), PlanError> {
    if let (Some(netdev), false) = (&vf.netdev, vf.more_netdevs.is_empty()) {
        return Err(PlanError::VfNetdevs {
            annotation: ANN,
            entry: entry.to_string(),
            bus: vf.bus_id,
            netdev: netdev.clone(),
            more: vf.more_netdevs.clone(),
        });
    }
    for name in vf.netdev.iter().chain(nic.netdevs.first()) {
        plain_name(entry, name, MAX_IFNAME)?;
    }
    plain_name(entry, &dev.name, 64)?;
    // Named whether or not its netdev is on the host: one already moved into
    // this pod by its network owner is `net<n>` there all the same. Who needs
    // the host netdev (the container that moves it) is the plugin's to judge.
    let settings = out.config.vf.for_pod(&nic.bus_id, out.pod_vf_settings);
    if let Some((setting, reason)) = settings.out_of_range().or_else(|| settings.vlan_missing()) {
        let (entry, setting, pf) = (entry.to_string(), setting.as_str(), nic.bus_id);
        // Blame the pod's annotation only where it brought settings.
        return Err(match out.pod_vf_settings {
            Some(_) => PlanError::VfSettingsConflict {
                annotation: crate::allocation::VF_SETTINGS,
                entry,
                setting,
                reason,
                pf,
            },
            None => PlanError::VfNodeSettings {
                annotation: ANN,
                entry,
                setting,
                reason,
                pf,
            },
        });
    }
    without_pf(out, nic, &settings, entry)?;
    if out.plan.network.len() >= crate::hook::MAX_NETWORKS {
        return Err(PlanError::TooManyVfs {
            annotation: ANN,
            entry: entry.to_string(),
            max: crate::hook::MAX_NETWORKS,
        });
    }
    let n = out.plan.network.len() + 1;
    let container_ifname = format!("{}{n}", out.config.rdma.ifname_prefix);
    let move_rdma = out.move_rdma;
    let rdma_chars = if move_rdma {
        granted_chars(out, dev)
            .into_iter()
            .map(|c| crate::netdev::settings::CharNum {
                name: c.name.clone(),
                major: c.dev.major,
                minor: c.dev.minor,
            })
            .collect()
    } else {
        Vec::new()
    };
    out.plan.network.push(NetworkAction {
        pf: nic.bus_id,
        pf_netdev: nic.netdevs.first().cloned(),
        vf_index: vf.index,
        vf_bus_id: vf.bus_id,
        netdev: vf.netdev.clone(),
        rdma_device: Some(dev.name.clone()),
        container_ifname,
        settings,
        move_rdma,
        rdma_chars,
    });
    Ok(())
}
