//! Relaying a Partner's SSE stream through the replay buffer.
//!
//! One task per stream ([`record_upstream`]) reads the Partner's body, splits it into
//! events and appends them to the stream's record. Every Leader connection, the one that
//! started the stream and any that re-stream it, is a follower ([`follow`]): a response
//! body that reads the record from its cursor and waits for more. So the first Leader and
//! a re-streaming one are served by the same code, several Leaders can follow one stream,
//! and a Leader that disconnects does not stop the recording (the upstream is cancelled
//! only after `detach_timeout` with no follower).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;
use tokio::time::Instant;

pub use super::emit::OnUpstreamFailure;
use super::event::inspect;
use super::replay::{Entry, StreamEnd, StreamRecord, NO_SEQ};
use super::splitter::{RawEvent, Splitter};

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
    /// What a Leader gets when the Partner's stream fails before a terminal state.
    pub on_upstream_failure: OnUpstreamFailure,
}

/// Reads the Partner's SSE body into `record` until the stream ends, fails, idles out,
/// or has had no follower for `detach_timeout`. Always finishes the record. `held` (the
/// permits counting the Partner's stream) is released only then, so a stream whose Leader
/// left still counts against the limits while the Partner keeps it open. Returns how the
/// Partner's stream ended.
pub async fn record_upstream<B, G>(
    body: B,
    record: Arc<dyn StreamRecord>,
    s: StreamSettings,
    held: G,
) -> StreamEnd
where
    B: Body<Data = Bytes> + Unpin,
{
    record_numbered(body, record, s, held, Numbering::FromEvents).await
}

/// Where an event's `eventSeq` (its `id:` line) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Numbering {
    /// The Partner's own `result.eventSeq` (AIP); a stream that closes before a
    /// terminal state ended early.
    FromEvents,
    /// Given by the gateway, counting up from this number, one per event with data (A2A
    /// events carry none); the agent closing the stream is its end.
    CountFrom(u64),
}

/// [`record_upstream`], the events numbered as `numbering` says.
pub(crate) async fn record_numbered<B, G>(
    body: B,
    record: Arc<dyn StreamRecord>,
    s: StreamSettings,
    held: G,
    mut numbering: Numbering,
) -> StreamEnd
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
                    terminal |= append_all(&*record, &mut events, &mut numbering);
                    break if terminal || numbering != Numbering::FromEvents {
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
                        terminal |= append_all(&*record, &mut events, &mut numbering);
                        if too_large {
                            break StreamEnd::Failed { reason: "event_too_large" };
                        }
                    }
                }
            },
            _ = &mut idle => break StreamEnd::Failed { reason: "upstream_idle_timeout" },
            _ = sleep_until_opt(detach_at) => {
                // A Leader following through another instance keeps the stream.
                if let Some(asked) = record.followed_elsewhere() {
                    if asked.await {
                        alone_since = Some(Instant::now());
                        continue;
                    }
                }
                break StreamEnd::Failed { reason: "detach_timeout" };
            }
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
    drop(body);
    drop(held);
    record.finish(end);
    end
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Appends split events to the record; true if one reports a terminal task state.
fn append_all(
    record: &dyn StreamRecord,
    events: &mut Vec<RawEvent>,
    numbering: &mut Numbering,
) -> bool {
    let mut terminal = false;
    let mut entries = events.drain(..).map(|ev| {
        let mut info = inspect(&ev.bytes);
        terminal |= info.terminal;
        if let Numbering::CountFrom(next) = numbering {
            let has_data = super::splitter::fields(&ev.bytes).data.is_some();
            info.seq = has_data.then_some(*next);
            *next += u64::from(has_data);
        }
        let (id_start, id_len) = info
            .id_range
            .map_or((0, 0), |r| (r.start as u32, (r.end - r.start) as u32));
        Entry {
            seq: info.seq.unwrap_or(NO_SEQ),
            bytes: ev.bytes,
            id_start,
            id_len,
        }
    });
    record.append_all(&mut entries);
    drop(entries);
    terminal
}

/// A response body following `record` from `cursor`. Every event gets an `id: <eventSeq>`
/// line, and its JSON-RPC id is replaced by `id` when they differ (spliced into the
/// event's own bytes, never re-serialized). An abnormal end (unless `on_failure` is
/// `close`: then the stream just ends) or an eviction gap becomes a final JSON-RPC error
/// event, and so does `closing` turning true (a shutdown whose drain time is over). `tally` counts the Partner's events sent (not the gateway's own error
/// event, nor keep-alive comments) and records how the stream ended for this Leader.
#[cfg(any(test, feature = "test-util"))]
pub fn follow(
    record: Arc<dyn StreamRecord>,
    cursor: super::replay::Cursor,
    id: crate::jsonrpc::reply::RpcId,
    keepalive: Duration,
    closing: tokio::sync::watch::Receiver<bool>,
    tally: Arc<crate::outcome::StreamTally>,
    on_failure: OnUpstreamFailure,
) -> crate::body::ResponseBody {
    let listener = super::follow::Listener {
        id,
        keepalive,
        on_failure,
        closing,
        tally,
    };
    super::follow::body(super::follow::RecordFeed::new(record, cursor), listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::ResponseBody;
    use crate::identity::Aic;
    use crate::jsonrpc::reply::RpcId;
    use crate::sse::emit::COALESCE_MAX;
    use crate::sse::memory::{MemoryStore, ReplayLimits};
    use crate::sse::replay::{ReplayStore, StreamKey, StreamMeta};
    use http_body::Frame;
    use http_body_util::StreamBody;
    use std::convert::Infallible;

    fn never_closing() -> tokio::sync::watch::Receiver<bool> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        std::mem::forget(tx); // kept open for the test's lifetime
        rx
    }

    fn settings() -> StreamSettings {
        StreamSettings {
            keepalive_interval: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(300),
            detach_timeout: Duration::from_secs(60),
            max_event_bytes: 1024,
            on_upstream_failure: OnUpstreamFailure::ErrorEvent,
        }
    }

    fn record() -> Arc<dyn StreamRecord> {
        // The store is leaked so it outlives the record, as the gateway's does.
        let store: &'static MemoryStore = Box::leak(Box::new(MemoryStore::new(ReplayLimits {
            max_events_per_stream: 100,
            max_bytes_per_stream: 1 << 20,
            max_total_bytes: 1 << 20,
            max_streams: 10,
            retention: Duration::from_secs(60),
        })));
        store.open(
            StreamKey {
                partner: "p".into(),
                task_id: "t".into(),
            },
            StreamMeta {
                owner: Aic::parse("10001000011K912345E789ABCDEF2353").unwrap(),
                session_id: None,
            },
        )
    }

    /// Everything the record holds, and how it ended.
    fn read_all(rec: &Arc<dyn StreamRecord>) -> (Vec<Entry>, Option<StreamEnd>) {
        let (mut c, mut out) = (rec.first_cursor(), Vec::new());
        let end = rec.read(&mut c, &mut out).unwrap();
        (out, end)
    }

    /// A Partner body that yields `chunks`, then stays open forever.
    fn open_body(
        chunks: Vec<&'static [u8]>,
    ) -> impl Body<Data = Bytes, Error = Infallible> + Unpin {
        let head = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c)))),
        );
        let tail = futures_util::stream::pending();
        StreamBody::new(futures_util::StreamExt::chain(head, tail))
    }

    /// A2A events carry no `eventSeq`: the gateway numbers each event with data from the
    /// given number (a comment is not counted), and the agent closing the stream is its
    /// end, whatever state the last event named.
    #[tokio::test(start_paused = true)]
    async fn counted_numbering_numbers_events_with_data_and_a_close_completes() {
        let rec = record();
        let chunks: Vec<&'static [u8]> = vec![
            b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"kind\":\"task\"}}\n\n: ping\n\n",
            b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"eventSeq\":9}}\n\n",
        ];
        let body = StreamBody::new(futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c)))),
        ));
        let _follower = rec.clone().follow();
        let first = Numbering::CountFrom(7 << 32 | 1);
        let end = record_numbered(body, rec.clone(), settings(), (), first).await;
        assert_eq!(end, StreamEnd::Complete);
        let (entries, end) = read_all(&rec);
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [7 << 32 | 1, NO_SEQ, 7 << 32 | 2]);
        assert_eq!(end, Some(StreamEnd::Complete));
    }

    async fn next_text(body: &mut ResponseBody) -> String {
        let mut out = String::new();
        loop {
            let f = body.frame().await.expect("frame").unwrap();
            out.push_str(&String::from_utf8_lossy(&f.into_data().unwrap()));
            if out.ends_with("\n\n") {
                return out;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn idle_follower_gets_keepalive_comments() {
        let rec = record();
        let mut body = follow(
            rec.clone(),
            rec.first_cursor(),
            RpcId::null(),
            Duration::from_secs(15),
            never_closing(),
            Arc::default(),
            OnUpstreamFailure::ErrorEvent,
        );
        let t0 = Instant::now();
        assert_eq!(next_text(&mut body).await, ": keep-alive\n\n");
        assert!(t0.elapsed() >= Duration::from_secs(15));
        rec.append(Entry {
            seq: 1,
            bytes: Bytes::from_static(b"data: {}\n\n"),
            id_start: 0,
            id_len: 0,
        });
        assert_eq!(next_text(&mut body).await, "id: 1\ndata: {}\n\n");
    }

    /// The events of one read go out as one frame, each with its `id:` line and the
    /// follower's JSON-RPC id spliced in; an event over `COALESCE_MAX` goes as slices of
    /// its own bytes, after the coalesced ones, in order.
    #[tokio::test(start_paused = true)]
    async fn small_events_of_one_read_share_a_frame_and_large_ones_go_uncopied() {
        let rec = record();
        let event = |seq: u64, id: &str, pad: usize| {
            let text = format!(
                "data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"eventSeq\":{seq},\"x\":\"{}\"}}}}\n\n",
                "p".repeat(pad)
            );
            let id_start = text.find(id).unwrap() as u32;
            Entry {
                seq,
                bytes: Bytes::from(text),
                id_start,
                id_len: id.len() as u32,
            }
        };
        rec.append(event(1, "\"a\"", 10));
        rec.append(event(2, "\"b\"", 10));
        rec.append(event(3, "\"b\"", COALESCE_MAX));
        rec.append(event(4, "\"a\"", 10));
        let body_text = |seq: u64, pad: usize| {
            format!(
                "id: {seq}\ndata: {{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{{\"eventSeq\":{seq},\"x\":\"{}\"}}}}\n\n",
                "p".repeat(pad)
            )
        };
        let id = RpcId::from_body(
            &Bytes::from_static(b"\"a\""),
            serde_json::from_str::<&serde_json::value::RawValue>("\"a\"").unwrap(),
        );
        let mut body = follow(
            rec.clone(),
            rec.first_cursor(),
            id,
            Duration::from_secs(15),
            never_closing(),
            Arc::default(),
            OnUpstreamFailure::ErrorEvent,
        );
        async fn frame(body: &mut ResponseBody) -> String {
            let f = body.frame().await.expect("frame").unwrap();
            String::from_utf8(f.into_data().unwrap().to_vec()).unwrap()
        }
        // Events 1 and 2, one frame; event 2's id "b" replaced by "a".
        assert_eq!(frame(&mut body).await, body_text(1, 10) + &body_text(2, 10));
        // Event 3: its id line, then its bytes around the spliced id, uncopied.
        assert_eq!(frame(&mut body).await, "id: 3\n");
        let mut big = String::new();
        for _ in 0..3 {
            big.push_str(&frame(&mut body).await);
        }
        assert_eq!(big, body_text(3, COALESCE_MAX)["id: 3\n".len()..]);
        assert_eq!(frame(&mut body).await, body_text(4, 10));
    }

    #[tokio::test(start_paused = true)]
    async fn silent_partner_fails_after_the_idle_timeout() {
        let rec = record();
        let _guard = rec.clone().follow();
        let s = StreamSettings {
            idle_timeout: Duration::from_secs(30),
            ..settings()
        };
        let task = tokio::spawn(record_upstream(open_body(vec![]), rec.clone(), s, ()));
        let t0 = Instant::now();
        task.await.unwrap();
        assert!(t0.elapsed() >= Duration::from_secs(30));
        let (_, end) = read_all(&rec);
        assert_eq!(
            end,
            Some(StreamEnd::Failed {
                reason: "upstream_idle_timeout"
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn upstream_is_kept_while_detached_then_cancelled() {
        let rec = record();
        let guard = rec.clone().follow();
        let permits = Arc::new(());
        let task = tokio::spawn(record_upstream(
            open_body(vec![b"data: {\"result\":{\"eventSeq\":1}}\n\n"]),
            rec.clone(),
            settings(),
            permits.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let t_detach = Instant::now();
        drop(guard); // the Leader went away
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!task.is_finished(), "cancelled before detach_timeout");
        assert_eq!(
            Arc::strong_count(&permits),
            2,
            "the Partner stream holds its permits"
        );
        task.await.unwrap();
        assert_eq!(Arc::strong_count(&permits), 1, "released when it ends");
        assert!(t_detach.elapsed() >= Duration::from_secs(60));
        let (out, end) = read_all(&rec);
        assert_eq!(out.len(), 1);
        assert_eq!(
            end,
            Some(StreamEnd::Failed {
                reason: "detach_timeout"
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_returning_follower_stops_the_detach_clock() {
        let rec = record();
        let guard = rec.clone().follow();
        let task = tokio::spawn(record_upstream(
            open_body(vec![]),
            rec.clone(),
            settings(),
            (),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(guard);
        tokio::time::sleep(Duration::from_secs(30)).await;
        let _back = rec.clone().follow();
        tokio::time::sleep(Duration::from_secs(200)).await;
        assert!(!task.is_finished());
    }

    #[tokio::test]
    async fn oversized_event_ends_the_stream_with_an_error_event() {
        let rec = record();
        let mut body = follow(
            rec.clone(),
            rec.first_cursor(),
            RpcId::null(),
            Duration::from_secs(15),
            never_closing(),
            Arc::default(),
            OnUpstreamFailure::ErrorEvent,
        );
        let big: &'static [u8] = Box::leak(vec![b'x'; 2000].into_boxed_slice());
        record_upstream(
            open_body(vec![
                b"data: {\"result\":{\"eventSeq\":1}}\n\n",
                b"data: ",
                big,
            ]),
            rec.clone(),
            settings(),
            (),
        )
        .await;
        assert!(next_text(&mut body).await.starts_with("id: 1\n"));
        let err = next_text(&mut body).await;
        assert!(err.contains("\"reason\":\"event_too_large\""), "{err}");
        assert!(err.contains("\"lastEventSeq\":1"), "{err}");
        assert!(body.frame().await.is_none());
    }
}
