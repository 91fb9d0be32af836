//! The NRI socket multiplexer on tokio (`pkg/net/multiplex` in
//! containerd/nri), for the fake runtime of tests and benchmarks; the frame
//! layout is in [`crate::frame`]. Each `poll_write` sends at most one frame.

use std::{
    collections::HashMap,
    io,
    pin::Pin,
    task::{ready, Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter, ReadBuf},
    sync::mpsc,
    task::JoinHandle,
};
use tokio_util::sync::PollSender;

use crate::frame::{decode_mux_header as decode_header, MUX_HEADER_LEN as HEADER_LEN};
pub use crate::frame::{
    ConnId, MAX_FRAME_PAYLOAD, MAX_PEER_PAYLOAD, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN,
};

/// Frames queued per connection before the reader waits (the Go mux uses 256).
const READ_QUEUE: usize = 256;
/// Frames queued for the socket writer before writers wait.
const WRITE_QUEUE: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    #[error("connection id {conn} is reserved")]
    ReservedConn { conn: ConnId },
    #[error("connection id {conn} is already open")]
    AlreadyOpen { conn: ConnId },
}

/// A multiplexer that has not started moving bytes yet: open the
/// connections first, then [`Mux::start`], so that no early frame is
/// dropped for want of a receiver.
pub struct Mux<S> {
    stream: S,
    readers: HashMap<ConnId, mpsc::Sender<Vec<u8>>>,
    frames_tx: mpsc::Sender<Vec<u8>>,
    frames_rx: mpsc::Receiver<Vec<u8>>,
}

impl<S> Mux<S>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    pub fn new(stream: S) -> Mux<S> {
        let (frames_tx, frames_rx) = mpsc::channel(WRITE_QUEUE);
        Mux {
            stream,
            readers: HashMap::new(),
            frames_tx,
            frames_rx,
        }
    }

    /// Opens connection `conn`; each id can be opened once.
    pub fn open(&mut self, conn: ConnId) -> Result<MuxConn, MuxError> {
        if conn == 0 {
            return Err(MuxError::ReservedConn { conn });
        }
        if self.readers.contains_key(&conn) {
            return Err(MuxError::AlreadyOpen { conn });
        }
        let (tx, rx) = mpsc::channel(READ_QUEUE);
        self.readers.insert(conn, tx);
        Ok(MuxConn {
            id: conn,
            rx,
            pending: Vec::new(),
            consumed: 0,
            tx: PollSender::new(self.frames_tx.clone()),
        })
    }

    /// Starts the task that moves frames between the stream and the
    /// connections. The stream is closed when the handle is dropped, when
    /// the peer closes it, or when every [`MuxConn`] is gone.
    pub fn start(self) -> MuxHandle {
        let Mux {
            stream,
            readers,
            frames_tx,
            frames_rx,
        } = self;
        // Only the MuxConns keep the writer alive from here on.
        drop(frames_tx);
        let (rd, wr) = tokio::io::split(stream);
        let task = tokio::spawn(async move {
            tokio::select! {
                r = read_frames(BufReader::new(rd), readers) => r,
                w = write_frames(BufWriter::new(wr), frames_rx) => w,
            }
        });
        MuxHandle { task }
    }
}

/// Owns the running multiplexer; dropping it closes the stream.
pub struct MuxHandle {
    task: JoinHandle<io::Result<()>>,
}

impl MuxHandle {
    /// Waits until the stream is closed: `Ok` when the peer closed it or
    /// every connection was dropped, `Err` on an I/O or framing error.
    pub async fn closed(mut self) -> io::Result<()> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(join) => Err(io::Error::other(join)),
        }
    }
}

impl Drop for MuxHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_frames<R: AsyncRead + Unpin>(
    mut rd: R,
    mut readers: HashMap<ConnId, mpsc::Sender<Vec<u8>>>,
) -> io::Result<()> {
    let mut header = [0u8; HEADER_LEN];
    loop {
        // The peer closed the stream between frames; dropping `readers`
        // ends every conn. A close within a header is an error, as within a
        // payload.
        if rd.read(&mut header[..1]).await? == 0 {
            return Ok(());
        }
        rd.read_exact(&mut header[1..]).await?;
        let (conn, len) = decode_header(header);
        if len > MAX_PEER_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("mux frame for conn {conn} has {len} bytes, limit {MAX_PEER_PAYLOAD}"),
            ));
        }
        let mut payload = vec![0u8; len];
        rd.read_exact(&mut payload).await?;
        if payload.is_empty() {
            continue;
        }
        let Some(tx) = readers.get(&conn) else {
            tracing::trace!(conn, len, "dropping mux frame for unknown connection");
            continue;
        };
        if tx.send(payload).await.is_err() {
            // Its MuxConn was dropped: later frames for it are unknown too.
            readers.remove(&conn);
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut frames: mpsc::Receiver<Vec<u8>>,
) -> io::Result<()> {
    while let Some(frame) = frames.recv().await {
        wr.write_all(&frame).await?;
        // Batch what is already queued into one flush; frames stay whole.
        while let Ok(frame) = frames.try_recv() {
            wr.write_all(&frame).await?;
        }
        wr.flush().await?;
    }
    Ok(())
}

/// Builds one frame: header plus at most [`MAX_FRAME_PAYLOAD`] bytes of
/// `data`. Returns the frame and how many bytes of `data` it carries.
fn encode_frame(conn: ConnId, data: &[u8]) -> (Vec<u8>, usize) {
    let n = data.len().min(MAX_FRAME_PAYLOAD);
    let mut frame = Vec::with_capacity(HEADER_LEN + n);
    crate::frame::append_mux_frames(&mut frame, conn, &data[..n]);
    (frame, n)
}

/// One multiplexed connection: a byte stream usable with
/// `ttrpc::r#async::transport::Socket::new`.
pub struct MuxConn {
    id: ConnId,
    rx: mpsc::Receiver<Vec<u8>>,
    pending: Vec<u8>,
    consumed: usize,
    tx: PollSender<Vec<u8>>,
}

impl MuxConn {
    pub fn id(&self) -> ConnId {
        self.id
    }
}

fn closed_pipe() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "mux stream is closed")
}

impl AsyncRead for MuxConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.consumed == this.pending.len() {
            match ready!(this.rx.poll_recv(cx)) {
                Some(payload) => {
                    this.pending = payload;
                    this.consumed = 0;
                }
                // Stream closed: end of file.
                None => return Poll::Ready(Ok(())),
            }
        }
        let available = &this.pending[this.consumed..];
        let n = available.len().min(buf.remaining());
        buf.put_slice(&available[..n]);
        this.consumed += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for MuxConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = self.get_mut();
        ready!(this.tx.poll_reserve(cx)).map_err(|_| closed_pipe())?;
        let (frame, n) = encode_frame(this.id, data);
        this.tx.send_item(frame).map_err(|_| closed_pipe())?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The writer task flushes whenever its queue runs empty.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The protocol has no per-connection close; stop sending only.
        self.get_mut().tx.close();
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
#[path = "mux_tests.rs"]
mod tests;
