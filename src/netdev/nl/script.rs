//! A transport that records what is sent and answers from a script.
use std::collections::VecDeque;
use std::io;

use super::{frame, Transport, NLMSG_HDRLEN};
use netlink_packet_core::{NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP_INTR};

/// What to answer to the next request.
pub enum Reply {
    /// These payloads as messages of `msg_type`, then an ack (errno 0).
    Ack {
        msg_type: u16,
        payloads: Vec<Vec<u8>>,
    },
    /// These payloads, then `NLMSG_DONE`.
    Dump {
        msg_type: u16,
        payloads: Vec<Vec<u8>>,
    },
    /// An `NLMSG_ERROR` with `-errno`.
    Errno(i32),
    /// A dump that failed midway: one payload, then `NLMSG_DONE` with `-errno`.
    DumpFailed { msg_type: u16, errno: i32 },
    /// These payloads flagged `NLM_F_DUMP_INTR`, then `NLMSG_DONE`.
    DumpInterrupted {
        msg_type: u16,
        payloads: Vec<Vec<u8>>,
    },
}

#[derive(Default)]
pub struct Script {
    pub sent: Vec<Vec<u8>>,
    pub replies: VecDeque<Reply>,
    pending: VecDeque<Vec<u8>>,
    /// `ETHTOOL_GDRVINFO` answers by link name's bytes: (driver, bus_info).
    pub drv: Vec<(&'static [u8], &'static str, &'static str)>,
    /// The names `drvinfo` was asked for, read lossily.
    pub asked: Vec<String>,
    /// Link notices the kernel queues while `drvinfo` runs, each ioctl
    /// taking the next batch; `None` in a batch: some were lost.
    pub during_drvinfo: VecDeque<Option<Vec<Vec<u8>>>>,
    /// Link notices queued and not yet read.
    pub queued: Vec<Vec<u8>>,
    lost: bool,
    /// Every pending message in one datagram, each padded to 4 bytes, as the
    /// kernel fills one skb with a dump's messages while they fit
    /// (`netlink_dump`, net/netlink/af_netlink.c).
    pub packed: bool,
    /// Messages put before the next request's replies, as a late answer to an
    /// earlier request would be.
    pub stale: Vec<Vec<u8>>,
}

impl Script {
    pub fn new(replies: Vec<Reply>) -> Script {
        Script {
            replies: replies.into(),
            ..Script::default()
        }
    }
}

fn error_msg(seq: u32, errno: i32, request: &[u8]) -> Vec<u8> {
    let mut body = (-errno).to_ne_bytes().to_vec();
    body.extend_from_slice(&request[..NLMSG_HDRLEN.min(request.len())]);
    frame(NLMSG_ERROR, 0, seq, &body)
}

impl Transport for Script {
    fn send(&mut self, datagram: &[u8]) -> io::Result<()> {
        let seq = u32::from_ne_bytes([datagram[8], datagram[9], datagram[10], datagram[11]]);
        self.sent.push(datagram.to_vec());
        self.pending.extend(std::mem::take(&mut self.stale));
        let reply = self.replies.pop_front().unwrap_or(Reply::Errno(0));
        match reply {
            Reply::Ack { msg_type, payloads } => {
                for p in payloads {
                    self.pending.push_back(frame(msg_type, 0, seq, &p));
                }
                self.pending.push_back(error_msg(seq, 0, datagram));
            }
            Reply::Dump { msg_type, payloads } => {
                for p in payloads {
                    self.pending.push_back(frame(msg_type, 2, seq, &p));
                }
                self.pending
                    .push_back(frame(NLMSG_DONE, 2, seq, &0i32.to_ne_bytes()));
            }
            Reply::Errno(e) => self.pending.push_back(error_msg(seq, e, datagram)),
            Reply::DumpFailed { msg_type, errno } => {
                self.pending.push_back(frame(msg_type, 2, seq, &[0; 16]));
                self.pending
                    .push_back(frame(NLMSG_DONE, 2, seq, &(-errno).to_ne_bytes()));
            }
            Reply::DumpInterrupted { msg_type, payloads } => {
                let flags = 2 | NLM_F_DUMP_INTR;
                for p in payloads {
                    self.pending.push_back(frame(msg_type, flags, seq, &p));
                }
                self.pending
                    .push_back(frame(NLMSG_DONE, flags, seq, &0i32.to_ne_bytes()));
            }
        }
        Ok(())
    }

    fn recv(&mut self) -> io::Result<Vec<u8>> {
        if self.packed && !self.pending.is_empty() {
            let mut datagram = Vec::new();
            for mut msg in self.pending.drain(..) {
                msg.resize(super::align4(msg.len()), 0);
                datagram.extend_from_slice(&msg);
            }
            return Ok(datagram);
        }
        self.pending
            .pop_front()
            .ok_or_else(|| io::Error::new(io::ErrorKind::WouldBlock, "script ran dry"))
    }

    fn drvinfo(&mut self, name: &[u8]) -> io::Result<Option<crate::netdev::ethtool::Drv>> {
        self.asked.push(String::from_utf8_lossy(name).into_owned());
        match self.during_drvinfo.pop_front() {
            Some(Some(batch)) => self.queued.extend(batch),
            Some(None) => self.lost = true,
            None => {}
        }
        Ok(self.drv.iter().find(|(n, ..)| *n == name).map(|(_, d, b)| {
            crate::netdev::ethtool::Drv {
                driver: d.to_string(),
                bus_info: b.to_string(),
            }
        }))
    }

    fn link_notices(&mut self) -> io::Result<Option<Vec<Vec<u8>>>> {
        let batch = std::mem::take(&mut self.queued);
        Ok((!std::mem::take(&mut self.lost)).then_some(batch))
    }

    fn watches_links(&self) -> bool {
        true
    }
}
