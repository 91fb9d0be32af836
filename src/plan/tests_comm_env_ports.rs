//! Communication variables when an RDMA device's ports are down or unknown, or
//! its name cannot stand in a list, and which GID of a port's table is chosen.
use super::comm_env::roce_v2_index;
use super::testinv::hgx;
use super::tests::pod;
use super::tests_comm_env::rdma;
use super::tests_gid_fakes::{gid, roce_table, FakeTable, LINK_LOCAL, V4};
use super::*;
use crate::config::GidFamily;
use crate::inventory::GidEntry;

#[test]
fn ports_that_are_down_or_unknown() {
    let mut inv = hgx();
    let vf = inv.rdma[0].vfs[0].rdma.as_mut().unwrap();
    vf.ports[0].state = "DOWN".into();
    let ann = rdma(&[(0, &[0, 1])]);
    let p = build(&inv, &pod(&ann), "main", &Config::default()).unwrap();
    assert_eq!(p.env["NCCL_IB_HCA"], "=mlx5_5:1,mlx5_6:1");
    assert_eq!(
        p.warnings,
        ["comm_env: rdma device mlx5_5 has no ACTIVE port: listed with all its ports"]
    );

    inv.rdma[0].vfs[0].rdma.as_mut().unwrap().ports.clear();
    let p = build(&inv, &pod(&ann), "main", &Config::default()).unwrap();
    assert!(!p.env.contains_key("NCCL_IB_HCA") && !p.env.contains_key("UCX_NET_DEVICES"));
    assert_eq!(p.env["NCCL_SOCKET_IFNAME"], "net1,net2");
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert!(
        p.warnings[0].contains("mlx5_5 has no ports"),
        "{:?}",
        p.warnings
    );
}

#[test]
fn a_device_name_unfit_for_a_list_refuses_the_plan() {
    let mut inv = hgx();
    inv.rdma[4].rdma.name = "roce,p175".into();
    let e = build(
        &inv,
        &pod(r#"{"rdma":[{"minor":4}]}"#),
        "main",
        &Config::default(),
    );
    assert!(matches!(e, Err(PlanError::UnsafeName { .. })), "{e:?}");
}

#[test]
fn roce_v2_gid_selection() {
    let v1_only = vec![gid(0, "IB/RoCE v1", LINK_LOCAL), gid(2, "IB/RoCE v1", V4)];
    let link_local_only = vec![
        gid(0, "IB/RoCE v1", LINK_LOCAL),
        gid(1, "RoCE v2", LINK_LOCAL),
    ];
    let unparsable = vec![gid(3, "RoCE v2", "not a gid"), gid(4, "RoCE v2", "::")];
    let no_gid_text = vec![GidEntry {
        gid: None,
        ..gid(3, "RoCE v2", V4)
    }];
    let two_v4 = vec![gid(9, "RoCE v2", V4), gid(3, "RoCE v2", V4)];
    let table: [(&[GidEntry], GidFamily, Option<u32>); 9] = [
        (&roce_table(), GidFamily::Ipv4, Some(3)),
        (&roce_table(), GidFamily::Ipv6, Some(5)),
        (&[], GidFamily::Ipv4, None),
        (&v1_only, GidFamily::Ipv4, None),
        (&link_local_only, GidFamily::Ipv4, None),
        (&link_local_only, GidFamily::Ipv6, None),
        (&unparsable, GidFamily::Ipv6, None),
        (&no_gid_text, GidFamily::Ipv4, None),
        (&two_v4, GidFamily::Ipv4, Some(3)),
    ];
    for (i, (gids, family, want)) in table.into_iter().enumerate() {
        let table = FakeTable::new(gids.to_vec());
        assert_eq!(roce_v2_index(&table, family), want, "row {i}");
    }
}

/// A table has up to 256 slots, each a sysfs file: they are read in index order
/// up to the first match, and a slot's GID only when its type is RoCE v2.
#[test]
fn gid_slots_are_read_up_to_the_first_match() {
    let table = FakeTable::new(roce_table());
    assert_eq!(roce_v2_index(&table, GidFamily::Ipv4), Some(3));
    let reads = table.reads.borrow();
    let want = ["type 0", "type 1", "gid 1", "type 2", "type 3", "gid 3"];
    assert_eq!(*reads, want);
}
