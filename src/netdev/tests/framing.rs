//! Replies as the kernel may frame them: several messages in one datagram,
//! each padded to 4 bytes (NLMSG_ALIGN), and a late answer to an earlier
//! request in front of the current one's.

use netlink_packet_core::NLMSG_ERROR;

use crate::netdev::nl::script::{Reply, Script};
use crate::netdev::nl::{frame, Conn, Kind, NlError};

/// RTM_NEWLINK, the message type of a link listing.
const NEWLINK: u16 = 16;
const GETLINK: u16 = 18;

/// Payloads whose lengths are not multiples of 4, so packing pads them.
fn payloads() -> Vec<Vec<u8>> {
    vec![vec![1; 17], vec![2; 22], vec![3; 3], vec![4; 40]]
}

/// The replies of one dump, with its messages one per datagram or packed.
fn dump(packed: bool, stale: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, NlError> {
    let mut script = Script::new(vec![Reply::Dump {
        msg_type: NEWLINK,
        payloads: payloads(),
    }]);
    script.packed = packed;
    script.stale = stale;
    let mut conn = Conn::new(script);
    conn.request("list links", GETLINK, Kind::Dump, &[0; 16])
}

/// An answer to request `seq`, which is not the one asked now (sequence 1).
fn late(seq: u32, msg_type: u16, body: &[u8]) -> Vec<u8> {
    frame(msg_type, 2, seq, body)
}

#[test]
fn a_dump_packed_in_one_datagram_reads_as_one_message_per_datagram() {
    let apart = dump(false, Vec::new()).unwrap();
    let packed = dump(true, Vec::new()).unwrap();
    assert_eq!(apart, payloads());
    // The padding is not part of a message: each payload comes back whole.
    assert_eq!(packed, apart);
}

#[test]
fn late_answers_to_earlier_requests_in_the_same_datagram_are_passed_over() {
    // A listing and an error of request 7, packed before request 1's replies:
    // neither ends or fails the current request.
    let stale = vec![
        late(7, NEWLINK, &[9; 21]),
        late(7, NLMSG_ERROR, &(-libc::ENODEV).to_ne_bytes()),
    ];
    assert_eq!(dump(true, stale.clone()).unwrap(), payloads());
    assert_eq!(dump(false, stale).unwrap(), payloads());
}

#[test]
fn an_error_packed_after_replies_fails_the_request() {
    let mut script = Script::new(vec![Reply::Errno(libc::EPERM)]);
    script.packed = true;
    script.stale = vec![late(3, NEWLINK, &[5; 30])];
    let mut conn = Conn::new(script);
    let err = conn
        .request("set link", GETLINK, Kind::Do, &[0; 16])
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::EPERM), "{err}");
}

#[test]
fn a_message_whose_length_runs_past_the_datagram_is_malformed() {
    let mut script = Script::new(vec![Reply::Dump {
        msg_type: NEWLINK,
        payloads: payloads(),
    }]);
    script.packed = true;
    // A stale message claiming more bytes than the datagram holds.
    let mut lying = late(4, NEWLINK, &[0; 8]);
    lying[..4].copy_from_slice(&4096u32.to_ne_bytes());
    script.stale = vec![lying];
    let mut conn = Conn::new(script);
    let err = conn
        .request("list links", GETLINK, Kind::Dump, &[0; 16])
        .unwrap_err();
    assert!(matches!(err, NlError::Malformed { .. }), "{err:?}");
}
