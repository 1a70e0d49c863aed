//! What a Leader's stream body sends: buffered events with their `id:` line and the
//! Leader's own JSON-RPC id spliced in, keep-alive comments, and a final error event when
//! the stream cannot go on. Shared by every follower, whether it reads a record in this
//! instance's memory (the relay's `follow`) or one recorded by another instance.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::replay::{Entry, StreamEnd, NO_SEQ};
use crate::error::codes;
use crate::jsonrpc::reply::{error_body, ErrorData, RpcId};
use crate::outcome::{Ending, StreamTally};

/// What a Leader gets when a Partner's stream fails before a terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnUpstreamFailure {
    /// A final JSON-RPC -32603 event with the reason and `lastEventSeq`.
    #[default]
    ErrorEvent,
    /// The stream just ends (the replay buffer still records how it ended).
    Close,
}

/// Events up to this size are copied into one buffer per read of the record, so a burst
/// goes to the Leader as one frame: a frame per event (and two more per spliced id) cost
/// far more than copying a small event. A larger event goes out as slices of its own
/// bytes, uncopied.
pub(crate) const COALESCE_MAX: usize = 4096;

/// The comment sent after `keepalive_interval` without an event.
pub(crate) const KEEPALIVE: &[u8] = b": keep-alive\n\n";

/// One Leader's outgoing frames.
pub(crate) struct Emitter {
    id: RpcId,
    queue: VecDeque<Bytes>,
    /// Small events of the current read, copied together (see [`COALESCE_MAX`]).
    pending: BytesMut,
    /// The last `eventSeq` sent.
    pub last_sent: Option<u64>,
    /// Nothing more will be queued.
    pub done: bool,
    on_failure: OnUpstreamFailure,
    /// The Partner's events sent to this Leader and how the stream ended (access log).
    tally: Arc<StreamTally>,
}

impl Emitter {
    pub(crate) fn new(id: RpcId, on_failure: OnUpstreamFailure, tally: Arc<StreamTally>) -> Self {
        Emitter {
            id,
            queue: VecDeque::new(),
            pending: BytesMut::new(),
            last_sent: None,
            done: false,
            on_failure,
            tally,
        }
    }

    /// The next frame queued.
    pub(crate) fn pop(&mut self) -> Option<Bytes> {
        self.queue.pop_front()
    }

    /// Whether a frame is queued.
    pub(crate) fn has_frames(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Queues a keep-alive comment.
    pub(crate) fn keepalive(&mut self) {
        self.queue.push_back(Bytes::from_static(KEEPALIVE));
    }

    /// Adds one event (coalesced with the others of this read until [`Self::flush`]).
    pub(crate) fn push_event(&mut self, e: &Entry) {
        use std::fmt::Write as _;
        self.tally.add_events(1);
        let (start, len) = (e.id_start as usize, e.id_len as usize);
        let same_id = len == 0 || &e.bytes[start..start + len] == self.id.as_bytes();
        if e.bytes.len() > COALESCE_MAX {
            self.flush();
            if e.seq != NO_SEQ {
                self.queue
                    .push_back(Bytes::from(format!("id: {}\n", e.seq)));
                self.last_sent = Some(e.seq);
            }
            if same_id {
                self.queue.push_back(e.bytes.clone());
            } else {
                self.queue.push_back(e.bytes.slice(..start));
                self.queue.push_back(self.id.clone().into_bytes());
                self.queue.push_back(e.bytes.slice(start + len..));
            }
            return;
        }
        if e.seq != NO_SEQ {
            let _ = writeln!(self.pending, "id: {}", e.seq);
            self.last_sent = Some(e.seq);
        }
        if same_id {
            self.pending.extend_from_slice(&e.bytes);
        } else {
            self.pending.extend_from_slice(&e.bytes[..start]);
            self.pending.extend_from_slice(self.id.as_bytes());
            self.pending.extend_from_slice(&e.bytes[start + len..]);
        }
    }

    /// Queues the coalesced events as one frame.
    pub(crate) fn flush(&mut self) {
        if !self.pending.is_empty() {
            self.queue.push_back(self.pending.split().freeze());
        }
    }

    /// The recorded stream ended: a clean end, or the Partner's failure told as
    /// `on_failure` says.
    pub(crate) fn ended(&mut self, end: StreamEnd) {
        match end {
            StreamEnd::Complete => {
                self.flush();
                self.tally.end(Ending::completed());
                self.done = true;
            }
            StreamEnd::Failed { reason } => {
                let tell = self.on_failure == OnUpstreamFailure::ErrorEvent;
                self.fail(reason, None, tell);
            }
        }
    }

    /// Ends this Leader's stream, with a final error event when `tell` (the end is recorded
    /// for the access log either way). A Partner-caused end is counted once by the
    /// stream's recorder, not per follower.
    pub(crate) fn fail(&mut self, reason: &'static str, last_available: Option<u64>, tell: bool) {
        self.tally.end(Ending {
            reason,
            count_upstream: false,
        });
        self.flush();
        if tell {
            let ev = error_event(&self.id, reason, Some(self.last_sent), last_available);
            self.queue.push_back(ev);
        }
        self.done = true;
    }
}

/// A final SSE event carrying a JSON-RPC -32603 error: `reason`, and the last `eventSeq`
/// the Leader got (`Some(None)` for none; `None` when the gateway cannot tell).
pub(crate) fn error_event(
    id: &RpcId,
    reason: &'static str,
    last_event_seq: Option<Option<u64>>,
    last_available: Option<u64>,
) -> Bytes {
    let data = ErrorData {
        reason,
        last_event_seq,
        last_available_seq: last_available,
        ..Default::default()
    };
    let body = error_body(id, codes::INTERNAL_ERROR, "Internal error", &data);
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&body);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Waits for the gateway's shutdown signal to change (forever once it is gone).
pub(crate) async fn closing_changed(
    c: &mut Option<tokio::sync::watch::Receiver<bool>>,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    match c {
        Some(c) => c.changed().await,
        None => std::future::pending().await,
    }
}
