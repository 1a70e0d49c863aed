//! Relaying a Partner's SSE stream through the replay buffer.
//!
//! One task per stream ([`record_upstream`]) reads the Partner's body, splits it into
//! events and appends them to the stream's record. Every Leader connection, the one that
//! started the stream and any that re-stream it, is a follower ([`follow`]): a response
//! body that reads the record from its cursor and waits for more. So the first Leader and
//! a re-streaming one are served by the same code, several Leaders can follow one stream,
//! and a Leader that disconnects does not stop the recording (the upstream is cancelled
//! only after `detach_timeout` with no follower).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, StreamBody};
use tokio::time::Instant;

use super::event::inspect;
use super::replay::{Cursor, Entry, StreamEnd, StreamRecord, NO_SEQ};
use super::splitter::{RawEvent, Splitter};
use crate::error::codes;
use crate::jsonrpc::reply::{error_body, ErrorData, RpcId};
use crate::proxy::{BoxError, ResponseBody};

/// Stream timing and size bounds (see `[stream]` in the config).
#[derive(Debug, Clone, Copy)]
pub struct StreamSettings {
    /// A comment is sent to a follower after this long without an event.
    pub keepalive_interval: Duration,
    /// The Partner's stream fails after this long without a byte.
    pub idle_timeout: Duration,
    /// With no follower for this long, the upstream request is cancelled.
    pub detach_timeout: Duration,
    /// Largest event accepted from a Partner.
    pub max_event_bytes: usize,
}

/// Reads the Partner's SSE body into `record` until the stream ends, fails, idles out,
/// or has had no follower for `detach_timeout`. Always finishes the record.
pub async fn record_upstream<B>(body: B, record: Arc<dyn StreamRecord>, s: StreamSettings)
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut body = body;
    let mut splitter = Splitter::new(s.max_event_bytes);
    let mut events: Vec<RawEvent> = Vec::new();
    let mut followers = record.followers();
    let mut terminal = false;
    let mut alone_since = (*followers.borrow_and_update() == 0).then(Instant::now);
    let idle = tokio::time::sleep(s.idle_timeout);
    tokio::pin!(idle);
    let end = loop {
        let detach_at = alone_since.map(|t| t + s.detach_timeout);
        tokio::select! {
            frame = body.frame() => match frame {
                None => {
                    splitter.finish(&mut events);
                    terminal |= append_all(&*record, &mut events);
                    break if terminal {
                        StreamEnd::Complete
                    } else {
                        StreamEnd::Failed { reason: "upstream_closed_early" }
                    };
                }
                Some(Err(_)) => break StreamEnd::Failed { reason: "upstream_reset" },
                Some(Ok(frame)) => {
                    idle.as_mut().reset(Instant::now() + s.idle_timeout);
                    if let Ok(data) = frame.into_data() {
                        let too_large = splitter.push(data, &mut events).is_err();
                        terminal |= append_all(&*record, &mut events);
                        if too_large {
                            break StreamEnd::Failed { reason: "event_too_large" };
                        }
                    }
                }
            },
            _ = &mut idle => break StreamEnd::Failed { reason: "upstream_idle_timeout" },
            _ = sleep_until_opt(detach_at) => break StreamEnd::Failed { reason: "detach_timeout" },
            changed = followers.changed() => {
                if changed.is_err() {
                    break StreamEnd::Failed { reason: "record_dropped" };
                }
                let n = *followers.borrow_and_update();
                alone_since = if n == 0 { alone_since.or(Some(Instant::now())) } else { None };
            }
        }
    };
    // Dropping `body` here cancels the upstream request if it is still open.
    record.finish(end);
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Appends split events to the record; true if one reports a terminal task state.
fn append_all(record: &dyn StreamRecord, events: &mut Vec<RawEvent>) -> bool {
    let mut terminal = false;
    for ev in events.drain(..) {
        let info = inspect(&ev.bytes);
        terminal |= info.terminal;
        let (id_start, id_len) = info
            .id_range
            .map_or((0, 0), |r| (r.start as u32, (r.end - r.start) as u32));
        record.append(Entry {
            seq: info.seq.unwrap_or(NO_SEQ),
            bytes: ev.bytes,
            id_start,
            id_len,
        });
    }
    terminal
}

struct Follower {
    record: Arc<dyn StreamRecord>,
    cursor: Cursor,
    id: RpcId,
    changes: tokio::sync::watch::Receiver<u64>,
    queue: VecDeque<Bytes>,
    scratch: Vec<Entry>,
    keepalive: Duration,
    last_sent: Option<u64>,
    done: bool,
    _guard: super::replay::FollowerGuard,
}

/// A response body following `record` from `cursor`. Every event gets an `id: <eventSeq>`
/// line, and its JSON-RPC id is replaced by `id` when they differ (spliced into the
/// event's own bytes, never re-serialized). An abnormal end or an eviction gap becomes a
/// final JSON-RPC error event.
pub fn follow(
    record: Arc<dyn StreamRecord>,
    cursor: Cursor,
    id: RpcId,
    keepalive: Duration,
) -> ResponseBody {
    let state = Follower {
        changes: record.changes(),
        _guard: record.clone().follow(),
        record,
        cursor,
        id,
        queue: VecDeque::new(),
        scratch: Vec::new(),
        keepalive,
        last_sent: None,
        done: false,
    };
    let frames = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(b) = st.queue.pop_front() {
                return Some((Ok::<_, BoxError>(Frame::data(b)), st));
            }
            if st.done {
                return None;
            }
            // Marked seen before reading: an append after the read still wakes us.
            st.changes.borrow_and_update();
            match st.record.read(&mut st.cursor, &mut st.scratch) {
                Ok(end) => {
                    let entries = std::mem::take(&mut st.scratch);
                    for e in &entries {
                        st.push_event(e);
                    }
                    st.scratch = entries;
                    st.scratch.clear();
                    match end {
                        Some(StreamEnd::Complete) => st.done = true,
                        Some(StreamEnd::Failed { reason }) => {
                            let ev = st.error_event(reason, None);
                            st.queue.push_back(ev);
                            st.done = true;
                        }
                        None => {}
                    }
                }
                Err(gap) => {
                    let ev = st.error_event("events_evicted", gap.first_available_seq);
                    st.queue.push_back(ev);
                    st.done = true;
                }
            }
            if !st.queue.is_empty() || st.done {
                continue;
            }
            tokio::select! {
                r = st.changes.changed() => {
                    if r.is_err() {
                        st.done = true;
                    }
                }
                _ = tokio::time::sleep(st.keepalive) => {
                    st.queue.push_back(Bytes::from_static(b": keep-alive\n\n"));
                }
            }
        }
    });
    StreamBody::new(Box::pin(frames)).boxed_unsync()
}

impl Follower {
    fn push_event(&mut self, e: &Entry) {
        if e.seq != NO_SEQ {
            self.queue
                .push_back(Bytes::from(format!("id: {}\n", e.seq)));
            self.last_sent = Some(e.seq);
        }
        let (start, len) = (e.id_start as usize, e.id_len as usize);
        if len == 0 || &e.bytes[start..start + len] == self.id.as_bytes() {
            self.queue.push_back(e.bytes.clone());
        } else {
            self.queue.push_back(e.bytes.slice(..start));
            self.queue.push_back(self.id.clone().into_bytes());
            self.queue.push_back(e.bytes.slice(start + len..));
        }
    }

    fn error_event(&self, reason: &'static str, last_available: Option<u64>) -> Bytes {
        let data = ErrorData {
            reason,
            last_event_seq: Some(self.last_sent),
            last_available_seq: last_available,
            ..Default::default()
        };
        let body = error_body(&self.id, codes::INTERNAL_ERROR, "Internal error", &data);
        let mut out = Vec::with_capacity(body.len() + 8);
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&body);
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }
}
