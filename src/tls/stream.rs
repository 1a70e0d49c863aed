//! A Leader's TLS connection on rustls's unbuffered API: the records' bytes live in two
//! buffers the gateway owns, and a connection with nothing in flight lets both go
//! ([`ServerStream::release`]).
//!
//! Why not `tokio-rustls`: rustls's buffered connection keeps a 4 KiB record buffer from
//! its first read to its close and offers no call that frees it, and it allocates every
//! outgoing record. Here an idle connection holds no record buffer, and records are
//! encrypted straight into the write buffer. What rustls does is unchanged: the handshake,
//! the records' protection, alerts, tickets and key updates are its own; this module only
//! moves bytes between the socket and rustls, in order, and bounds them.
//!
//! Bounds: the read buffer grows to one whole record (at most [`MAX_INCOMING`] while a
//! handshake message spans records); the write buffer holds at most [`WRITE_AHEAD`] of
//! records not yet taken by the socket before a write waits.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, InsufficientSizeError};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The least room a read from the socket is given.
const READ_CHUNK: usize = 4 * 1024;
/// The read buffer's bound: a handshake message of at most 64 KiB (rustls's own bound),
/// with its records' headers.
const MAX_INCOMING: usize = 0xffff + 5 * 8 + READ_CHUNK;
/// A read buffer larger than this (a handshake's, a large record's) is let go once empty.
const INCOMING_KEPT: usize = 16 * 1024 + 256 + READ_CHUNK;
/// Encrypted bytes the socket has not taken yet, beyond which a write waits for it.
const WRITE_AHEAD: usize = 64 * 1024;
/// Plaintext taken by one write: four records.
const WRITE_CHUNK: usize = 64 * 1024;

/// A byte buffer with its used span `[start, end)`; its bytes are initialised up to its
/// length, so rustls is given slices of it without zeroing them again.
#[derive(Default)]
struct Span {
    data: Vec<u8>,
    start: usize,
    end: usize,
}

impl Span {
    fn len(&self) -> usize {
        self.end - self.start
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The used span.
    fn bytes(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }

    /// The used span, for rustls to decrypt in place.
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.data[self.start..self.end]
    }

    /// Drops the first `n` bytes of the used span.
    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// At least `n` bytes of room after the used span (moving it to the front first).
    fn room(&mut self, n: usize) -> &mut [u8] {
        if self.start > 0 && self.data.len() - self.end < n {
            self.data.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.data.len() - self.end < n {
            self.data.resize(self.end + n, 0);
        }
        &mut self.data[self.end..]
    }

    /// Lets the memory go if nothing is in it.
    fn release(&mut self) {
        if self.is_empty() {
            *self = Span::default();
        }
    }
}

/// What one turn of rustls's state machine left to do.
enum Turn {
    /// Something moved (records encoded, plaintext taken, the peer's close seen): turn
    /// again.
    Again,
    /// rustls needs more bytes from the peer.
    NeedBytes,
    /// Application data may be written (`handshaking`: the peer's last handshake flight
    /// has not arrived yet).
    Writable { handshaking: bool },
    /// The plaintext (or the close_notify) asked for is encrypted into `outgoing`.
    Wrote,
    /// Both sides have closed.
    Closed,
}

/// A server-side TLS connection over TCP (see the module's comment).
pub(crate) struct ServerStream {
    tcp: TcpStream,
    conn: UnbufferedServerConnection,
    /// Bytes from the socket rustls has not taken yet. rustls decrypts records in place
    /// here.
    incoming: Span,
    /// Records for the socket, in order.
    outgoing: Span,
    /// Plaintext rustls gave that the reader has not taken yet (a record larger than the
    /// reader's room, or records that came while writing).
    plain: Span,
    /// Several slices written at once are gathered here into one record.
    gather: Vec<u8>,
    /// The peer sent close_notify: reads end after `plain`.
    peer_closed: bool,
    /// The socket ended: with no close_notify before it, reads fail.
    eof: bool,
    /// close_notify was queued.
    close_sent: bool,
    /// rustls has nothing to give or ask until more bytes come from the socket (its last
    /// turn said so, and nothing was read or written since): a read goes to the socket
    /// without turning it again.
    settled: bool,
    /// The TLS error the connection failed with: every later read or write fails with it
    /// (rustls would read the failing record again, and queue another alert).
    broken: Option<rustls::Error>,
    /// The SNI the Leader sent (lowercased, as rustls keeps it).
    server_name: Option<String>,
}

impl ServerStream {
    /// A connection under `config` whose handshake has yet to run (`tls::accept`).
    pub(crate) fn new(tcp: TcpStream, config: Arc<rustls::ServerConfig>) -> io::Result<Self> {
        let conn = UnbufferedServerConnection::new(config)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(ServerStream {
            tcp,
            conn,
            incoming: Span::default(),
            outgoing: Span::default(),
            plain: Span::default(),
            gather: Vec::new(),
            peer_closed: false,
            eof: false,
            close_sent: false,
            broken: None,
            settled: false,
            server_name: None,
        })
    }

    /// The negotiated session: the peer's certificates, ALPN, the group and suite.
    pub(crate) fn session(&self) -> &rustls::CommonState {
        &self.conn
    }

    /// The server name the Leader asked for, as rustls reads and lowercases it.
    pub(crate) fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    pub(super) fn set_server_name(&mut self, name: Option<String>) {
        self.server_name = name;
    }

    /// The bytes read so far and not yet taken by rustls.
    pub(super) fn unread(&self) -> &[u8] {
        self.incoming.bytes()
    }

    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Lets go of every buffer that holds nothing (called while the connection is idle;
    /// they are taken again when bytes come).
    pub(crate) fn release(&mut self) {
        self.incoming.release();
        self.outgoing.release();
        self.plain.release();
        self.gather = Vec::new();
    }

    /// One turn of rustls's state machine over the bytes read so far, doing `act` if it
    /// comes to it. Plaintext goes to the reader's buffer as far as it has room, the
    /// rest (and all of it when no reader asks) to `plain`.
    fn turn(&mut self, act: Act<'_, '_>) -> io::Result<Turn> {
        if let Some(e) = &self.broken {
            return Err(io::Error::new(io::ErrorKind::InvalidData, e.clone()));
        }
        let ServerStream {
            conn,
            incoming,
            outgoing,
            plain,
            peer_closed,
            ..
        } = self;
        let status = conn.process_tls_records(incoming.bytes_mut());
        let discard = status.discard;
        let turn = match status.state {
            Err(e) => Err(e),
            Ok(ConnectionState::ReadTraffic(mut records)) => {
                // With a reader: records into its room, the rest of one that does not fit
                // kept (the records after it stay with rustls). Without: all kept, in
                // order.
                let mut dst = match act {
                    Act::Read(dst) => Some(dst),
                    _ => None,
                };
                let mut taken = Ok(Turn::Again);
                loop {
                    if dst
                        .as_deref()
                        .is_some_and(|d| d.remaining() == 0 || !plain.is_empty())
                    {
                        break;
                    }
                    match records.next_record() {
                        None => break,
                        Some(Err(e)) => {
                            taken = Err(e);
                            break;
                        }
                        Some(Ok(record)) => {
                            let bytes = record.payload;
                            let n = dst.as_deref_mut().map_or(0, |d| {
                                let n = bytes.len().min(d.remaining());
                                d.put_slice(&bytes[..n]);
                                n
                            });
                            let rest = &bytes[n..];
                            plain.room(rest.len())[..rest.len()].copy_from_slice(rest);
                            plain.end += rest.len();
                        }
                    }
                }
                taken
            }
            Ok(ConnectionState::EncodeTlsData(mut encode)) => {
                let mut want = 1024;
                loop {
                    match encode.encode(outgoing.room(want)) {
                        Ok(n) => {
                            outgoing.end += n;
                            break;
                        }
                        Err(EncodeError::InsufficientSize(InsufficientSizeError {
                            required_size,
                        })) => want = required_size,
                        Err(EncodeError::AlreadyEncoded) => break,
                    }
                }
                Ok(Turn::Again)
            }
            Ok(ConnectionState::TransmitTlsData(transmit)) => {
                // The records are in `outgoing`, which goes to the socket before anything
                // queued after it.
                transmit.done();
                Ok(Turn::Again)
            }
            Ok(ConnectionState::BlockedHandshake) => Ok(Turn::NeedBytes),
            Ok(ConnectionState::WriteTraffic(mut w)) => match act {
                Act::Write(data) => encrypt(&mut w, data, outgoing).map(|()| Turn::Wrote),
                Act::CloseNotify => {
                    if let Ok(n) = w.queue_close_notify(outgoing.room(64)) {
                        outgoing.end += n;
                    }
                    Ok(Turn::Wrote)
                }
                _ => Ok(Turn::Writable {
                    handshaking: conn.is_handshaking(),
                }),
            },
            Ok(ConnectionState::PeerClosed) => {
                *peer_closed = true;
                Ok(Turn::Again)
            }
            Ok(ConnectionState::Closed) => {
                *peer_closed = true;
                Ok(Turn::Closed)
            }
            Ok(_) => Err(rustls::Error::General(
                "unexpected TLS state (early data is not accepted)".into(),
            )),
        };
        incoming.consume(discard);
        if incoming.is_empty() && incoming.data.len() > INCOMING_KEPT {
            *incoming = Span::default();
        }
        self.settled = matches!(turn, Ok(Turn::NeedBytes | Turn::Writable { .. }));
        turn.map_err(|e| self.failed(e))
    }

    /// A TLS error: the alert rustls queued for it is put after the records before it
    /// (sent by [`poll_send`](Self::poll_send) as far as the socket takes it now), and
    /// the error is returned as `InvalidData`, as `tokio-rustls` returns it.
    ///
    /// rustls gives the queued alert at the next turn before it looks at the bytes again;
    /// a second turn would read the failing record again (and queue another alert), so
    /// there is exactly one, and none after it (`broken`).
    fn failed(&mut self, e: rustls::Error) -> io::Error {
        self.broken = Some(e.clone());
        let status = self.conn.process_tls_records(self.incoming.bytes_mut());
        if let Ok(ConnectionState::EncodeTlsData(mut encode)) = status.state {
            // Alerts are small; one that does not fit is not sent.
            if let Ok(n) = encode.encode(self.outgoing.room(1024)) {
                self.outgoing.end += n;
            }
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let _ = self.poll_send(&mut cx);
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    /// Reads from the socket into `incoming`: `Ok(0)` at its end.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        // One whole record's room when its header says how long it is.
        let unread = self.unread();
        let record = match unread {
            [_, _, _, hi, lo, ..] => 5 + usize::from(u16::from_be_bytes([*hi, *lo])),
            _ => 0,
        };
        let want = record.saturating_sub(unread.len()).max(READ_CHUNK);
        if self.incoming.len() + want > MAX_INCOMING {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS message over the read buffer's bound",
            )));
        }
        let room = self.incoming.room(want);
        let mut buf = ReadBuf::new(room);
        ready!(Pin::new(&mut self.tcp).poll_read(cx, &mut buf))?;
        let n = buf.filled().len();
        self.incoming.end += n;
        self.settled &= n == 0;
        if n == 0 {
            self.eof = true;
        }
        Poll::Ready(Ok(n))
    }

    /// Writes `outgoing` to the socket until it is empty.
    pub(super) fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.outgoing.is_empty() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, self.outgoing.bytes()))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.outgoing.consume(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Turns rustls until the handshake is complete and its records are sent.
    pub(super) fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.turn(Act::Handshake)? {
                Turn::Again | Turn::Wrote => {}
                Turn::Writable { handshaking: false } => return self.poll_send(cx),
                Turn::NeedBytes | Turn::Writable { handshaking: true } => {
                    ready!(self.poll_send(cx))?;
                    if ready!(self.poll_fill(cx))? == 0 {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "tls handshake eof",
                        )));
                    }
                }
                Turn::Closed => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "closed during the TLS handshake",
                    )))
                }
            }
        }
    }

    /// Turns rustls until it has taken `data` to encrypt (`None`: the close_notify);
    /// records it gave meanwhile are kept for the reader.
    fn seal(&mut self, data: Option<&[u8]>) -> io::Result<()> {
        loop {
            match self.turn(data.map_or(Act::CloseNotify, Act::Write))? {
                Turn::Wrote => return Ok(()),
                Turn::Again => {}
                Turn::NeedBytes | Turn::Writable { .. } => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "TLS: written to before the handshake",
                    ))
                }
                Turn::Closed => return Err(io::ErrorKind::BrokenPipe.into()),
            }
        }
    }
}

/// What a turn of rustls's state machine is for.
enum Act<'a, 'b> {
    /// The handshake: nothing but what rustls asks.
    Handshake,
    /// Plaintext for the reader.
    Read(&'a mut ReadBuf<'b>),
    /// Plaintext to encrypt.
    Write(&'a [u8]),
    /// The close_notify alert to queue.
    CloseNotify,
}

/// Encrypts `data` (as many records as it takes) into `outgoing`.
fn encrypt(
    w: &mut rustls::unbuffered::WriteTraffic<'_, rustls::server::ServerConnectionData>,
    data: &[u8],
    outgoing: &mut Span,
) -> Result<(), rustls::Error> {
    // Each record adds its header, type byte and tag (22 bytes with TLS 1.3's AEADs).
    let mut want = data.len() + (data.len() / (16 * 1024) + 1) * 64;
    loop {
        match w.encrypt(data, outgoing.room(want)) {
            Ok(n) => {
                outgoing.end += n;
                return Ok(());
            }
            Err(EncryptError::InsufficientSize(InsufficientSizeError { required_size })) => {
                want = required_size
            }
            Err(e) => return Err(rustls::Error::General(e.to_string())),
        }
    }
}

impl AsyncRead for ServerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        loop {
            if !this.plain.is_empty() {
                let plain = this.plain.bytes();
                let n = plain.len().min(buf.remaining());
                buf.put_slice(&plain[..n]);
                this.plain.consume(n);
                return Poll::Ready(Ok(()));
            }
            if this.peer_closed {
                return Poll::Ready(Ok(()));
            }
            let turn = match this.settled {
                true => Ok(Turn::NeedBytes),
                false => this.turn(Act::Read(buf)),
            };
            if buf.filled().len() > before && !matches!(turn, Ok(Turn::Again)) {
                // Plaintext given: an error waits for the next read.
                return Poll::Ready(Ok(()));
            }
            match turn? {
                Turn::Again | Turn::Wrote if buf.remaining() == 0 => return Poll::Ready(Ok(())),
                // Plaintext given and every byte read taken: no record can follow without
                // another read from the socket (and rustls's queue is empty, or the
                // reader's room would be).
                Turn::Again if buf.filled().len() > before && this.incoming.is_empty() => {
                    return Poll::Ready(Ok(()))
                }
                Turn::Again | Turn::Wrote => {}
                Turn::Closed => return Poll::Ready(Ok(())),
                Turn::NeedBytes | Turn::Writable { .. } => {
                    if buf.filled().len() > before {
                        return Poll::Ready(Ok(()));
                    }
                    if this.eof {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "peer closed connection without sending TLS close_notify",
                        )));
                    }
                    // Records rustls queued meanwhile (a key update's answer) go out.
                    if let Poll::Ready(Err(e)) = this.poll_send(cx) {
                        return Poll::Ready(Err(e));
                    }
                    ready!(this.poll_fill(cx))?;
                }
            }
        }
    }
}

impl AsyncWrite for ServerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.outgoing.len() >= WRITE_AHEAD {
            ready!(this.poll_send(cx))?;
        }
        let data = &data[..data.len().min(WRITE_CHUNK)];
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        this.seal(Some(data))?;
        // As far as the socket takes them now; the rest at the next write or flush.
        if let Poll::Ready(Err(e)) = this.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(first) = bufs.iter().position(|b| !b.is_empty()) else {
            return Poll::Ready(Ok(0));
        };
        if bufs.len() - first == 1 || bufs[first].len() >= WRITE_CHUNK / 4 {
            return Pin::new(this).poll_write(cx, &bufs[first]);
        }
        // Small slices (HTTP/2's frame heads and their payloads) in one record.
        let mut gather = std::mem::take(&mut this.gather);
        gather.clear();
        for b in &bufs[first..] {
            if !gather.is_empty() && gather.len() + b.len() > WRITE_CHUNK / 4 {
                break;
            }
            gather.extend_from_slice(b);
        }
        let polled = Pin::new(&mut *this).poll_write(cx, &gather);
        this.gather = gather;
        polled
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent {
            this.close_sent = true;
            this.seal(None)?;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

#[cfg(all(test, feature = "dev"))]
#[path = "stream_tests.rs"]
mod tests;
