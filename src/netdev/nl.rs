//! Netlink request/response over a datagram transport, shared by rtnetlink and
//! RDMA netlink. The transport is the only part that differs between the real
//! socket and the scripted one the message tests use, so the bytes a test sees
//! are the bytes the kernel gets.
//!
//! Framing follows netlink(7): every reply carries the request's sequence number;
//! a request with `NLM_F_ACK` ends with an `NLMSG_ERROR` whose code is 0 (ack) or
//! a negative errno; a dump ends with `NLMSG_DONE`.

use std::io;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkBuffer, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST,
};

/// Netlink header length (`struct nlmsghdr`).
pub const NLMSG_HDRLEN: usize = 16;
/// A reply larger than this is refused rather than buffered (a PF with hundreds
/// of VFs answers a VF-info GETLINK with tens of KiB; nothing legitimate is near this).
const MAX_DATAGRAM: usize = 4 * 1024 * 1024;
/// Most messages accepted in one dump, so a misbehaving peer cannot grow memory forever.
const MAX_DUMP_MESSAGES: usize = 65_536;
/// Times a dump is asked for while the kernel reports it inconsistent.
const DUMP_TRIES: usize = 3;
/// Longest wait for the kernel's next datagram. rtnetlink and RDMA netlink run a
/// request within the sender's `sendmsg` (`netlink_unicast_kernel`,
/// net/netlink/af_netlink.c), so the answer is queued before the send returns,
/// and a dump's next part as soon as the last was read: a reply missing this long
/// was lost, and the hook fails with that rather than wait for the runtime's kill.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum NlError {
    #[error("{op}: netlink socket: {source}")]
    Socket {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// `message`: the kernel's own text, where it sent one (extended ACK).
    #[error("{op}: kernel answered {}{}", io::Error::from_raw_os_error(*.errno), .message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Kernel {
        op: &'static str,
        errno: i32,
        message: Option<String>,
    },
    #[error("{op}: malformed reply: {reason}")]
    Malformed { op: &'static str, reason: String },
}

impl NlError {
    /// The errno the kernel answered with, if that is what failed.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NlError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// The kernel has no such netlink family (EPROTONOSUPPORT from socket(2)):
    /// for NETLINK_RDMA, no RDMA core, so no RDMA device anywhere.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, NlError::Socket { source, .. } if source.raw_os_error() == Some(libc::EPROTONOSUPPORT))
    }

    /// ENODEV: rtnetlink's "no such link".
    pub fn is_no_device(&self) -> bool {
        self.errno() == Some(libc::ENODEV)
    }
}

/// One netlink socket, or a stand-in: sends one datagram, receives one datagram.
pub trait Transport {
    fn send(&mut self, datagram: &[u8]) -> io::Result<()>;
    fn recv(&mut self) -> io::Result<Vec<u8>>;
    /// `ETHTOOL_GDRVINFO` for a link of the socket's netns (see
    /// [`super::ethtool`]); `None` where the transport has no links.
    fn drvinfo(&mut self, _name: &[u8]) -> io::Result<Option<super::ethtool::Drv>> {
        Ok(None)
    }
    /// The link notices of the socket's netns since the last call (see
    /// [`super::linkwatch`]); `None` when some were lost, or the transport
    /// watches no links and so cannot tell.
    fn link_notices(&mut self) -> io::Result<Option<Vec<Vec<u8>>>> {
        Ok(None)
    }
    /// Whether [`Transport::link_notices`] reports: without a watch, a new
    /// lookup cannot tell more than the last.
    fn watches_links(&self) -> bool {
        false
    }
}

/// A request/response connection over a transport.
pub struct Conn<T> {
    transport: T,
    seq: u32,
}

/// What a request expects back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A single-object request with `NLM_F_ACK`: replies, then an ack.
    Do,
    /// `NLM_F_DUMP`: replies until `NLMSG_DONE`.
    Dump,
}

impl<T: Transport> Conn<T> {
    pub fn new(transport: T) -> Conn<T> {
        Conn { transport, seq: 0 }
    }

    pub fn transport(&self) -> &T {
        &self.transport
    }

    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    #[cfg(test)]
    pub fn into_transport(self) -> T {
        self.transport
    }

    /// Frames `payload` as one message of `msg_type` and returns the payloads of
    /// the replies (without their netlink headers).
    pub fn request(
        &mut self,
        op: &'static str,
        msg_type: u16,
        kind: Kind,
        payload: &[u8],
    ) -> Result<Vec<Vec<u8>>, NlError> {
        // A dump the kernel marks inconsistent (`NLM_F_DUMP_INTR`: the table
        // changed while it was walked) may miss or repeat objects: asked again.
        for _ in 0..DUMP_TRIES {
            if let Some(replies) = self.exchange(op, msg_type, kind, payload)? {
                return Ok(replies);
            }
        }
        Err(malformed(
            op,
            "dump interrupted by concurrent changes every time",
        ))
    }

    /// One request and its replies; `None` when a dump came back inconsistent.
    fn exchange(
        &mut self,
        op: &'static str,
        msg_type: u16,
        kind: Kind,
        payload: &[u8],
    ) -> Result<Option<Vec<Vec<u8>>>, NlError> {
        self.seq = self.seq.wrapping_add(1).max(1);
        let flags = match kind {
            Kind::Do => NLM_F_REQUEST | NLM_F_ACK,
            Kind::Dump => NLM_F_REQUEST | NLM_F_DUMP,
        };
        let datagram = frame(msg_type, flags, self.seq, payload);
        self.transport
            .send(&datagram)
            .map_err(|source| NlError::Socket { op, source })?;
        let mut replies = Vec::new();
        let mut interrupted = false;
        loop {
            let data = self
                .transport
                .recv()
                .map_err(|source| NlError::Socket { op, source })?;
            if data.is_empty() {
                return Err(malformed(op, "empty datagram"));
            }
            if self.take(op, &data, &mut replies, &mut interrupted)? {
                return Ok((!interrupted).then_some(replies));
            }
            if replies.len() > MAX_DUMP_MESSAGES {
                return Err(malformed(op, "too many messages"));
            }
        }
    }

    /// Walks one datagram; true when the request is complete. Sets
    /// `interrupted` when a message of the reply carries `NLM_F_DUMP_INTR`.
    fn take(
        &self,
        op: &'static str,
        data: &[u8],
        out: &mut Vec<Vec<u8>>,
        interrupted: &mut bool,
    ) -> Result<bool, NlError> {
        let mut off = 0;
        while off < data.len() {
            let buf = NetlinkBuffer::new_checked(&data[off..])
                .map_err(|e| malformed(op, &e.to_string()))?;
            let len = buf.length() as usize;
            let msg = &data[off..off + len];
            off += align4(len);
            if buf.sequence_number() != self.seq {
                // A late reply to an earlier request; not ours.
                continue;
            }
            let body = &msg[NLMSG_HDRLEN..];
            *interrupted |= buf.flags() & NLM_F_DUMP_INTR != 0;
            let code = || {
                body.get(..4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            };
            // A DONE's attributes follow the error at once (netlink_dump_done):
            // only an ERROR's message is read.
            let kernel = |code: i32, message| NlError::Kernel {
                op,
                errno: code.checked_neg().unwrap_or(libc::EINVAL),
                message,
            };
            match buf.message_type() {
                NLMSG_NOOP => {}
                // A dump that failed midway ends with its error in the DONE
                // (netlink_dump_done, net/netlink/af_netlink.c), not an ERROR.
                NLMSG_DONE => match code() {
                    Some(c) if c < 0 => return Err(kernel(c, None)),
                    _ => return Ok(true),
                },
                NLMSG_ERROR => {
                    let code = code().ok_or_else(|| malformed(op, "short NLMSG_ERROR"))?;
                    if code == 0 {
                        return Ok(true);
                    }
                    return Err(kernel(code, super::extack::message(buf.flags(), body)));
                }
                _ => out.push(body.to_vec()),
            }
        }
        Ok(false)
    }
}

fn malformed(op: &'static str, reason: &str) -> NlError {
    NlError::Malformed {
        op,
        reason: reason.to_string(),
    }
}

pub fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// `struct nlmsghdr` + payload; the port id is 0 (the kernel fills it in).
pub fn frame(msg_type: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + payload.len();
    let mut out = Vec::with_capacity(align4(len));
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&msg_type.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(payload);
    out
}

/// One attribute (`struct nlattr`), padded to 4 bytes (NLA_ALIGNTO).
pub fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut out = Vec::with_capacity(align4(len));
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(align4(len), 0);
    out
}

/// Iterates the attributes of a payload as `(kind without flags, value)`.
pub fn attrs(data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    raw_attrs(data).map(|(kind, value)| (kind & netlink_packet_core::NLA_TYPE_MASK, value))
}

/// Iterates the attributes of a payload as `(kind with its flags, value)`.
pub fn raw_attrs(mut data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let kind = u16::from_ne_bytes([data[2], data[3]]);
        if len < 4 || len > data.len() {
            return None;
        }
        let value = &data[4..len];
        data = &data[align4(len).min(data.len())..];
        Some((kind, value))
    })
}

mod socket;
pub use socket::NlSocket;

#[cfg(test)]
pub mod script;
