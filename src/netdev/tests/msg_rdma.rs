//! The RDMA netlink (NLDEV) messages sent to the kernel, compared with
//! messages assembled by hand from include/uapi/rdma/rdma_netlink.h. The real
//! `RdmaConn` code runs; only the socket is a script.

use std::os::fd::AsRawFd;

use super::msg::{attr, message, u32s, REQUEST_ACK};
use crate::netdev::nl::script::{Reply, Script};
use crate::netdev::rdma::{NetnsMode, RdmaConn, RdmaNl};
use crate::netdev::Netns;

#[test]
fn rdma_move_is_nldev_set_with_index_and_fd() {
    let ns = Netns::fake(42);
    let mut c = RdmaConn::new(Script::new(vec![Reply::Errno(0)]));
    c.set_netns(3, &ns).unwrap();
    // (RDMA_NL_NLDEV 5 << 10) | RDMA_NLDEV_CMD_SET 2; DEV_INDEX(1), NET_NS_FD(68).
    let mut body = attr(1, &u32s(&[3]));
    body.extend(attr(68, &u32s(&[ns.as_raw_fd() as u32])));
    assert_eq!(
        c.transport().sent[0],
        message((5 << 10) | 2, REQUEST_ACK, &body)
    );
}

#[test]
fn rdma_get_dumps_and_matches_the_name() {
    let dev = |i: u32, name: &[u8]| {
        let mut p = attr(1, &u32s(&[i]));
        p.extend(attr(2, name));
        p.extend(attr(6, &[0u8; 8])); // NODE_GUID
        p
    };
    let reply = Reply::Dump {
        msg_type: (5 << 10) | 1,
        payloads: vec![dev(1, b"mlx5_0\0"), dev(4, b"mlx5_3\0")],
    };
    let mut c = RdmaConn::new(Script::new(vec![reply]));
    assert_eq!(c.dev_index("mlx5_3").unwrap(), Some(4));
    // RDMA_NLDEV_CMD_GET(1) with NLM_F_REQUEST | NLM_F_DUMP, no attributes.
    assert_eq!(
        c.transport().sent[0],
        message((5 << 10) | 1, 0x1 | 0x300, &[])
    );
    let mut c = RdmaConn::new(Script::new(vec![Reply::Dump {
        msg_type: (5 << 10) | 1,
        payloads: vec![dev(1, b"mlx5_0\0")],
    }]));
    assert_eq!(c.dev_index("mlx5_3").unwrap(), None);
    // A name a pod made that is not UTF-8: still listed by its index.
    let mut c = RdmaConn::new(Script::new(vec![Reply::Dump {
        msg_type: (5 << 10) | 1,
        payloads: vec![dev(4, b"\xffpod\0")],
    }]));
    assert_eq!(c.dev_name(4).unwrap().as_deref(), Some("\u{fffd}pod"));
}

#[test]
fn rdma_netns_mode_is_sys_get() {
    for (raw, want) in [(0u8, NetnsMode::Exclusive), (1, NetnsMode::Shared)] {
        let reply = Reply::Ack {
            msg_type: (5 << 10) | 6,
            payloads: vec![attr(66, &[raw])],
        };
        let mut c = RdmaConn::new(Script::new(vec![reply]));
        assert_eq!(c.netns_mode().unwrap(), want);
        assert_eq!(
            c.transport().sent[0],
            message((5 << 10) | 6, REQUEST_ACK, &[])
        );
    }
}

#[test]
fn rdma_rename_is_nldev_set_with_index_and_nul_terminated_name() {
    let mut c = RdmaConn::new(Script::new(vec![Reply::Errno(0)]));
    c.rename(5, "mlx5_3").unwrap();
    // RDMA_NLDEV_CMD_SET(2); DEV_INDEX(1) u32, DEV_NAME(2) with its NUL, as
    // iproute2's mnl_attr_put_strz (the policy is NLA_NUL_STRING).
    let mut body = attr(1, &u32s(&[5]));
    body.extend(attr(2, b"mlx5_3\0"));
    assert_eq!(
        c.transport().sent[0],
        message((5 << 10) | 2, REQUEST_ACK, &body)
    );
}

#[test]
fn rdma_dev_name_dumps_and_matches_the_index() {
    let dump = || Reply::Dump {
        msg_type: (5 << 10) | 1,
        payloads: vec![
            [attr(1, &u32s(&[1])), attr(2, b"mlx5_0\0")].concat(),
            [attr(1, &u32s(&[4])), attr(2, b"tenant0\0")].concat(),
        ],
    };
    let mut c = RdmaConn::new(Script::new(vec![dump(), dump()]));
    assert_eq!(c.dev_name(4).unwrap().as_deref(), Some("tenant0"));
    assert_eq!(
        c.transport().sent[0],
        message((5 << 10) | 1, 0x1 | 0x300, &[])
    );
    assert_eq!(c.dev_name(5).unwrap(), None);
}
