//! An idle HTTP/1.1 connection without its HTTP buffers (`listener.idle_release_after`).
//!
//! hyper's HTTP/1.1 connection keeps, for its whole life, a read buffer (8 KiB, taken
//! again for each request while the previous head is still referenced), a write buffer
//! (8 KiB of head room), a write queue and its dispatcher's state. A connection with no
//! request in flight and nothing received for `idle_release_after` lets all of that go:
//! [`Parkable`], the IO hyper reads through, reports the end of input once, hyper ends
//! its connection as for a client gone quiet, and the shutdown it then asks for goes
//! nowhere (the TLS session stays up). [`Parking`] keeps only the TLS stream and the
//! service, waits for the socket to become readable (no buffer is lent for that wait),
//! and serves the connection with a new hyper connection when the client's next bytes
//! arrive, or closes it when asked (idle timeout, drain, eviction).
//!
//! Not released: a connection with a request in flight, one with bytes written and not
//! yet flushed, one that received bytes since its last response ended (a request head on
//! its way is hyper's header bound's to judge). If hyper held the start of a request
//! that arrived before the previous response ended (pipelined) and never completed, it
//! ends with an incomplete message: its unread bytes are taken back and handed to the
//! next hyper connection first, so nothing the client sent is lost.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use hyper::body::Incoming;
use hyper::service::HttpService;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::idle::Activity;
use super::*;

type Tls = tokio_rustls::server::TlsStream<TcpStream>;

/// The TLS stream as hyper's HTTP/1.1 connection reads and writes it, ready to report
/// the end of input when the connection has been idle for its release delay.
pub(super) struct Parkable {
    inner: Tls,
    /// Bytes the previous hyper connection had read and not used: read first.
    prefix: Bytes,
    activity: Arc<Activity>,
    /// The release delay (`Duration::ZERO`: never).
    after: Duration,
    /// Wakes the connection when the delay may have passed; made at the first idle
    /// wait, then moved.
    timer: Option<Pin<Box<Sleep>>>,
    /// [`Activity::last_end_nanos`] when bytes were last handed to hyper.
    read_at_end: Option<u64>,
    /// Asked to write since the last completed flush.
    dirty: bool,
    /// The end of input was reported: writes and the shutdown go nowhere.
    released: bool,
}

impl Parkable {
    /// `tls` for `activity`'s connection, released after `after` idle (`ZERO`: never;
    /// at most half of `header_read`, see the module documentation).
    pub(super) fn new(
        tls: Tls,
        activity: Arc<Activity>,
        after: Duration,
        header_read: Duration,
    ) -> Parkable {
        Parkable {
            inner: tls,
            prefix: Bytes::new(),
            activity,
            after: after.min(header_read / 2),
            timer: None,
            read_at_end: None,
            dirty: false,
            released: false,
        }
    }

    /// Whether to report the end of input now: idle for the delay, nothing received
    /// since the last response ended, everything written flushed. Registers the timer
    /// otherwise (while idle).
    fn due(&mut self, cx: &mut Context<'_>) -> bool {
        if self.after.is_zero() || self.dirty {
            return false;
        }
        let Some(since) = self.activity.idle_since() else {
            return false;
        };
        let ended = self.activity.last_end_nanos();
        if self.read_at_end.is_some_and(|at| ended <= at) {
            return false;
        }
        let at = since + self.after;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        // Moved only when it fires (not at each request): a deadline passed that is
        // earlier than the connection's is moved to it, and waited for again.
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            if timer.deadline() >= at {
                return true;
            }
            timer.as_mut().reset(at);
        }
    }

    /// Made ready to serve again after a release, with `unread` to be read first.
    fn rearm(&mut self, unread: Bytes) {
        self.prefix = unread_only(unread);
        self.released = false;
        self.dirty = false;
        self.read_at_end = None;
    }

    /// Ready once the socket has bytes (or an end, or an error) to read.
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.prefix.is_empty() {
            return Poll::Ready(());
        }
        self.inner.get_ref().0.poll_read_ready(cx).map(|_| ())
    }
}

/// What hyper had read and not used, without the buffer it was read into: hyper hands
/// back its whole read buffer, frozen (an empty `Bytes` that still owns the 8 KiB
/// allocation); what it holds (rarely anything) is copied out, so the buffer goes.
fn unread_only(unread: Bytes) -> Bytes {
    if unread.is_empty() {
        Bytes::new()
    } else {
        Bytes::copy_from_slice(&unread)
    }
}

impl AsyncRead for Parkable {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.released {
            return Poll::Ready(Ok(()));
        }
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            this.read_at_end = Some(this.activity.last_end_nanos());
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.read_at_end = Some(this.activity.last_end_nanos());
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.due(cx) => {
                this.released = true;
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Parkable {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.released {
            return Poll::Ready(Ok(buf.len()));
        }
        this.dirty = true;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.released {
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        this.dirty = true;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.released {
            return Poll::Ready(Ok(()));
        }
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        this.dirty = false;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.released {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// Counts a released connection until dropped.
struct Released(Gauge);

impl Released {
    fn new(g: &Gauge) -> Released {
        g.inc();
        Released(g.clone())
    }
}

impl Drop for Released {
    fn drop(&mut self) {
        self.0.dec();
    }
}

enum State<S: HttpService<Incoming>> {
    /// hyper's connection, boxed: inline it made the connection's task (which stays
    /// allocated while released) about 2 KiB larger; the box goes with it at a release.
    Serving(Box<http1::Connection<TokioIo<Parkable>, S>>),
    /// Released: the TLS stream and the service, counted until it leaves this state.
    Parked {
        io: Parkable,
        service: S,
        _counted: Released,
    },
    /// Asked to finish while released: the TLS session is closed (`close_notify`).
    Closing(Parkable),
    Done,
}

/// An HTTP/1.1 connection served by hyper while it is busy, and by nothing but its TLS
/// stream while it is idle (see the module documentation).
pub(super) struct Parking<S: HttpService<Incoming>> {
    builder: http1::Builder,
    state: State<S>,
    released: Gauge,
    closing: bool,
}

impl<S> Parking<S>
where
    S: HttpService<Incoming> + Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Serves `io` with `service` on connections made by `builder`; `released` counts the
    /// connections released at a time.
    pub(super) fn new(builder: http1::Builder, io: Parkable, service: S, released: Gauge) -> Self {
        let conn = Box::new(builder.serve_connection(TokioIo::new(io), service));
        Parking {
            builder,
            state: State::Serving(conn),
            released,
            closing: false,
        }
    }

    /// hyper's connection ended with `ended`: released (then parked, or closing if asked
    /// meanwhile), or done.
    fn ended(&mut self, ended: Result<(), hyper::Error>) -> Option<Result<(), hyper::Error>> {
        let State::Serving(conn) = std::mem::replace(&mut self.state, State::Done) else {
            return Some(ended);
        };
        let parts = (*conn).into_parts();
        let mut io = parts.io.into_inner();
        if !io.released {
            return Some(ended);
        }
        match ended {
            Ok(()) => {}
            // The start of a request it had read: handed to the next connection.
            Err(e) if e.is_incomplete_message() => {}
            Err(e) => return Some(Err(e)),
        }
        io.rearm(parts.read_buf);
        self.state = if self.closing {
            State::Closing(io)
        } else {
            State::Parked {
                io,
                service: parts.service,
                _counted: Released::new(&self.released),
            }
        };
        None
    }
}

impl<S> Future for Parking<S>
where
    S: HttpService<Incoming> + Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = Result<(), hyper::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Serving(conn) => {
                    let ended = ready!(Pin::new(&mut **conn).poll(cx));
                    if let Some(done) = this.ended(ended) {
                        return Poll::Ready(done);
                    }
                }
                State::Parked { io, .. } => {
                    ready!(io.poll_readable(cx));
                    let State::Parked { io, service, .. } =
                        std::mem::replace(&mut this.state, State::Done)
                    else {
                        unreachable!("matched above");
                    };
                    let conn = this.builder.serve_connection(TokioIo::new(io), service);
                    this.state = State::Serving(Box::new(conn));
                }
                State::Closing(io) => {
                    // A client that does not read its close_notify ends it too.
                    let _ = ready!(Pin::new(io).poll_shutdown(cx));
                    this.state = State::Done;
                    return Poll::Ready(Ok(()));
                }
                State::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl<S> connection::Closable for Parking<S>
where
    S: HttpService<Incoming> + Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Failure = hyper::Error;

    fn close_gracefully(self: Pin<&mut Self>) {
        let this = self.get_mut();
        this.closing = true;
        match std::mem::replace(&mut this.state, State::Done) {
            State::Serving(mut conn) => {
                Pin::new(&mut *conn).graceful_shutdown();
                this.state = State::Serving(conn);
            }
            State::Parked { io, .. } | State::Closing(io) => this.state = State::Closing(io),
            State::Done => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The capacity a `Bytes` keeps allocated (0 for a shared or static one).
    fn kept(b: Bytes) -> usize {
        b.try_into_mut().map_or(0, |m| m.capacity())
    }

    #[test]
    fn a_released_connection_keeps_no_read_buffer() {
        // As hyper hands it back: its read buffer, emptied and frozen.
        let mut buf = bytes::BytesMut::with_capacity(8192);
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let _ = buf.split();
        let frozen = buf.freeze();
        assert!(frozen.is_empty());
        assert_eq!(kept(unread_only(frozen)), 0);
        // Unread bytes are kept, in a buffer of their own size.
        let mut buf = bytes::BytesMut::with_capacity(8192);
        buf.extend_from_slice(b"POST /a");
        let unread = unread_only(buf.freeze());
        assert_eq!(&unread[..], b"POST /a");
        assert!(kept(unread) < 64);
    }
}
