//! A2A event streams through the replay buffer, so that a client can resume them.
//!
//! - **Recorded**: a `SendStreamingMessage` / `message/stream` or a forwarded
//!   `SubscribeToTask` / `tasks/resubscribe` answered with a `200 text/event-stream` is
//!   read on a task of its own until its first event with data; when that event names a
//!   task, the stream is recorded in the replay buffer under (Partner, task id), owned by
//!   the caller, within the replay bounds (`replay.*`), and the caller follows the
//!   record as an AIP Leader does. A2A events carry no id, so the gateway numbers them:
//!   `id: <n>` where `n = (record << 32) + k`, `record` a number drawn when the record is
//!   opened (31 bits) and `k` counting the record's events from 1. An id of an earlier
//!   record of the same task is therefore never taken for one of this record. A stream
//!   whose first event names no task (a lone `Message`) is relayed as it comes.
//! - **Resumed**: a `SubscribeToTask` / `tasks/resubscribe` with `Last-Event-ID` from the
//!   record's owner is served from the buffer when the record is this instance's, the id
//!   is one of its numbers and every event after it is still held: first the current
//!   `Task` as of the id (A2A requires a subscription to start with it), folded from
//!   the `Task` the record holds and the status and artifact updates after it up to the
//!   id, sent without an `id:` line; then the held events after the id (its updates); then live ones while the recording goes on.
//!   Otherwise (no record, the id of another record, events evicted, the `Task` itself
//!   evicted) the request is forwarded and the agent's own resubscribe semantics apply
//!   (the SDK's: the current `Task`, then live events only); its answer is recorded anew.
//!   A gap that opens while a resumed client reads is a final error event
//!   (`events_evicted`), as for AIP.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};

use crate::body::{BoxError, ResponseBody};
use crate::error::GatewayError;
use crate::gateway::Snapshot;
use crate::identity::Aic;
use crate::layers::claim::AnswerBody;
use crate::policy::a2a::Recorder;
use crate::relay_body::is_event_stream;
use crate::routing::Partner;
use crate::sse::follow::{Listener, RecordFeed};
use crate::sse::relay::{record_numbered, Numbering};
use crate::sse::replay::{StreamKey, StreamMeta, StreamRecord};
use crate::sse::splitter::{fields, Splitter};

/// How the agent's answer goes back.
pub(crate) enum Opened<G> {
    /// Relayed as it is, `G` (the permits) held by its body.
    Plain(Response<AnswerBody>, G),
    /// Recorded: the caller follows the record (the recorder holds the permits).
    Recorded(RecordFeed),
}

/// Sends a streaming A2A call; `recorder` records the owners a message's answer names,
/// `owner` owns the record. The answer is read and recorded on a task of its own: a
/// caller that leaves early leaves the recording to `stream.detach_timeout`.
pub(crate) async fn send<G: Send + 'static>(
    snap: &Arc<Snapshot>,
    partner: Arc<Partner>,
    req: Request<Full<Bytes>>,
    recorder: Option<Recorder>,
    owner: Aic,
    held: G,
) -> Result<Opened<G>, GatewayError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let snap = snap.clone();
    tokio::spawn(async move {
        let cfg = snap.config.clone();
        let name = partner.config.name.clone();
        let answer = match (partner.pool.send(req).await, recorder) {
            (Ok(resp), Some(r)) => super::a2a_answer::record(resp, r, &cfg, &name).await,
            (Ok(resp), None) => Ok(resp.map(|b| b.map_err(Into::into).boxed_unsync())),
            (Err(e), _) => Err(e),
        };
        let resp = match answer {
            Ok(resp) => resp,
            Err(e) => return drop(tx.send(Err(e))),
        };
        if resp.status() != StatusCode::OK || !is_event_stream(resp.headers()) {
            return drop(tx.send(Ok(Opened::Plain(resp, held))));
        }
        let settings = cfg.stream;
        let (parts, mut body) = resp.into_parts();
        let (read, task) = first_event(
            &mut body,
            settings.max_event_bytes,
            cfg.upstream.body_idle_timeout,
        )
        .await;
        let body = chained(read, body);
        let Some(task) = task else {
            return drop(tx.send(Ok(Opened::Plain(Response::from_parts(parts, body), held))));
        };
        let key = StreamKey {
            partner: name.as_str().into(),
            task_id: task.into(),
        };
        let record = open(&snap, key, owner);
        // Followed before the recorder starts, so it never sees zero followers at first.
        let _ = tx.send(Ok(Opened::Recorded(RecordFeed::new(
            record.clone(),
            record.first_cursor(),
        ))));
        let first = Numbering::CountFrom(u64::from(record_number()) << 32 | 1);
        let recorded = record_numbered(body, record.clone(), settings, held, first);
        let closing = snap.closing.subscribe();
        let end = super::streams::until_closing(recorded, record, closing).await;
        if let crate::sse::replay::StreamEnd::Failed { reason } = end {
            if crate::outcome::partner_caused(reason) {
                snap.metrics.upstream_error(&name, reason);
            }
        }
    });
    rx.await
        .unwrap_or(Err(GatewayError::Internal { reason: "panic" }))
}

/// The record for `key` (mirrored to Redis in cluster mode, as an AIP stream's).
fn open(snap: &Snapshot, key: StreamKey, owner: Aic) -> Arc<dyn StreamRecord> {
    let meta = StreamMeta {
        owner,
        session_id: None,
    };
    let record = snap.replay.open(key.clone(), meta);
    match snap.cluster.as_ref().filter(|c| c.shares_replay()) {
        Some(c) => crate::cluster::replay::mirrored(c, &key, record, &snap.config.replay),
        None => record,
    }
}

/// A number for a new record (31 bits, never 0): the clock's microseconds plus a count of
/// the records this process opened, so two records of one task differ.
fn record_number() -> u32 {
    static OPENED: AtomicU32 = AtomicU32::new(0);
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u32);
    (micros.wrapping_add(OPENED.fetch_add(1, Ordering::Relaxed)) & 0x7fff_ffff).max(1)
}

/// Reads the answer up to its first event with data (each pause bounded by `idle`, the
/// event by `max_event_bytes`): the frames read, and the task that event names.
async fn first_event(
    body: &mut AnswerBody,
    max_event_bytes: usize,
    idle: std::time::Duration,
) -> (Vec<Bytes>, Option<String>) {
    let mut splitter = Splitter::new(max_event_bytes);
    let (mut read, mut events) = (Vec::new(), Vec::new());
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            _ => return (read, None),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        read.push(data.clone());
        if splitter.push(data, &mut events).is_err() {
            return (read, None);
        }
        if let Some(data) = events.iter().find_map(|e| fields(&e.bytes).data) {
            let task = crate::jsonrpc::a2a_answer::answer_ids(&data)
                .and_then(|ids| ids.task_id.map(|t| t.into_owned()));
            return (read, task);
        }
    }
}

/// The frames already read, then the rest of the body.
fn chained(read: Vec<Bytes>, rest: AnswerBody) -> AnswerBody {
    let head =
        futures_util::stream::iter(read.into_iter().map(|b| Ok::<_, BoxError>(Frame::data(b))));
    let rest = http_body_util::BodyStream::new(rest);
    http_body_util::StreamBody::new(futures_util::StreamExt::chain(head, rest)).boxed_unsync()
}

/// Serves a resubscription with `Last-Event-ID: after` from this instance's buffer (see
/// the module documentation); `None`: forward it.
pub(crate) fn resume(
    snap: &Snapshot,
    partner: &str,
    caller: &Aic,
    task: &str,
    after: u64,
    listener: Listener,
) -> Option<Result<ResponseBody, GatewayError>> {
    let key = StreamKey {
        partner: partner.into(),
        task_id: task.into(),
    };
    let record = snap.replay.find(&key)?;
    if record.meta().owner != *caller {
        return None; // the task policy judged the caller; another record's owner asks the agent
    }
    let mut held = Vec::new();
    let mut all = record.first_cursor();
    record.read(&mut all, &mut held).ok()?;
    let same_record = held.first().is_some_and(|e| e.seq >> 32 == after >> 32);
    let cursor = record
        .cursor_after(Some(after))
        .ok()
        .filter(|_| same_record)?;
    // The Task as of the resume point: the events after it follow as its updates.
    let upto = (held.iter())
        .position(|e| e.seq != crate::sse::replay::NO_SEQ && e.seq > after)
        .unwrap_or(held.len());
    let task_event = super::a2a_fold::current_task(&held[..upto], &listener.id)?;
    // A finished record's reader takes an open-stream permit while it reads (a live one
    // is counted by its recorder).
    let permit = match record.is_finished() {
        true => match snap.streams.try_take(caller) {
            Some(p) => Some(p),
            None => return Some(Err(GatewayError::busy("aic_streams"))),
        },
        false => None,
    };
    let follow = crate::sse::follow::body(RecordFeed::new(record, cursor), listener);
    let head = http_body_util::Full::new(task_event)
        .map_err(|never| match never {})
        .boxed_unsync();
    let frames = futures_util::StreamExt::chain(
        http_body_util::BodyStream::new(head),
        http_body_util::BodyStream::new(follow),
    );
    let body = http_body_util::StreamBody::new(frames).boxed_unsync();
    Some(Ok(crate::relay_body::hold(body, permit)))
}
