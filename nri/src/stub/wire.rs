//! Blocking transport of the plugin side: ttrpc messages on the two mux
//! connections of one unix stream ([`crate::frame`]), read and written on
//! the calling thread.
//!
//! A plugin answers one request at a time (the runtime waits for each
//! reply), so one thread with one blocking read per burst of frames and one
//! write per reply is all the transport needs: no reactor, no task hand-offs.

use std::{
    io::{self, Read, Write},
    os::unix::net::UnixStream,
    time::Duration,
};

use crate::frame::{
    append_mux_frames, decode_mux_header, ConnId, TtrpcHeader, MAX_PEER_PAYLOAD, MUX_HEADER_LEN,
    PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, TTRPC_HEADER_LEN, TTRPC_MAX_PAYLOAD,
};

/// Bytes asked of the socket per read; a CreateContainer request fits.
const READ_CHUNK: usize = 64 << 10;
/// Longest a reply may wait for the runtime to read: one that stopped
/// reading is a connection to dial again, not a thread to hang (and, the
/// reply being written under the request gate, a stop to keep waiting).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest buffer kept from one message to the next. A Synchronize request on
/// a busy node is megabytes; keeping a buffer of that size would keep its
/// pages resident for the plugin's lifetime.
const KEEP_CAPACITY: usize = READ_CHUNK;

/// Empties `buf`, and gives its memory back when it grew past
/// [`KEEP_CAPACITY`].
pub(super) fn reset_buffer(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_CAPACITY {
        *buf = Vec::new();
    } else {
        buf.clear();
    }
}

/// One whole ttrpc message from the runtime.
#[derive(Debug)]
pub(super) struct Message {
    pub conn: ConnId,
    pub header: TtrpcHeader,
    pub payload: Vec<u8>,
}

/// The plugin's end of the stream.
pub(super) struct Wire {
    stream: UnixStream,
    /// Bytes read from the socket; `rpos..rlen` is not yet split into frames.
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
    /// The byte stream of connections 1 and 2, reassembled from frames.
    conns: [ConnStream; 2],
    /// Reused for every reply: the ttrpc message, then its frames.
    message: Vec<u8>,
    wbuf: Vec<u8>,
    /// A received message's payload buffer, given back by [`Wire::recycle`]
    /// to hold the next one instead of a fresh allocation.
    spare: Vec<u8>,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Wire {
    pub(super) fn new(stream: UnixStream) -> Wire {
        if let Err(e) = stream.set_write_timeout(Some(WRITE_TIMEOUT)) {
            tracing::warn!(error = %crate::ErrorChain(&e), "no write timeout on the runtime's socket");
        }
        Wire {
            stream,
            rbuf: vec![0; READ_CHUNK],
            rpos: 0,
            rlen: 0,
            conns: [ConnStream::default(), ConnStream::default()],
            message: Vec::new(),
            wbuf: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Takes back the payload of a message that has been handled.
    pub(super) fn recycle(&mut self, mut payload: Vec<u8>) {
        reset_buffer(&mut payload);
        self.spare = payload;
    }

    /// Bounds each blocking read (`None`: wait forever).
    pub(super) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }

    #[cfg(test)]
    pub(super) fn set_write_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.stream.set_write_timeout(Some(timeout))
    }

    /// The next whole message on connection 1 or 2; `None` once the runtime
    /// closed the stream. Frames for other connections are dropped, as the
    /// Go mux drops them.
    pub(super) fn read(&mut self) -> io::Result<Option<Message>> {
        loop {
            for (i, conn) in [PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]
                .into_iter()
                .enumerate()
            {
                if let Some(msg) = self.conns[i].take_message(conn, &mut self.spare)? {
                    return Ok(Some(msg));
                }
            }
            if !self.split_frame()? && !self.fill()? {
                // Closed with part of a frame or message read: not a close
                // between messages, which the caller takes as the runtime's
                // goodbye.
                if self.rpos < self.rlen || self.conns.iter().any(|c| c.pos < c.buf.len()) {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "runtime closed the stream in the middle of a message",
                    ));
                }
                return Ok(None);
            }
        }
    }

    /// Moves one whole frame from the read buffer to its connection's
    /// stream; `false` if the buffer holds no whole frame.
    fn split_frame(&mut self) -> io::Result<bool> {
        let pending = &self.rbuf[self.rpos..self.rlen];
        let Some(header) = pending.first_chunk::<MUX_HEADER_LEN>() else {
            return Ok(false);
        };
        let (conn, len) = decode_mux_header(*header);
        if len > MAX_PEER_PAYLOAD {
            return Err(invalid(format!(
                "mux frame for conn {conn} has {len} bytes, limit {MAX_PEER_PAYLOAD}"
            )));
        }
        let Some(payload) = pending.get(MUX_HEADER_LEN..MUX_HEADER_LEN + len) else {
            // Make room for the rest of a frame larger than the buffer.
            let need = MUX_HEADER_LEN + len;
            if self.rbuf.len() < need {
                self.rbuf.resize(need, 0);
            }
            return Ok(false);
        };
        match conn {
            PLUGIN_SERVICE_CONN => self.conns[0].append(payload),
            RUNTIME_SERVICE_CONN => self.conns[1].append(payload),
            _ => tracing::trace!(conn, len, "dropping mux frame for unknown connection"),
        }
        self.rpos += MUX_HEADER_LEN + len;
        Ok(true)
    }

    /// Reads more bytes from the socket; `false` at end of stream.
    fn fill(&mut self) -> io::Result<bool> {
        if self.rpos == self.rlen {
            (self.rpos, self.rlen) = (0, 0);
            if self.rbuf.len() > READ_CHUNK {
                // Grown for one large frame, which is gone now.
                self.rbuf = vec![0; READ_CHUNK];
            }
        } else if self.rpos > 0 {
            self.rbuf.copy_within(self.rpos..self.rlen, 0);
            (self.rpos, self.rlen) = (0, self.rlen - self.rpos);
        }
        if self.rlen == self.rbuf.len() {
            self.rbuf.resize(self.rlen + READ_CHUNK, 0);
        }
        loop {
            match self.stream.read(&mut self.rbuf[self.rlen..]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.rlen += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one ttrpc message on `conn` in a single write.
    pub(super) fn write(
        &mut self,
        conn: ConnId,
        header: TtrpcHeader,
        payload: &[u8],
    ) -> io::Result<()> {
        if payload.len() > TTRPC_MAX_PAYLOAD {
            return Err(invalid(format!(
                "ttrpc message of {} bytes, limit {TTRPC_MAX_PAYLOAD}",
                payload.len()
            )));
        }
        let header = TtrpcHeader {
            length: payload.len(),
            ..header
        };
        // The ttrpc header and the first bytes of the payload share a frame,
        // as the Go runtime expects a message's start within one frame.
        self.message.clear();
        self.message.extend_from_slice(&header.encode());
        self.message.extend_from_slice(payload);
        self.wbuf.clear();
        append_mux_frames(&mut self.wbuf, conn, &self.message);
        let sent = self.stream.write_all(&self.wbuf);
        reset_buffer(&mut self.message);
        reset_buffer(&mut self.wbuf);
        sent
    }
}

/// One connection's bytes: `buf[pos..]` is not yet taken as messages.
/// Messages are taken by moving `pos`, so a frame holding many small
/// messages costs one pass, not a shift of the rest after each.
#[derive(Default)]
struct ConnStream {
    buf: Vec<u8>,
    pos: usize,
}

impl ConnStream {
    /// Adds a frame's bytes, first dropping the ones already taken.
    fn append(&mut self, data: &[u8]) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Splits the first whole ttrpc message off the stream, into `spare`'s
    /// buffer when there is one.
    fn take_message(&mut self, conn: ConnId, spare: &mut Vec<u8>) -> io::Result<Option<Message>> {
        let pending = &self.buf[self.pos..];
        let Some(raw) = pending.first_chunk::<TTRPC_HEADER_LEN>() else {
            return Ok(None);
        };
        let header = TtrpcHeader::decode(raw);
        if header.length > TTRPC_MAX_PAYLOAD {
            return Err(invalid(format!(
                "ttrpc message of {} bytes on conn {conn}, limit {TTRPC_MAX_PAYLOAD}",
                header.length
            )));
        }
        let end = TTRPC_HEADER_LEN + header.length;
        let Some(body) = pending.get(TTRPC_HEADER_LEN..end) else {
            return Ok(None);
        };
        let mut payload = std::mem::take(spare);
        payload.extend_from_slice(body);
        self.pos += end;
        if self.pos == self.buf.len() {
            reset_buffer(&mut self.buf);
            self.pos = 0;
        }
        Ok(Some(Message {
            conn,
            header,
            payload,
        }))
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
