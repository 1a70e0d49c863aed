//! The gateway's HTTP/1.1 client to Partners: a request written and its response read on
//! the request's own task (no connection task, no channel between them), over
//! connections kept in [`Idle`] between requests. The bytes are [`super::wire`]'s.
//!
//! A connection goes back to the idle set only when its response was read to the end of
//! its framing with nothing after it, the Partner did not ask to close, and its body was
//! not dropped early; anything else closes it. A request on a reused connection whose
//! write fails (the Partner closed it while idle) is written once more on a new one;
//! nothing is retried once written.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::budget::Budget;
use super::conn::{Conn, ConnectError, Endpoint};
use super::idle::Idle;
use super::wire::{Decoded, Decoder, Truncated, WireError};
use crate::timers::TimedOut;

mod send;
pub(crate) use send::Sending;

/// Request bodies up to this size are copied behind the head and written at once.
const JOIN_BODY: usize = 16 * 1024;

/// Why a request to a Partner failed before its response head.
#[derive(Debug, thiserror::Error)]
pub(crate) enum H1Error {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("writing the request to the Partner failed: {0}")]
    Write(#[source] io::Error),
    #[error("reading from the Partner failed: {0}")]
    Read(#[source] io::Error),
    #[error("the Partner closed the connection before its response head")]
    ClosedBeforeHead,
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("the Partner's response head did not arrive in time")]
    TimedOut,
}

impl From<TimedOut> for H1Error {
    fn from(_: TimedOut) -> H1Error {
        H1Error::TimedOut
    }
}

/// The HTTP/1.1 client to one origin (shared by every Partner there): where it
/// connects, its idle connections, and the budget each connection takes a slot of.
pub(crate) struct H1Client {
    endpoint: Endpoint,
    idle: Arc<Idle>,
    budget: Arc<Budget>,
    connect_timeout: Duration,
    max_head: usize,
}

impl H1Client {
    pub(crate) fn new(
        endpoint: Endpoint,
        idle: Arc<Idle>,
        budget: Arc<Budget>,
        connect_timeout: Duration,
        max_head: usize,
    ) -> H1Client {
        H1Client {
            endpoint,
            idle,
            budget,
            connect_timeout,
            max_head,
        }
    }

    pub(crate) fn idle(&self) -> &Arc<Idle> {
        &self.idle
    }
}

/// Why a response body broke off.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// An `UnexpectedEof` inside: the Partner closed the connection before the body's end.
    #[error("reading the Partner's body failed: {0}")]
    Io(#[source] io::Error),
    #[error(transparent)]
    Wire(#[from] WireError),
}

impl From<Truncated> for BodyError {
    fn from(t: Truncated) -> BodyError {
        match t {
            Truncated::Eof => BodyError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the Partner closed the connection before the body's end",
            )),
            Truncated::Invalid(w) => BodyError::Wire(w),
        }
    }
}

/// A Partner's response body, read from its connection as the relay asks for it.
pub(crate) struct H1Body {
    conn: Option<Conn>,
    decoder: Decoder,
    keep_alive: bool,
    /// Where the connection goes back: the idle set and the worker.
    home: (Arc<Idle>, usize),
}

impl H1Body {
    /// The body is read: its connection kept for another request if it can carry one.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && conn.buf.is_empty() {
                // Idle, it keeps its (empty) buffer for the next request to be written
                // from (`Conn::write_buffer`).
                let (idle, worker) = &self.home;
                idle.put(*worker, conn);
            }
        }
    }

    fn fail(&mut self, e: impl Into<BodyError>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.conn = None;
        Poll::Ready(Some(Err(e.into())))
    }
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let eof = match this.decoder.next(&mut conn.buf, false) {
                Ok(Decoded::Data(data)) => {
                    if this.decoder.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::NeedMore) => match ready!(conn.poll_fill(cx)) {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) => return this.fail(BodyError::Io(e)),
                },
                Err(e) => return this.fail(e),
            };
            if eof {
                // Whatever the end of the connection makes of the body; the connection
                // itself is done.
                let step = this.decoder.next(&mut conn.buf, true);
                this.conn = None;
                return match step {
                    Ok(Decoded::Data(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(_) => Poll::Ready(None),
                    Err(e) => this.fail(e),
                };
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) if self.conn.is_some() => SizeHint::with_exact(n),
            Some(_) => SizeHint::with_exact(0),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests;
