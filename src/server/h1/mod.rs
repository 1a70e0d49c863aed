//! The gateway's own HTTP/1.1 server side: one client connection, its requests one at a
//! time through the request path, their answers written back.
//!
//! Why not hyper's: its HTTP/1.1 server was the floor of the gateway's cost per request
//! (a channel and a dispatcher per request, a write queue, its own buffers held for the
//! connection's life); this one reads a head into the connection's one read buffer
//! (`head`: strict framing), hands the body out of that buffer without a copy
//! (`crate::leader_body`: one slot per connection), writes the answer's head and, when it
//! is there, its body in one TLS record, and keeps no buffer while idle. hyper still
//! serves HTTP/2.
//!
//! What it promises, each tested (`tests`, `tests/it`):
//! - every head two readers could frame differently is refused with 400 (431 over the
//!   bounds) and the connection closed (`head`);
//! - pipelined requests are answered in order, one at a time (the next head is read
//!   after the answer before it is written);
//! - `Expect: 100-continue` is answered when the request path first reads the body;
//! - `Connection: close` and HTTP/1.0 are honoured; an answer of unknown length to an
//!   HTTP/1.0 client ends with the connection;
//! - a head must arrive within `listener.header_read_timeout` of its first byte (the
//!   idle timeout, not this bound, decides how long a connection may wait for one);
//! - a client that reads nothing of its answer for `listener.write_timeout` loses the
//!   connection (a stalled reader holds neither the answer's state nor a slot forever);
//! - a client that leaves while its request is served ends the request (no half-close,
//!   as hyper by default);
//! - a body the request path did not read closes the connection after the answer,
//!   unless all of it is already in the read buffer (then it is skipped);
//! - idle for `listener.idle_release_after`, the connection lets go of its read and
//!   write buffers, its request state and the TLS stream's record buffers (`Io::release`),
//!   and takes them again when bytes arrive.

mod encode;
pub(crate) mod head;
#[cfg(any(test, feature = "test-util"))]
pub(crate) mod pieces;

#[cfg(test)]
#[path = "tests.rs"]
mod conn_tests;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::Body;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::chunked::{BadChunk, Chunked};
use crate::error::ErrorStatus;
use crate::error::GatewayError;
use crate::jsonrpc::RpcId;
use crate::leader_body::{lock, BodyFailure, RequestBody, Shared, Slot};
use crate::timers::Deadline;
use encode::{HeadLine, Out};
use head::{Framing, Limits, Refused};

/// The read buffer's first size, and the least room a read is given.
const READ_CHUNK: usize = 8 * 1024;
/// A write buffer grown past this by a large answer is let go after it.
const WRITE_KEPT: usize = 16 * 1024;
/// Body bytes buffered before they are written out (the body is not polled past it).
const WRITE_HIGH: usize = 64 * 1024;

/// What the connection reads and writes: a byte stream that can also say when it has
/// bytes to read without being given a buffer (waited on while released).
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<()>;

    /// Idle: lets go of the buffers below the connection's own that hold nothing.
    fn release(&mut self) {}
}

impl Io for Box<crate::tls::stream::ServerStream> {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.tcp().poll_read_ready(cx).map(|_| ())
    }

    fn release(&mut self) {
        crate::tls::stream::ServerStream::release(self);
    }
}

impl Io for tokio::net::TcpStream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        tokio::net::TcpStream::poll_read_ready(self, cx).map(|_| ())
    }
}

#[cfg(test)]
impl Io for tokio::io::DuplexStream {
    fn poll_read_ready(&self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Ready(())
    }
}

/// What serves a connection's requests: hyper's service trait, an answer to every
/// request (the request path's errors are answers already), a body of `Bytes`.
pub(crate) trait Serve:
    hyper::service::Service<
        Request<RequestBody>,
        Response = Response<Self::Body>,
        Error = std::convert::Infallible,
    > + Unpin
{
    type Body: Body<Data = bytes::Bytes, Error: Into<crate::body::BoxError>> + Unpin;
}

impl<S, B> Serve for S
where
    S: hyper::service::Service<
            Request<RequestBody>,
            Response = Response<B>,
            Error = std::convert::Infallible,
        > + Unpin,
    B: Body<Data = bytes::Bytes, Error: Into<crate::body::BoxError>> + Unpin,
{
    type Body = B;
}

/// A connection's bounds, from `[listener]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) header_read: Duration,
    /// `Duration::ZERO`: buffers are never let go.
    pub(crate) release_after: Duration,
    /// How long a write may wait for the client to read (`listener.write_timeout`).
    pub(crate) write_stall: Duration,
    pub(crate) limits: Limits,
}

/// How a connection ended, when not cleanly.
#[derive(Debug)]
pub(crate) enum H1Error {
    /// A head refused (answered with its status, then closed).
    Malformed(Refused),
    /// A head not whole within `listener.header_read_timeout` of its first byte.
    HeadTimeout,
    /// The client left in the middle of a head.
    Incomplete,
    /// The answer's body failed after its head was written: the message is cut short.
    Body(crate::body::BoxError),
    Io(io::Error),
}

impl std::fmt::Display for H1Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            H1Error::Malformed(r) => r.fmt(f),
            H1Error::HeadTimeout => f.write_str("request head not read within the header timeout"),
            H1Error::Incomplete => f.write_str("connection closed in the middle of a request head"),
            H1Error::Body(e) => write!(f, "response body failed: {e}"),
            H1Error::Io(e) => write!(f, "connection error: {e}"),
        }
    }
}

impl H1Error {
    /// The reason and status counted when the client sent malformed HTTP.
    pub(crate) fn malformed(&self) -> Option<(&'static str, u16)> {
        match self {
            H1Error::Malformed(r) => Some((r.reason, r.status)),
            _ => None,
        }
    }
}

/// How much of the request's body is still to be read.
#[derive(Debug)]
pub(crate) enum Left {
    Done,
    Length(u64),
    Chunked(Chunked),
}

impl Left {
    /// All of a body framed so (`Length(0)`: none).
    pub(crate) fn of(framing: Framing) -> Left {
        match framing {
            Framing::Length(0) => Left::Done,
            Framing::Length(n) => Left::Length(n),
            Framing::Chunked => Left::Chunked(Chunked::new()),
        }
    }

    /// The body's next piece off the front of `buf` (a slice of it, framing taken off),
    /// and whether the body ends with it; `None` until more bytes come (or once it has
    /// ended). The connection's body reads and the fuzz target's (`pieces`) go through
    /// here alike.
    pub(crate) fn next(&mut self, buf: &mut BytesMut) -> Result<Option<(Bytes, bool)>, BadChunk> {
        match self {
            Left::Done => Ok(None),
            Left::Length(n) => {
                let take = usize::try_from(*n).unwrap_or(usize::MAX).min(buf.len());
                if take == 0 {
                    return Ok(None);
                }
                *n -= take as u64;
                let done = *n == 0;
                let data = buf.split_to(take).freeze();
                if done {
                    *self = Left::Done;
                }
                Ok(Some((data, done)))
            }
            Left::Chunked(c) => match c.decode(buf)? {
                Some(d) => Ok(Some((d, false))),
                None if c.is_done() => {
                    *self = Left::Done;
                    Ok(Some((Bytes::new(), true)))
                }
                None => Ok(None),
            },
        }
    }
}

/// Where the connection stands.
enum Phase {
    /// Waiting for, or reading, a request head.
    Head,
    /// The request path has the request; its body is read as the path asks.
    Serving {
        head_only: bool,
        http11: bool,
    },
    /// The answer is written (its body in `Conn::body`).
    Writing {
        out: Out,
        done: bool,
    },
    /// Written and flushed what there was; the TLS session is closed.
    Closing,
    Done,
}

/// An HTTP/1.1 connection served by the gateway's own server (module documentation).
pub(crate) struct Conn<I, S: Serve> {
    io: I,
    service: S,
    settings: Settings,
    read: BytesMut,
    /// How much of `read` the head parse has looked at.
    scanned: usize,
    write: Vec<u8>,
    written: usize,
    /// The request body slot, made at the first request with a body.
    shared: Option<Shared>,
    seq: u64,
    /// The last answer's header map, cleared: the next head is read into it.
    headers: Option<HeaderMap>,
    /// The request path's future, in a box made once (and let go at a release).
    in_flight: Option<Pin<Box<Option<S::Future>>>>,
    phase: Phase,
    /// The answer's body while it is written, in a box made once (and let go at a
    /// release): inline, it would size the connection's task by an answer's state
    /// (the access log's record) even while idle.
    body: Option<Box<Option<S::Body>>>,
    left: Left,
    /// `Expect: 100-continue` not answered yet.
    continue_due: bool,
    /// The current request may be followed by another.
    keep_alive: bool,
    /// The connection was asked to finish: no request after the current one.
    closing: bool,
    /// The client's end of the stream was read.
    read_closed: bool,
    /// One timer: the header bound while a head is partly read, the write bound while a
    /// write waits, the release delay while idle. `None` until first needed.
    timer: Option<Deadline>,
    /// When the header bound passes (a head partly read).
    head_deadline: Option<Instant>,
    /// When a write the client holds up fails (`listener.write_timeout`).
    write_deadline: Option<Instant>,
    /// When the last answer was written (the release delay counts from it).
    idle_since: Instant,
    released: Option<Released>,
    released_gauge: Option<Gauge>,
    failure: Option<H1Error>,
}

/// Counts a released connection until dropped.
struct Released(Gauge);

impl Drop for Released {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl<I: Io, S: Serve> Conn<I, S> {
    /// Serves `io` with `service`; `released` counts connections released at a time.
    pub(crate) fn new(io: I, service: S, settings: Settings, released: Option<Gauge>) -> Self {
        Conn {
            io,
            service,
            settings,
            read: BytesMut::new(),
            scanned: 0,
            write: Vec::new(),
            written: 0,
            shared: None,
            seq: 0,
            headers: None,
            in_flight: None,
            phase: Phase::Head,
            body: None,
            left: Left::Done,
            continue_due: false,
            keep_alive: true,
            closing: false,
            read_closed: false,
            timer: None,
            head_deadline: None,
            write_deadline: None,
            idle_since: Instant::now(),
            released: None,
            released_gauge: released,
            failure: None,
        }
    }

    /// Asks the connection to finish: at once if it waits for a head with nothing of
    /// one read, after the current answer otherwise.
    pub(crate) fn close_gracefully(&mut self) {
        self.closing = true;
        if matches!(self.phase, Phase::Head) && self.read.is_empty() {
            self.phase = Phase::Closing;
        }
    }

    /// Reads what the client sent into the read buffer (taking the buffer back if it was
    /// let go); `Ok(0)` at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.released.is_some() {
            ready!(self.io.poll_read_ready(cx));
        }
        if self.read.capacity() - self.read.len() < READ_CHUNK / 4 {
            self.read.reserve(READ_CHUNK);
        }
        let polled = tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read);
        if self.released.is_some() {
            if polled.is_pending() {
                // Woken with nothing to read after all (TLS bytes that made no
                // plaintext yet are kept below): still released.
                self.read = BytesMut::new();
                self.io.release();
            } else {
                self.released = None;
            }
        }
        polled
    }

    /// Writes the write buffer out (not flushed).
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.write.len() {
            let polled = Pin::new(&mut self.io).poll_write(cx, &self.write[self.written..]);
            let n = ready!(self.stalled(polled, cx))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.write.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// Flushes what was written (the TLS records out to the socket).
    fn poll_flush_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.stalled(polled, cx)
    }

    /// A write or flush's outcome, bounded: one the client does not let through for
    /// `listener.write_timeout` (it reads nothing) fails with `TimedOut`.
    fn stalled<T>(
        &mut self,
        polled: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.write_deadline = None;
            return polled;
        }
        let at = *self
            .write_deadline
            .get_or_insert_with(|| Instant::now() + self.settings.write_stall);
        ready!(self.poll_timer(at, cx));
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }

    /// The timer, set to `at` (made at first use; moved otherwise).
    fn poll_timer(&mut self, at: Instant, cx: &mut Context<'_>) -> Poll<()> {
        let timer = self.timer.get_or_insert_with(|| Deadline::new(at));
        timer.set(at);
        timer.poll_passed(cx)
    }

    /// Lets the buffers and the request state go while idle.
    fn release(&mut self) {
        self.io.release();
        self.read = BytesMut::new();
        self.write = Vec::new();
        self.headers = None;
        self.in_flight = None;
        self.body = None;
        self.shared = None;
        self.timer = None;
        if let Some(g) = &self.released_gauge {
            g.inc();
            self.released = Some(Released(g.clone()));
        }
    }

    /// Waiting for, or reading, a head.
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if !self.read.is_empty() {
                let headers = self.headers.take().unwrap_or_default();
                match head::parse(
                    &mut self.read,
                    &mut self.scanned,
                    self.settings.limits,
                    headers,
                ) {
                    Ok(Some(h)) => {
                        self.head_deadline = None;
                        self.start(h);
                        return Poll::Ready(());
                    }
                    // Begun (not only empty lines, which were skipped): bounded.
                    Ok(None) if !self.read.is_empty() => {
                        self.head_deadline
                            .get_or_insert_with(|| Instant::now() + self.settings.header_read);
                    }
                    Ok(None) => {}
                    Err(refused) => {
                        self.refuse(refused);
                        return Poll::Ready(());
                    }
                }
            }
            if self.closing && self.read.is_empty() {
                self.phase = Phase::Closing;
                return Poll::Ready(());
            }
            match self.poll_fill(cx) {
                Poll::Ready(Ok(0)) => {
                    if !self.read.is_empty() {
                        self.failure = Some(H1Error::Incomplete);
                        self.phase = Phase::Done;
                    } else {
                        self.phase = Phase::Closing;
                    }
                    return Poll::Ready(());
                }
                Poll::Ready(Ok(_)) => continue,
                Poll::Ready(Err(e)) => {
                    self.failure = Some(H1Error::Io(e));
                    self.phase = Phase::Done;
                    return Poll::Ready(());
                }
                Poll::Pending => {}
            }
            if let Some(at) = self.head_deadline {
                if self.poll_timer(at, cx).is_ready() {
                    self.failure = Some(H1Error::HeadTimeout);
                    self.phase = Phase::Done;
                    return Poll::Ready(());
                }
            } else if self.released.is_none() && !self.settings.release_after.is_zero() {
                let at = self.idle_since + self.settings.release_after;
                if self.poll_timer(at, cx).is_ready() {
                    self.release();
                    // Registers the wait for the client's next bytes.
                    if self.io.poll_read_ready(cx).is_ready() {
                        continue;
                    }
                }
            }
            return Poll::Pending;
        }
    }

    /// A head read: the request handed to the request path.
    fn start(&mut self, h: head::Head) {
        self.seq += 1;
        let length = match h.framing {
            Framing::Length(n) => Some(n),
            Framing::Chunked => None,
        };
        self.left = Left::of(h.framing);
        let shared = if matches!(self.left, Left::Done) {
            None
        } else {
            let shared = self
                .shared
                .get_or_insert_with(|| Arc::new(Mutex::new(Slot::default())));
            *lock(shared) = Slot {
                seq: self.seq,
                ..Slot::default()
            };
            Some(shared.clone())
        };
        if let (Some(shared), Left::Length(n)) = (&shared, &self.left) {
            // All of it came with the head (the rule for a small request): handed over
            // at once, a slice of the read buffer.
            if let Ok(n) = usize::try_from(*n) {
                if n <= self.read.len() {
                    let mut slot = lock(shared);
                    slot.data = Some(self.read.split_to(n).freeze());
                    slot.ended = true;
                    self.left = Left::Done;
                }
            }
        }
        self.continue_due = h.expect_continue && !matches!(self.left, Left::Done);
        self.keep_alive = h.keep_alive;
        let head_only = h.method == Method::HEAD;
        let http11 = h.version == Version::HTTP_11;
        let mut req = Request::new(RequestBody::new(shared, self.seq, length));
        *req.method_mut() = h.method;
        *req.uri_mut() = h.uri;
        *req.version_mut() = h.version;
        *req.headers_mut() = h.headers;
        let fut = self.service.call(req);
        match &mut self.in_flight {
            Some(slot) => slot.set(Some(fut)),
            None => self.in_flight = Some(Box::pin(Some(fut))),
        }
        self.phase = Phase::Serving { head_only, http11 };
    }

    /// A refused head: its answer (the gateway's JSON-RPC error, id `null`) written, then
    /// the connection closed.
    fn refuse(&mut self, refused: Refused) {
        let error = GatewayError::MalformedHttp {
            status: StatusCode::from_u16(refused.status).unwrap_or(StatusCode::BAD_REQUEST),
            reason: refused.reason,
        };
        // The status is the framing's to say: `listener.error_status` does not change it.
        let (parts, body) = error
            .into_response(&RpcId::null(), ErrorStatus::Mapped)
            .into_parts();
        let line = HeadLine {
            status: parts.status,
            length: Some(body.len() as u64),
            head_only: false,
            http11: true,
            keep_alive: false,
        };
        encode::head(&mut self.write, line, &parts.headers);
        self.write.extend_from_slice(&body);
        self.keep_alive = false;
        self.failure = Some(H1Error::Malformed(refused));
        self.read.clear();
        self.phase = Phase::Closing;
    }

    /// Reads the request body for the request path when it asks; `true` if the slot
    /// changed (the path is to be polled again).
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        let Some(shared) = self.shared.clone() else {
            return Poll::Ready(Ok(false));
        };
        if !lock(&shared).wanted {
            return Poll::Ready(Ok(false));
        }
        if self.continue_due {
            self.continue_due = false;
            self.write
                .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        if !self.write.is_empty() {
            ready!(self.poll_write_out(cx))?;
            ready!(self.poll_flush_out(cx))?;
        }
        if matches!(self.left, Left::Done) {
            // All of the body is framed already (today the body asks no more once it has
            // ended or failed, so this is not reached): it ends here, and the bytes after
            // it are the next head's, read under the head's bound, not the body's.
            let mut slot = lock(&shared);
            slot.ended = true;
            slot.wanted = false;
            wake_elsewhere(&mut slot, cx);
            return Poll::Ready(Ok(true));
        }
        loop {
            let decoded = self.left.next(&mut self.read);
            match decoded {
                Ok(Some((data, done))) => {
                    let mut slot = lock(&shared);
                    if !data.is_empty() {
                        slot.data = Some(data);
                    }
                    slot.ended = done;
                    slot.wanted = false;
                    wake_elsewhere(&mut slot, cx);
                    return Poll::Ready(Ok(true));
                }
                Ok(None) => {}
                Err(bad) => {
                    self.left = Left::Done;
                    self.keep_alive = false;
                    return Poll::Ready(Ok(fail(&shared, BodyFailure::Framing(bad.0), cx)));
                }
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) | Err(_) => {
                    self.read_closed = true;
                    self.left = Left::Done;
                    self.keep_alive = false;
                    return Poll::Ready(Ok(fail(&shared, BodyFailure::Gone, cx)));
                }
                Ok(_) => {}
            }
        }
    }

    /// Watches for the client leaving while its request is served or answered (bytes it
    /// sends meanwhile are kept for the next head, within the head bound). `Ready` when
    /// it has left.
    fn poll_left(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while !self.read_closed
            && matches!(self.left, Left::Done)
            && self.read.len() <= self.settings.limits.max_head_bytes
        {
            match ready!(self.poll_fill(cx)) {
                Ok(0) | Err(_) => {
                    self.read_closed = true;
                    return Poll::Ready(());
                }
                Ok(_) => {}
            }
        }
        Poll::Pending
    }

    /// The request path at work: polled, and its body read as it asks.
    fn poll_serving(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Phase::Serving { head_only, http11 } = self.phase else {
            return Poll::Ready(Ok(()));
        };
        loop {
            let fut = self.in_flight.as_mut().map(|f| f.as_mut().as_pin_mut());
            let Some(Some(fut)) = fut else {
                self.phase = Phase::Done;
                return Poll::Ready(Ok(()));
            };
            match fut.poll(cx) {
                Poll::Ready(Ok(resp)) => {
                    if let Some(f) = &mut self.in_flight {
                        f.set(None);
                    }
                    self.answer(resp, head_only, http11);
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Err(never)) => match never {},
                Poll::Pending => {}
            }
            if ready!(self.poll_body(cx))? {
                continue;
            }
            if self.poll_left(cx).is_ready() {
                // Gone with its request in flight: the request ends with it.
                if let Some(f) = &mut self.in_flight {
                    f.set(None);
                }
                self.phase = Phase::Done;
                return Poll::Ready(Ok(()));
            }
            return Poll::Pending;
        }
    }

    /// The request path answered: its head written into the write buffer.
    fn answer(&mut self, resp: Response<S::Body>, head_only: bool, http11: bool) {
        let (mut parts, body) = resp.into_parts();
        // A body the path did not read: skipped if it is all here, else the connection
        // closes after this answer.
        match &mut self.left {
            Left::Done => {}
            Left::Length(n) if *n <= self.read.len() as u64 => {
                self.read.advance(*n as usize);
                self.left = Left::Done;
            }
            Left::Chunked(c) => {
                while let Ok(Some(_)) = c.decode(&mut self.read) {}
                if c.is_done() {
                    self.left = Left::Done;
                }
            }
            Left::Length(_) => {}
        }
        if !matches!(self.left, Left::Done) {
            self.keep_alive = false;
            self.left = Left::Done;
            self.read_closed = true;
        }
        if let Some(shared) = &self.shared {
            // A body kept past its request reads nothing more.
            lock(shared).seq = 0;
        }
        let asked_close = parts
            .headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        self.keep_alive &= !self.closing && !asked_close;
        let line = HeadLine {
            status: parts.status,
            length: body.size_hint().exact(),
            head_only,
            http11,
            keep_alive: self.keep_alive,
        };
        let out = encode::head(&mut self.write, line, &parts.headers);
        if out == Out::UntilClose {
            self.keep_alive = false;
        }
        parts.headers.clear();
        self.headers = Some(parts.headers);
        match &mut self.body {
            Some(slot) => **slot = Some(body),
            None => self.body = Some(Box::new(Some(body))),
        }
        self.phase = Phase::Writing { out, done: false };
    }

    /// The answer's body written as it comes; each piece flushed when the body has
    /// nothing more ready.
    fn poll_writing(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), H1Error>> {
        loop {
            let Phase::Writing { out, done } = &mut self.phase else {
                return Poll::Ready(Ok(()));
            };
            let Some(body) = self.body.as_deref_mut().and_then(Option::as_mut) else {
                return Poll::Ready(Ok(()));
            };
            let mut waiting = false;
            while !*done && self.write.len() < WRITE_HIGH {
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        let Ok(data) = frame.into_data() else {
                            continue;
                        };
                        match out {
                            Out::None => {}
                            Out::Chunked if data.is_empty() => {}
                            Out::Chunked => {
                                encode::chunk_size(&mut self.write, data.len());
                                self.write.extend_from_slice(&data);
                                self.write.extend_from_slice(b"\r\n");
                            }
                            Out::Length(_) | Out::UntilClose => {
                                self.write.extend_from_slice(&data);
                            }
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        // Cut short: the client sees an incomplete message.
                        self.keep_alive = false;
                        self.failure = Some(H1Error::Body(e.into()));
                        self.drop_body();
                        self.phase = Phase::Closing;
                        return Poll::Ready(Ok(()));
                    }
                    Poll::Ready(None) => {
                        *done = true;
                        if *out == Out::Chunked {
                            self.write.extend_from_slice(encode::LAST_CHUNK);
                        }
                    }
                    Poll::Pending => {
                        waiting = true;
                        break;
                    }
                }
            }
            let done = *done;
            if done {
                // Ended: what it held (its permits, the access log's record) goes now.
                self.drop_body();
            }
            ready!(self.poll_write_out(cx)).map_err(H1Error::Io)?;
            if done {
                ready!(self.poll_flush_out(cx)).map_err(H1Error::Io)?;
                self.finish();
                return Poll::Ready(Ok(()));
            }
            if waiting {
                ready!(self.poll_flush_out(cx)).map_err(H1Error::Io)?;
                if self.poll_left(cx).is_ready() {
                    self.drop_body();
                    self.phase = Phase::Done;
                    return Poll::Ready(Ok(()));
                }
                return Poll::Pending;
            }
        }
    }

    /// The answer's body let go (the box kept for the next answer).
    fn drop_body(&mut self) {
        if let Some(slot) = &mut self.body {
            **slot = None;
        }
    }

    /// An answer written whole: the next head, or the close.
    fn finish(&mut self) {
        self.phase = if self.keep_alive && !self.closing && !self.read_closed {
            Phase::Head
        } else {
            Phase::Closing
        };
        if self.write.capacity() > WRITE_KEPT {
            self.write = Vec::new();
        }
        self.idle_since = Instant::now();
    }
}

/// Wakes the body's task if it is not this one (this one polls the path again).
fn wake_elsewhere(slot: &mut Slot, cx: &Context<'_>) {
    if let Some(w) = slot.waker.take() {
        if !w.will_wake(cx.waker()) {
            w.wake();
        } else {
            slot.waker = Some(w);
        }
    }
}

/// Marks the body failed; `true` (the path is to be polled again).
fn fail(shared: &Shared, failure: BodyFailure, cx: &Context<'_>) -> bool {
    let mut slot = lock(shared);
    slot.failed = Some(failure);
    slot.wanted = false;
    wake_elsewhere(&mut slot, cx);
    true
}

impl<I: Io, S: Serve> Future for Conn<I, S> {
    type Output = Result<(), H1Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match this.phase {
                Phase::Head => ready!(this.poll_head(cx)),
                Phase::Serving { .. } => {
                    if let Err(e) = ready!(this.poll_serving(cx)) {
                        this.failure = Some(H1Error::Io(e));
                        this.phase = Phase::Done;
                    }
                }
                Phase::Writing { .. } => {
                    if let Err(e) = ready!(this.poll_writing(cx)) {
                        this.failure = Some(e);
                        this.phase = Phase::Done;
                    }
                }
                Phase::Closing => {
                    // What is buffered (a refusal's answer) goes out first; a client that
                    // does not read it or its close_notify does not hold the close up
                    // past the connection's grace (`drive`).
                    let _ = ready!(this.poll_write_out(cx));
                    let shut = Pin::new(&mut this.io).poll_shutdown(cx);
                    let _ = ready!(this.stalled(shut, cx));
                    this.phase = Phase::Done;
                }
                Phase::Done => {
                    this.in_flight = None;
                    this.body = None;
                    return Poll::Ready(match this.failure.take() {
                        Some(e) => Err(e),
                        None => Ok(()),
                    });
                }
            }
        }
    }
}
