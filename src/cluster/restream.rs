//! The replay buffer shared through Redis, the reading side: a `re-stream` for a stream
//! this instance does not hold, served from the copy the recording instance writes
//! (`super::replay`).
//!
//! [`find`] reads the copy's meta hash and whether its recorder's lease is held; the
//! caller checks owner and session as for its own buffer, then [`RemoteCopy::servable`]:
//! a copy marked broken, one trimmed past the Leader's `lastEventSeq`, or a live one
//! whose recorder's lease is gone (it died, or lost Redis) is not served; the re-stream
//! goes to the Partner as before. Otherwise [`follow`] reads the history (`XRANGE` after
//! `lastEventSeq`, page by page), then follows live (`XREAD BLOCK` from the last entry it
//! read, so nothing falls between the two), on a Redis connection of its own (a blocked
//! read would hold up every other command on the shared one), at most
//! `max_remote_followers` at once. Each round trip also renews the `followed` key the
//! recorder checks before `detach_timeout`, and reads the meta after the entries: a trim
//! past what was read, a broken mark, or a lost recorder ends the Leader's stream with an
//! error event (the Leader re-streams from its last `eventSeq`), never a silent hole.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::Value;
use tokio::time::Instant;

use super::replay::{entry_fields, EntryId, ReplayKeys};
use super::{Cluster, ClusterError};
use crate::body::ResponseBody;
use crate::identity::Aic;
use crate::sse::emit::Emitter;
use crate::sse::follow::{self, Feed, Listener};
use crate::sse::replay::{Entry, StreamEnd, StreamKey, NO_SEQ};
use crate::sse::source::{Found, ReplaySource, Resume, Unavailable};
use futures_util::future::BoxFuture;

/// What Redis holds of a stream recorded elsewhere.
#[derive(Debug)]
struct RemoteCopy {
    keys: ReplayKeys,
    /// The AIC that started it.
    owner: String,
    /// The `sessionId` it was started with.
    session: Option<String>,
    trimmed: Option<EntryId>,
    broken: bool,
    /// The end was written.
    ended: bool,
    leased: bool,
}

/// The copy of `key`, if Redis has one.
async fn find(cluster: &Arc<Cluster>, key: &StreamKey) -> Result<Option<RemoteCopy>, ClusterError> {
    let keys = ReplayKeys::new(cluster, key);
    let (meta, recorder) = (keys.meta.clone(), keys.recorder.clone());
    let (fields, leased): (HashMap<String, String>, i64) = cluster
        .call("replay_find", |mut c| async move {
            redis::pipe()
                .cmd("HGETALL")
                .arg(meta)
                .cmd("EXISTS")
                .arg(recorder)
                .query_async(&mut c)
                .await
        })
        .await?;
    let Some(owner) = fields.get("owner") else {
        return Ok(None);
    };
    Ok(Some(RemoteCopy {
        owner: owner.clone(),
        session: fields.get("session").cloned(),
        trimmed: fields
            .get("trimmed")
            .and_then(|t| EntryId::parse(t.as_bytes())),
        broken: fields.contains_key("broken"),
        ended: fields.contains_key("end"),
        leased: leased == 1,
        keys,
    }))
}

impl RemoteCopy {
    /// Whether it can serve every event after `after` (all when `None`); else why not.
    fn servable(&self, after: Option<u64>) -> Result<(), &'static str> {
        if self.broken {
            return Err("gap");
        }
        if trimmed_past(self.trimmed, after.map(EntryId::of_seq), true) {
            return Err("evicted");
        }
        if !self.ended && !self.leased {
            return Err("recorder_gone");
        }
        Ok(())
    }
}

/// Whether the trim removed an entry a reader that read through `read` still needs
/// (`history`: entries without `eventSeq` right after it are not needed).
fn trimmed_past(trimmed: Option<EntryId>, read: Option<EntryId>, history: bool) -> bool {
    match (trimmed, read) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(t), Some(r)) => t > r && !(history && t.0 == r.0),
    }
}

/// The copies in Redis as a source of re-streams.
pub(crate) struct Shared<'c>(pub &'c Arc<Cluster>);

impl ReplaySource for Shared<'_> {
    fn find<'a>(&'a self, key: &'a StreamKey) -> BoxFuture<'a, Result<Option<Found>, Unavailable>> {
        Box::pin(async move {
            // Redis down or slow: forwarded, as with no copy.
            let Some(copy) = find(self.0, key).await.map_err(|_| Unavailable)? else {
                return Ok(None);
            };
            let owner = Aic::parse(&copy.owner).ok();
            let (session, ended) = (copy.session.clone(), copy.ended);
            let stream = Box::new(CopyStream {
                cluster: self.0.clone(),
                copy,
            });
            Ok(Some(Found::new(owner, session, ended, "cluster", stream)))
        })
    }
}

/// A copy found in Redis, to be followed.
struct CopyStream {
    cluster: Arc<Cluster>,
    copy: RemoteCopy,
}

impl Resume for CopyStream {
    fn resume(
        self: Box<Self>,
        after: Option<u64>,
        listener: Listener,
    ) -> BoxFuture<'static, Result<ResponseBody, &'static str>> {
        Box::pin(async move {
            self.copy.servable(after)?;
            let slot = reserve(&self.cluster).await.ok_or("no_follower_slot")?;
            Ok(follow(self.cluster, self.copy, slot, after, listener))
        })
    }
}

/// A place to follow a copy from: one of `max_remote_followers`, and its connection.
struct RemoteSlot {
    conn: super::Conn,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Takes a follower's place and connects it; `None` when all are taken or Redis cannot
/// be reached within `connect_timeout` (the re-stream then goes to the Partner).
async fn reserve(cluster: &Arc<Cluster>) -> Option<RemoteSlot> {
    let permit = cluster.remote_followers.clone().try_acquire_owned().ok()?;
    let connecting = cluster.link.dedicated();
    match tokio::time::timeout(cluster.settings.connect_timeout, connecting).await {
        Ok(Ok(conn)) => Some(RemoteSlot {
            conn,
            _permit: permit,
        }),
        failed => {
            let why = failed.map_or_else(
                |_| "timed out".to_owned(),
                |r| r.err().map(|e| e.to_string()).unwrap_or_default(),
            );
            tracing::debug!(why, "no connection for a follower from Redis");
            cluster.count_error("replay_read");
            None
        }
    }
}

/// The copy in Redis as a follower's feed: round trips on the follower's own
/// connection, history first (`XRANGE`), then live (`XREAD BLOCK`).
struct RedisFeed {
    cluster: Arc<Cluster>,
    keys: ReplayKeys,
    slot: RemoteSlot,
    /// The last entry read (`None`: none yet, from the very start).
    read: Option<EntryId>,
    /// Reading what was there when the Leader came (entries without `eventSeq` skipped);
    /// then following live.
    history: bool,
    quiet_since: Instant,
}

/// A response body following `copy` for a Leader, from after `after`.
fn follow(
    cluster: Arc<Cluster>,
    copy: RemoteCopy,
    slot: RemoteSlot,
    after: Option<u64>,
    listener: Listener,
) -> ResponseBody {
    let feed = RedisFeed {
        cluster,
        keys: copy.keys,
        slot,
        read: after.map(EntryId::of_seq),
        history: true,
        quiet_since: Instant::now(),
    };
    follow::body(feed, listener)
}

impl Feed for RedisFeed {
    fn take_ready(&mut self, _out: &mut Emitter) {
        // Nothing is here before a round trip.
    }

    async fn wait<'a>(&'a mut self, out: &'a mut Emitter, keepalive: Duration) {
        let page = fetch(
            &self.cluster,
            &self.keys,
            &mut self.slot.conn,
            self.read,
            self.history,
            keepalive,
        )
        .await;
        match page {
            Ok(page) => self.take(page, out, keepalive),
            Err(e) => {
                tracing::debug!(error = %e, key = %self.keys.events, "reading a stream from Redis failed");
                self.cluster.count_error("replay_read");
                out.fail("replay_unavailable", None, true);
            }
        }
    }
}

/// One round trip's answer.
struct Page {
    entries: Vec<(EntryId, u8, Bytes, u32, u32)>,
    trimmed: Option<EntryId>,
    broken: bool,
    ended: bool,
    leased: bool,
}

/// One round trip: renew `followed`, read the next entries (history: a page of
/// `XRANGE`; live: `XREAD BLOCK`), then the meta.
async fn fetch(
    cluster: &Cluster,
    keys: &ReplayKeys,
    conn: &mut super::Conn,
    read: Option<EntryId>,
    history: bool,
    keepalive: Duration,
) -> Result<Page, ClusterError> {
    {
        let rs = cluster.settings.replay;
        let block = rs.read_block.min(keepalive);
        // The recorder checks this key before cancelling an unfollowed stream; renewed
        // every round trip, each at most `read_block` apart.
        let followed_ttl = 3 * rs.read_block + rs.write_timeout;
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&keys.followed)
            .arg(&cluster.settings.instance_id)
            .arg("PX")
            .arg(super::ms(followed_ttl))
            .ignore();
        if history {
            let start = match read {
                Some(r) => format!("({r}"),
                None => "-".to_owned(),
            };
            pipe.cmd("XRANGE")
                .arg(&keys.events)
                .arg(start)
                .arg("+")
                .arg("COUNT")
                .arg(rs.batch_events);
        } else {
            pipe.cmd("XREAD")
                .arg("COUNT")
                .arg(rs.batch_events)
                .arg("BLOCK")
                .arg(super::ms(block))
                .arg("STREAMS")
                .arg(&keys.events)
                .arg(read.map_or_else(|| "0-0".to_owned(), |r| r.to_string()));
        }
        pipe.cmd("HMGET")
            .arg(&keys.meta)
            .arg("trimmed")
            .arg("broken")
            .arg("end")
            .cmd("EXISTS")
            .arg(&keys.recorder);
        let limit = block + rs.write_timeout;
        let (entries, meta, leased): (Value, Vec<Option<String>>, i64) =
            match tokio::time::timeout(limit, pipe.query_async(conn)).await {
                Ok(r) => r?,
                Err(_) => return Err(ClusterError::Timeout(limit)),
            };
        let entries = if history {
            parse_entries(&entries)
        } else {
            xread_entries(&entries)
        };
        let field = |i: usize| meta.get(i).cloned().flatten();
        Ok(Page {
            entries,
            trimmed: field(0).and_then(|t| EntryId::parse(t.as_bytes())),
            broken: field(1).is_some(),
            ended: field(2).is_some(),
            leased: leased == 1,
        })
    }
}

impl RedisFeed {
    /// Sends what a round trip read, and ends the stream where the copy says so.
    fn take(&mut self, page: Page, out: &mut Emitter, keepalive: Duration) {
        let full = page.entries.len() >= self.cluster.settings.replay.batch_events;
        let mut end = None;
        for (id, kind, data, id_start, id_len) in page.entries {
            self.read = Some(id);
            match kind {
                b'e' => end = Some(end_of(&data)),
                _ => {
                    let seq = id.seq();
                    if seq == NO_SEQ && self.history {
                        continue; // live before this Leader came
                    }
                    out.push_event(&Entry {
                        seq,
                        bytes: data,
                        id_start,
                        id_len,
                    });
                    self.quiet_since = Instant::now();
                }
            }
        }
        out.flush();
        if let Some(end) = end {
            out.ended(end);
            return;
        }
        let read = self.read;
        if trimmed_past(page.trimmed, read, self.history) {
            out.fail("events_evicted", None, true);
            return;
        }
        if page.broken {
            out.fail("replay_gap", None, true);
            return;
        }
        if !page.ended && !page.leased {
            // The recorder died or lost Redis: its stream is not known to go on.
            out.fail("recorder_lost", None, true);
            return;
        }
        if self.history && !full {
            self.history = false;
        }
        if self.quiet_since.elapsed() >= keepalive {
            out.keepalive();
            self.quiet_since = Instant::now();
        }
    }
}

/// A recorded end, by its reason.
fn end_of(reason: &[u8]) -> StreamEnd {
    const KNOWN: [&str; 7] = [
        "upstream_closed_early",
        "upstream_reset",
        "upstream_idle_timeout",
        "detach_timeout",
        "event_too_large",
        "record_dropped",
        "shutting_down",
    ];
    if reason == b"complete" {
        return StreamEnd::Complete;
    }
    let reason = KNOWN
        .into_iter()
        .find(|k| k.as_bytes() == reason)
        .unwrap_or("upstream_failed");
    StreamEnd::Failed { reason }
}

/// `XRANGE`'s answer: `[[id, [field, value, ...]], ...]`.
fn parse_entries(v: &Value) -> Vec<(EntryId, u8, Bytes, u32, u32)> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else {
                return None;
            };
            let [Value::BulkString(id), Value::Array(fields)] = pair.as_slice() else {
                return None;
            };
            let id = EntryId::parse(id)?;
            let (kind, data, s, l) = entry_fields(fields)?;
            Some((id, kind, data, s, l))
        })
        .collect()
}

/// `XREAD`'s answer for one stream: nil (nothing within the block), or
/// `[[key, entries]]` (a map of key to entries in RESP3).
fn xread_entries(v: &Value) -> Vec<(EntryId, u8, Bytes, u32, u32)> {
    match v {
        Value::Array(streams) => streams
            .iter()
            .find_map(|s| match s {
                Value::Array(kv) if kv.len() == 2 => Some(parse_entries(&kv[1])),
                _ => None,
            })
            .unwrap_or_default(),
        Value::Map(streams) => streams
            .first()
            .map(|(_, entries)| parse_entries(entries))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_counts_only_past_what_was_read() {
        let id = |ms, s| Some(EntryId(ms, s));
        // Nothing trimmed: always servable.
        assert!(!trimmed_past(None, None, true));
        // Something trimmed, the Leader wants everything: a gap.
        assert!(trimmed_past(id(1, 0), None, true));
        // Read through eventSeq 4 (entry 5-0): the trim of 5-0 itself is no loss, of 6-0 is.
        assert!(!trimmed_past(id(5, 0), id(5, 0), false));
        assert!(trimmed_past(id(6, 0), id(5, 0), false));
        // An unnumbered entry right after what was read: history does not need it, a
        // live reader did.
        assert!(!trimmed_past(id(5, 2), id(5, 0), true));
        assert!(trimmed_past(id(5, 2), id(5, 0), false));
    }

    #[test]
    fn entry_ids_map_to_event_seqs_and_back() {
        assert_eq!(EntryId::of_seq(0), EntryId(1, 0));
        assert_eq!(EntryId(1, 0).seq(), 0);
        assert_eq!(EntryId(7, 3).seq(), NO_SEQ);
        assert_eq!(EntryId::of_seq(u64::MAX - 1).seq(), u64::MAX - 1);
        assert_eq!(
            EntryId::parse(b"18446744073709551615-2"),
            Some(EntryId(u64::MAX, 2))
        );
        assert_eq!(EntryId::parse(b"5"), None);
        assert_eq!(end_of(b"complete"), StreamEnd::Complete);
        assert_eq!(
            end_of(b"detach_timeout"),
            StreamEnd::Failed {
                reason: "detach_timeout"
            }
        );
        assert_eq!(
            end_of(b"something new"),
            StreamEnd::Failed {
                reason: "upstream_failed"
            }
        );
    }
}
