//! Communication variables when an RDMA device's ports are down or unknown, or
//! its name cannot stand in a list.
use super::testinv::hgx;
use super::tests::pod;
use super::tests_comm_env::rdma;
use super::*;

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
