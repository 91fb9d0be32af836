//! The real netlink socket's bound on waiting for the kernel.

use std::io;
use std::time::Duration;

use crate::netdev::nl::{Conn, Kind, NlError, NlSocket, Transport, REPLY_TIMEOUT};

/// A socket whose requests are lost on the way: the kernel never answers.
struct Unanswered(NlSocket);

impl Transport for Unanswered {
    fn send(&mut self, _datagram: &[u8]) -> io::Result<()> {
        Ok(())
    }
    fn recv(&mut self) -> io::Result<Vec<u8>> {
        self.0.recv()
    }
}

fn route_socket() -> NlSocket {
    NlSocket::open(netlink_sys::constants::NETLINK_ROUTE).expect("open a route socket")
}

#[test]
fn a_socket_is_opened_with_its_reply_bound() {
    let sock = route_socket();
    assert_eq!(sock.reply_timeout().unwrap(), REPLY_TIMEOUT);
}

#[test]
fn a_request_the_kernel_never_answers_fails_once_the_bound_has_passed() {
    let mut sock = route_socket();
    sock.set_reply_timeout(Duration::from_millis(50)).unwrap();
    // The kernel keeps the bound in jiffies, rounded up (`sock_set_timeout`).
    assert!(sock.reply_timeout().unwrap() >= Duration::from_millis(50));
    let mut conn = Conn::new(Unanswered(sock));
    let began = std::time::Instant::now();
    // RTM_GETLINK with an empty ifinfomsg.
    let err = conn
        .request("get link", 18, Kind::Dump, &[0u8; 16])
        .expect_err("nothing was sent, so nothing comes back");
    // It waited: a socket that never blocks would fail at once.
    assert!(
        began.elapsed() >= Duration::from_millis(50),
        "{:?}",
        began.elapsed()
    );
    match &err {
        NlError::Socket { op, source } => {
            assert_eq!(*op, "get link");
            assert_eq!(source.kind(), io::ErrorKind::TimedOut, "{err}");
        }
        other => panic!("expected a socket error, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "get link: netlink socket: no reply from the kernel in time"
    );
}

#[test]
fn a_request_the_kernel_answers_is_unaffected_by_the_bound() {
    let mut sock = route_socket();
    sock.set_reply_timeout(Duration::from_millis(50)).unwrap();
    let mut conn = Conn::new(sock);
    let links = conn
        .request("get link", 18, Kind::Dump, &[0u8; 16])
        .expect("the kernel lists the links of this netns");
    assert!(!links.is_empty(), "at least the loopback");
}
