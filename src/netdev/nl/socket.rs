//! The kernel's netlink socket as a [`Transport`]: one protocol, bounded
//! waits and datagrams, and the link notices of its netns where asked.

use std::io;
use std::time::Duration;

use super::{NlError, Transport, MAX_DATAGRAM, NLMSG_HDRLEN, REPLY_TIMEOUT};
use crate::netdev::linkwatch::LinkWatch;

/// A kernel netlink socket of one protocol, bound to the netns of the thread that
/// created it (net/netlink/af_netlink.c takes `current->nsproxy->net_ns`).
pub struct NlSocket {
    sock: netlink_sys::Socket,
    watch: Option<LinkWatch>,
}

impl NlSocket {
    pub fn open(protocol: isize) -> Result<NlSocket, NlError> {
        let err = |source| NlError::Socket { op: "open", source };
        let mut sock = netlink_sys::Socket::new(protocol).map_err(err)?;
        sock.bind_auto().map_err(err)?;
        sock.connect(&netlink_sys::SocketAddr::new(0, 0))
            .map_err(err)?;
        crate::netdev::extack::ask(std::os::fd::AsRawFd::as_raw_fd(&sock));
        let mut sock = NlSocket { sock, watch: None };
        sock.set_reply_timeout(REPLY_TIMEOUT)?;
        Ok(sock)
    }

    /// Bounds each wait for a datagram (`SO_RCVTIMEO`); a wait that runs out
    /// fails with `TimedOut`.
    pub fn set_reply_timeout(&mut self, after: Duration) -> Result<(), NlError> {
        use nix::sys::socket::{setsockopt, sockopt::ReceiveTimeout};
        let after = nix::sys::time::TimeVal::new(after.as_secs() as _, after.subsec_micros() as _);
        setsockopt(&self.sock, ReceiveTimeout, &after).map_err(|e| NlError::Socket {
            op: "set reply timeout",
            source: e.into(),
        })
    }

    /// The bound [`NlSocket::set_reply_timeout`] set, as the kernel holds it.
    #[cfg(test)]
    pub fn reply_timeout(&self) -> io::Result<Duration> {
        use nix::sys::socket::{getsockopt, sockopt::ReceiveTimeout};
        let t = getsockopt(&self.sock, ReceiveTimeout)?;
        Ok(Duration::from_micros(
            (t.tv_sec() as u64) * 1_000_000 + t.tv_usec() as u64,
        ))
    }

    /// With the link notices of the calling thread's netns, which must be the
    /// one the socket was opened in.
    pub fn with_link_watch(mut self) -> Result<NlSocket, NlError> {
        let watch = LinkWatch::open().map_err(|source| NlError::Socket {
            op: "watch links",
            source,
        })?;
        self.watch = Some(watch);
        Ok(self)
    }
}

impl Transport for NlSocket {
    fn send(&mut self, datagram: &[u8]) -> io::Result<()> {
        let sent = self.sock.send(datagram, 0)?;
        if sent != datagram.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short netlink send",
            ));
        }
        Ok(())
    }

    fn recv(&mut self) -> io::Result<Vec<u8>> {
        // Peek for the size first (MSG_TRUNC reports the full length), so a large
        // VF list is never cut short.
        let mut probe: Vec<u8> = Vec::new();
        // With SO_RCVTIMEO a receive a signal interrupts is not restarted
        // (signal(7)): asked again, with the bound anew.
        let len = loop {
            match self.sock.recv(&mut probe, libc::MSG_PEEK | libc::MSG_TRUNC) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other.map_err(timed_out)?,
            }
        };
        if len > MAX_DATAGRAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("netlink datagram of {len} bytes"),
            ));
        }
        let mut buf = Vec::with_capacity(len.max(NLMSG_HDRLEN));
        let got = self.sock.recv(&mut buf, 0)?;
        buf.truncate(got.min(buf.len()));
        Ok(buf)
    }

    fn drvinfo(&mut self, name: &[u8]) -> io::Result<Option<crate::netdev::ethtool::Drv>> {
        use std::os::fd::AsRawFd;
        crate::netdev::ethtool::drvinfo(self.sock.as_raw_fd(), name)
    }

    fn link_notices(&mut self) -> io::Result<Option<Vec<Vec<u8>>>> {
        match &mut self.watch {
            Some(w) => w.notices(),
            None => Ok(None),
        }
    }

    fn watches_links(&self) -> bool {
        self.watch.is_some()
    }
}

/// A blocking receive that ran past its `SO_RCVTIMEO` fails with EAGAIN
/// (socket(7)); said as what it means here.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        return io::Error::new(io::ErrorKind::TimedOut, "no reply from the kernel in time");
    }
    e
}
