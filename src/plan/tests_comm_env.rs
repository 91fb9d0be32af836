//! Communication-library variables: table tests over IB and RoCE ports, mixed link
//! layers, missing GID types, values the container sets itself, and config overrides.
use std::collections::BTreeMap;

use super::testinv::{hgx, pf_bus, uuid, vf_bus};
use super::tests::pod;
use super::tests_gid_fakes::{gid, roce_table, FakeGids, LINK_LOCAL, V4};
use super::*;
use crate::allocation::{parse_pod, CONTAINERS};
use crate::config::{GidFamily, VarSetting};

/// `{"rdma":[...]}` with one entry per `(pf, [vfs])`; no VFs = the PF whole.
pub(super) fn rdma(entries: &[(u32, &[u32])]) -> String {
    let list: Vec<String> = entries
        .iter()
        .map(|(pf, vfs)| {
            let vfs: Vec<String> = vfs
                .iter()
                .map(|v| format!(r#"{{"busID":"{}"}}"#, vf_bus(*pf, *v)))
                .collect();
            format!(
                r#"{{"minor":{pf},"id":"{}","extension":{{"vfs":[{}]}}}}"#,
                pf_bus(*pf),
                vfs.join(",")
            )
        })
        .collect();
    format!(r#"{{"rdma":[{}]}}"#, list.join(","))
}

fn with_gpus(rdma_json: &str, minors: &[u32]) -> String {
    let gpus: Vec<String> = minors
        .iter()
        .map(|m| format!(r#"{{"minor":{m}}}"#))
        .collect();
    let tail = rdma_json.trim_start_matches('{');
    format!(r#"{{"gpu":[{}],{tail}"#, gpus.join(","))
}

struct Case {
    name: &'static str,
    ann: String,
    config: Config,
    env: Vec<String>,
    gids: FakeGids,
    /// Every variable besides `NVIDIA_VISIBLE_DEVICES`.
    want: Vec<(&'static str, String)>,
    warning: Option<&'static str>,
    /// An expected omission, logged at debug rather than warned about.
    note: Option<&'static str>,
    reads: Vec<&'static str>,
}

fn case(name: &'static str, ann: String) -> Case {
    Case {
        name,
        ann,
        config: Config::default(),
        env: Vec::new(),
        gids: FakeGids::default(),
        want: Vec::new(),
        warning: None,
        note: None,
        reads: Vec::new(),
    }
}

fn want(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

fn config(edit: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    edit(&mut c);
    c
}

fn cases() -> Vec<Case> {
    let roce = || FakeGids::with(&[("mlx5_9", roce_table()), ("mlx5_10", roce_table())]);
    let roce_pfs = || FakeGids::with(&[("mlx5_1", roce_table()), ("mlx5_3", roce_table())]);
    vec![
        Case {
            want: want(&[
                ("NCCL_IB_HCA", "=mlx5_5:1,mlx5_6:1"),
                ("NCCL_SOCKET_IFNAME", "net1,net2"),
                ("UCX_NET_DEVICES", "mlx5_5:1,mlx5_6:1"),
            ]),
            ..case("infiniband vfs: no gid reads", rdma(&[(0, &[0, 1])]))
        },
        Case {
            gids: roce(),
            want: want(&[
                ("NCCL_IB_HCA", "=mlx5_9:1,mlx5_10:1"),
                ("NCCL_SOCKET_IFNAME", "net1,net2"),
                ("UCX_NET_DEVICES", "mlx5_9:1,mlx5_10:1"),
            ]),
            note: Some(
                "NCCL_IB_GID_INDEX not set: mlx5_9:1's netdev moves into the pod, whose addresses decide its GID slots",
            ),
            ..case(
                "roce vfs moved in: their host tables say nothing of the pod's, and are not read",
                rdma(&[(1, &[0, 1])]),
            )
        },
        Case {
            gids: FakeGids::with(&[("mlx5_9", roce_table()[..2].to_vec())]),
            want: want(&[
                ("NCCL_IB_HCA", "=mlx5_9:1"),
                ("NCCL_SOCKET_IFNAME", "net1"),
                ("UCX_NET_DEVICES", "mlx5_9:1"),
            ]),
            note: Some("NCCL_IB_GID_INDEX not set: mlx5_9:1's netdev moves into the pod"),
            ..case(
                "a roce vf with no address on the host: not set",
                rdma(&[(1, &[0])]),
            )
        },
        Case {
            gids: roce_pfs(),
            want: want(&[
                ("NCCL_IB_GID_INDEX", "3"),
                ("NCCL_IB_HCA", "=mlx5_1:1,mlx5_3:1"),
                ("UCX_NET_DEVICES", "mlx5_1:1,mlx5_3:1"),
            ]),
            reads: vec!["mlx5_1:1", "mlx5_3:1"],
            ..case(
                "roce pfs whole: the ipv4 roce v2 gid",
                rdma(&[(1, &[]), (3, &[])]),
            )
        },
        Case {
            gids: FakeGids::with(&[("mlx5_9", roce_table()), ("mlx5_3", roce_table())]),
            want: want(&[
                ("NCCL_IB_HCA", "=mlx5_9:1,mlx5_3:1"),
                ("NCCL_SOCKET_IFNAME", "net1"),
                ("UCX_NET_DEVICES", "mlx5_9:1,mlx5_3:1"),
            ]),
            note: Some("NCCL_IB_GID_INDEX not set: mlx5_9:1's netdev moves into the pod"),
            ..case(
                "a moved roce vf beside a whole pf: no index for either",
                rdma(&[(1, &[0]), (3, &[])]),
            )
        },
        Case {
            env: vec!["NCCL_IB_ADDR_RANGE=10.1.0.0/16".into()],
            gids: roce_pfs(),
            want: want(&[
                ("NCCL_IB_HCA", "=mlx5_1:1,mlx5_3:1"),
                ("UCX_NET_DEVICES", "mlx5_1:1,mlx5_3:1"),
            ]),
            note: Some("NCCL_IB_GID_INDEX not set: the container sets NCCL_IB_ADDR_RANGE"),
            ..case(
                "the container's address range chooses the gid: no index over it",
                rdma(&[(1, &[]), (3, &[])]),
            )
        },
        Case {
            env: vec!["NCCL_IB_ROCE_VERSION_NUM=1".into()],
            gids: roce_pfs(),
            want: want(&[
                ("NCCL_IB_HCA", "=mlx5_1:1,mlx5_3:1"),
                ("UCX_NET_DEVICES", "mlx5_1:1,mlx5_3:1"),
            ]),
            note: Some("the container sets NCCL_IB_ROCE_VERSION_NUM"),
            ..case(
                "the container's roce version chooses the gid too",
                rdma(&[(1, &[]), (3, &[])]),
            )
        },
        Case {
            gids: FakeGids::with(&[("mlx5_1", roce_table())]),
            want: want(&[
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
                ("NCCL_IB_GID_INDEX", "3"),
                ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1"),
                ("UCX_NET_DEVICES", "mlx5_0:1,mlx5_1:1"),
            ]),
            reads: vec!["mlx5_1:1"],
            ..case(
                "mixed link layers: the index from the roce port only",
                with_gpus(&rdma(&[(0, &[]), (1, &[])]), &[0, 1]),
            )
        },
        Case {
            gids: FakeGids::with(&[("mlx5_1", roce_table())]),
            want: want(&[
                ("NCCL_IB_HCA", "=mlx5_1:1,mlx5_3:1"),
                ("UCX_NET_DEVICES", "mlx5_1:1,mlx5_3:1"),
            ]),
            warning: Some("NCCL_IB_GID_INDEX not set: mlx5_3:1 has no RoCE v2 GID of family ipv4"),
            reads: vec!["mlx5_1:1", "mlx5_3:1"],
            ..case("missing gid types", rdma(&[(1, &[]), (3, &[])]))
        },
        Case {
            gids: FakeGids::with(&[
                ("mlx5_1", roce_table()),
                (
                    "mlx5_3",
                    vec![gid(1, "RoCE v2", LINK_LOCAL), gid(7, "RoCE v2", V4)],
                ),
            ]),
            want: want(&[
                ("NCCL_IB_HCA", "=mlx5_1:1,mlx5_3:1"),
                ("UCX_NET_DEVICES", "mlx5_1:1,mlx5_3:1"),
            ]),
            warning: Some("the RoCE v2 GID indices differ (mlx5_1:1=3, mlx5_3:1=7)"),
            reads: vec!["mlx5_1:1", "mlx5_3:1"],
            ..case("devices that disagree", rdma(&[(1, &[]), (3, &[])]))
        },
        Case {
            config: config(|c| c.comm_env.gid_family = GidFamily::Ipv6),
            gids: FakeGids::with(&[("rocep175s0f0", roce_table())]),
            want: want(&[
                ("NCCL_IB_GID_INDEX", "5"),
                ("NCCL_IB_HCA", "=rocep175s0f0:1"),
                ("UCX_NET_DEVICES", "rocep175s0f0:1"),
            ]),
            reads: vec!["rocep175s0f0:1"],
            ..case("ipv6 from the config, a whole pf", rdma(&[(4, &[])]))
        },
        Case {
            env: vec!["NCCL_IB_ADDR_FAMILY=AF_INET6".into()],
            gids: FakeGids::with(&[("rocep175s0f0", roce_table())]),
            want: want(&[
                ("NCCL_IB_GID_INDEX", "5"),
                ("NCCL_IB_HCA", "=rocep175s0f0:1"),
                ("UCX_NET_DEVICES", "rocep175s0f0:1"),
            ]),
            reads: vec!["rocep175s0f0:1"],
            ..case("ipv6 asked for by the container", rdma(&[(4, &[])]))
        },
        Case {
            env: vec![
                "PATH=/bin".into(),
                "NCCL_IB_HCA=mlx5_0".into(),
                "UCX_NET_DEVICES=".into(),
                "NCCL_IB_GID_INDEX=0".into(),
                "CUDA_DEVICE_ORDER".into(),
            ],
            gids: roce(),
            want: want(&[("NCCL_SOCKET_IFNAME", "net1")]),
            ..case(
                "the container's own values win, and its gid index spares the reads",
                with_gpus(&rdma(&[(1, &[0])]), &[2]),
            )
        },
        Case {
            config: config(|c| {
                c.comm_env.nccl_ib_hca = VarSetting::On(false);
                c.comm_env.cuda_device_order = VarSetting::On(false);
                c.comm_env.nccl_socket_ifname = VarSetting::Rename("GLOO_SOCKET_IFNAME".into());
                c.comm_env.nccl_ib_gid_index = VarSetting::On(false);
                c.comm_env.extra = BTreeMap::from([
                    ("NCCL_IB_HCA".to_string(), "^{rdma_devices}".to_string()),
                    ("MY_GPUS".to_string(), "{gpu_uuids}".to_string()),
                    ("MY_NUMA".to_string(), "numa={numa_nodes}".to_string()),
                    (
                        "MY_NETS".to_string(),
                        "{netdevs};{rdma_devices}".to_string(),
                    ),
                ]);
            }),
            gids: roce(),
            want: vec![
                ("GLOO_SOCKET_IFNAME", "net1".into()),
                ("MY_GPUS", format!("{},{}", uuid(5), uuid(0))),
                ("MY_NETS", "net1;mlx5_9,rocep175s0f0".into()),
                ("MY_NUMA", "numa=0,1".into()),
                ("NCCL_IB_HCA", "^mlx5_9,rocep175s0f0".into()),
                ("UCX_NET_DEVICES", "mlx5_9:1,rocep175s0f0:1".into()),
            ],
            ..case(
                "config: off, renamed, templated",
                with_gpus(&rdma(&[(1, &[0]), (4, &[])]), &[5, 0]),
            )
        },
        Case {
            config: config(|c| {
                c.comm_env.extra = BTreeMap::from([
                    ("MY_NETS".to_string(), "{netdevs}".to_string()),
                    ("MY_GPUS".to_string(), "x{gpu_uuids}".to_string()),
                ]);
            }),
            want: vec![
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".into()),
                ("MY_GPUS", format!("x{}", uuid(6))),
            ],
            ..case(
                "templates with an empty list set nothing",
                r#"{"gpu":[{"minor":6}]}"#.into(),
            )
        },
        Case {
            config: config(|c| {
                c.comm_env.extra = BTreeMap::from([("LITERAL".to_string(), "x".to_string())]);
            }),
            ..case(
                "no gpu or rdma device: not even a literal template",
                r#"{"fpga":[{"minor":0}]}"#.into(),
            )
        },
        Case {
            config: config(|c| {
                c.comm_env.enabled = false;
                c.comm_env.extra = BTreeMap::from([("X".to_string(), "{gpu_uuids}".to_string())]);
            }),
            gids: roce(),
            ..case(
                "turned off entirely",
                with_gpus(&rdma(&[(1, &[0, 1])]), &[0]),
            )
        },
    ]
}

#[test]
fn variables_by_case() {
    for c in cases() {
        let ctx = ContainerContext {
            env: &c.env,
            gids: &c.gids,
            network: crate::plan::PodNetwork::Unknown,
        };
        let p = build_for(&hgx(), &pod(&c.ann), "main", &c.config, &ctx)
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let got: Vec<(&str, String)> = p
            .env
            .iter()
            .filter(|(k, _)| *k != "NVIDIA_VISIBLE_DEVICES")
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        assert_eq!(got, c.want, "{}", c.name);
        assert_lines(c.name, "warnings", c.warning, &p.warnings);
        assert_lines(c.name, "notes", c.note, &p.notes);
        assert_eq!(*c.gids.reads.borrow(), c.reads, "{}: gid reads", c.name);
    }
}

/// `got` has a line containing `want`, or is empty when none is wanted.
fn assert_lines(case: &str, what: &str, want: Option<&str>, got: &[String]) {
    match want {
        Some(w) => assert!(got.iter().any(|x| x.contains(w)), "{case}: {what}: {got:?}"),
        None => assert!(got.is_empty(), "{case}: {what}: {got:?}"),
    }
}

#[test]
fn unselected_container_reads_nothing_and_gets_nothing() {
    let ann = rdma(&[(1, &[])]);
    let mut ann_map = BTreeMap::new();
    ann_map.insert(DEVICE_ALLOCATED.to_string(), ann);
    ann_map.insert(CONTAINERS.to_string(), "trainer".to_string());
    let p = parse_pod(&ann_map, &BTreeMap::new()).unwrap();
    let gids = FakeGids::with(&[("mlx5_1", roce_table())]);
    let ctx = ContainerContext {
        env: &[],
        gids: &gids,
        network: crate::plan::PodNetwork::Unknown,
    };
    let plan = build_for(&hgx(), &p, "sidecar", &Config::default(), &ctx).unwrap();
    assert!(plan.env.is_empty());
    assert!(gids.reads.borrow().is_empty());
    let plan = build_for(&hgx(), &p, "trainer", &Config::default(), &ctx).unwrap();
    assert_eq!(plan.env["NCCL_IB_GID_INDEX"], "3");
}
