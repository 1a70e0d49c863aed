//! The one follower loop: a Leader's stream body, whatever holds the stream. A [`Feed`]
//! is where the events come from (a record in this instance's memory, [`RecordFeed`], or
//! the copy another instance writes to Redis, `cluster::restream`); the loop around it
//! ([`body`]) is the same for both: queued frames first, then what the feed already has,
//! then the shutdown signal, then a wait for more (a keep-alive comment when nothing
//! comes).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use super::emit::{closing_changed, Emitter, OnUpstreamFailure};
use super::replay::{Cursor, Entry, FollowerGuard, StreamRecord};
use crate::body::{BoxError, ResponseBody};
use crate::jsonrpc::reply::RpcId;
use crate::outcome::StreamTally;

/// What a follower's body is told with: the Leader's JSON-RPC id (spliced into every
/// event), the keep-alive interval, what a Partner failure becomes, the gateway's
/// shutdown signal, and the tally of what was sent (access log).
pub(crate) struct Listener {
    /// The Leader's request id.
    pub id: RpcId,
    /// A comment after this long without an event.
    pub keepalive: Duration,
    /// What a Leader gets when the Partner's stream fails before a terminal state.
    pub on_failure: OnUpstreamFailure,
    /// Turns true when the drain time of a shutdown is over.
    pub closing: tokio::sync::watch::Receiver<bool>,
    /// Events sent and how the stream ended for this Leader.
    pub tally: Arc<StreamTally>,
}

/// Where a follower's events come from.
pub(crate) trait Feed: Send + 'static {
    /// Puts into `out` what is there already (events, the end, a gap), without waiting.
    fn take_ready(&mut self, out: &mut Emitter);
    /// Waits for more, at most about `keepalive`, and puts into `out` what came (a
    /// keep-alive comment when a quiet `keepalive` passed; `out.done` when the stream is
    /// gone). Cancelled when the shutdown signal changes: nothing read may be lost then.
    fn wait<'a>(
        &'a mut self,
        out: &'a mut Emitter,
        keepalive: Duration,
    ) -> impl Future<Output = ()> + Send + 'a;
}

struct Follower<F> {
    feed: F,
    out: Emitter,
    /// The gateway's shutdown signal (`None` once its sender is gone).
    closing: Option<tokio::sync::watch::Receiver<bool>>,
    keepalive: Duration,
}

/// A response body following `feed` for one Leader. Every event gets an `id: <eventSeq>`
/// line, and its JSON-RPC id is replaced by the Leader's when they differ (spliced into
/// the event's own bytes, never re-serialized). An abnormal end (unless `on_failure` is
/// `close`: then the stream just ends) or a gap becomes a final JSON-RPC error event, and
/// so does the shutdown signal turning true (a shutdown whose drain time is over).
pub(crate) fn body<F: Feed>(feed: F, l: Listener) -> ResponseBody {
    let state = Follower {
        feed,
        out: Emitter::new(l.id, l.on_failure, l.tally),
        closing: Some(l.closing),
        keepalive: l.keepalive,
    };
    let frames = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(b) = st.out.pop() {
                return Some((Ok::<_, BoxError>(Frame::data(b)), st));
            }
            if st.out.done {
                return None;
            }
            st.feed.take_ready(&mut st.out);
            if st.out.has_frames() || st.out.done {
                continue;
            }
            if st.closing.as_ref().is_some_and(|c| *c.borrow()) {
                // The gateway is shutting down and the drain time is over.
                st.out.fail("shutting_down", None, true);
                continue;
            }
            let Follower {
                feed,
                out,
                closing,
                keepalive,
            } = &mut st;
            tokio::select! {
                r = closing_changed(closing) => {
                    if r.is_err() {
                        *closing = None; // no shutdown signal any more
                    }
                }
                () = feed.wait(out, *keepalive) => {}
            }
        }
    });
    StreamBody::new(Box::pin(frames)).boxed_unsync()
}

/// A record in this instance's memory, read from a cursor; the reader is counted as a
/// follower of the stream while the feed lives.
pub(crate) struct RecordFeed {
    record: Arc<dyn StreamRecord>,
    cursor: Cursor,
    changes: tokio::sync::watch::Receiver<u64>,
    scratch: Vec<Entry>,
    _guard: FollowerGuard,
}

impl RecordFeed {
    /// Follows `record` from `cursor`.
    pub(crate) fn new(record: Arc<dyn StreamRecord>, cursor: Cursor) -> RecordFeed {
        RecordFeed {
            changes: record.changes(),
            _guard: record.clone().follow(),
            record,
            cursor,
            scratch: Vec::new(),
        }
    }
}

impl Feed for RecordFeed {
    fn take_ready(&mut self, out: &mut Emitter) {
        // Marked seen before reading: an append after the read still wakes the wait.
        self.changes.borrow_and_update();
        match self.record.read(&mut self.cursor, &mut self.scratch) {
            Ok(end) => {
                for e in &self.scratch {
                    out.push_event(e);
                }
                out.flush();
                self.scratch.clear();
                if let Some(end) = end {
                    out.ended(end);
                }
            }
            Err(gap) => out.fail("events_evicted", gap.first_available_seq, true),
        }
    }

    async fn wait<'a>(&'a mut self, out: &'a mut Emitter, keepalive: Duration) {
        tokio::select! {
            r = self.changes.changed() => {
                if r.is_err() {
                    out.done = true;
                }
            }
            _ = tokio::time::sleep(keepalive) => out.keepalive(),
        }
    }
}
