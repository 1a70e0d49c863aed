//! The body of a request the gateway's own HTTP/1.1 server read (`server::h1`), as the
//! request path reads it: a handle on its connection's one body slot, filled by the
//! connection's task from its read buffer when the body is polled.
//!
//! hyper hands each request a channel with its own allocations; here the slot is made
//! once per connection and each request's body holds a reference to it, tagged with the
//! request's number, so a body kept past its request reads nothing of the next one.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Why a request body could not be read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFailure {
    /// The client closed the connection, or it failed, before the body ended.
    Gone,
    /// The body's chunked framing is broken (the reason).
    Framing(&'static str),
}

impl std::fmt::Display for BodyFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyFailure::Gone => f.write_str("the client left before the request body ended"),
            BodyFailure::Framing(why) => {
                write!(f, "the request body's chunks are malformed: {why}")
            }
        }
    }
}

impl std::error::Error for BodyFailure {}

/// What the connection and the current request's body share.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// The request the slot is for (a body of another reads nothing).
    pub(crate) seq: u64,
    /// Data read and not yet taken.
    pub(crate) data: Option<Bytes>,
    /// The body has ended (after `data` is taken).
    pub(crate) ended: bool,
    pub(crate) failed: Option<BodyFailure>,
    /// The body was polled with nothing to take: the connection reads for it.
    pub(crate) wanted: bool,
    /// The task to wake when data comes (the connection's own, as a rule).
    pub(crate) waker: Option<Waker>,
}

pub(crate) type Shared = Arc<Mutex<Slot>>;

/// Locks the slot (a poisoned lock still holds a consistent slot: every write to it is
/// a plain assignment).
pub(crate) fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Slot> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request body read off an HTTP/1.1 connection served by the gateway's own server.
#[derive(Debug)]
pub struct RequestBody {
    shared: Option<Shared>,
    seq: u64,
    hint: SizeHint,
}

impl RequestBody {
    /// The body of request `seq`, of `length` bytes if known (`Some(0)`: none).
    pub(crate) fn new(shared: Option<Shared>, seq: u64, length: Option<u64>) -> RequestBody {
        let hint = length.map_or_else(SizeHint::default, SizeHint::with_exact);
        RequestBody {
            shared: shared.filter(|_| length != Some(0)),
            seq,
            hint,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyFailure;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyFailure>>> {
        let this = &mut *self;
        let Some(shared) = &this.shared else {
            return Poll::Ready(None);
        };
        let mut slot = lock(shared);
        if slot.seq != this.seq {
            drop(slot);
            this.shared = None;
            return Poll::Ready(Some(Err(BodyFailure::Gone)));
        }
        if let Some(data) = slot.data.take() {
            if let Some(upper) = this.hint.upper() {
                let left = upper.saturating_sub(data.len() as u64);
                drop(slot);
                this.hint = SizeHint::with_exact(left);
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(failed) = slot.failed {
            drop(slot);
            this.shared = None;
            return Poll::Ready(Some(Err(failed)));
        }
        if slot.ended {
            drop(slot);
            this.shared = None;
            return Poll::Ready(None);
        }
        slot.wanted = true;
        match &mut slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.shared.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}
