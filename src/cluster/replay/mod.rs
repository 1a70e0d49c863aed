//! The replay buffer shared through Redis (`[cluster.replay]`), the recording side: the
//! instance reading a Partner's stream keeps it in its own buffer as in `local` mode
//! (its Leaders are served from there first), and also writes it to Redis, so a
//! `re-stream` that reaches another instance is served from Redis (the reading side: `restream`, beside this module).
//!
//! Per stream, under one hash tag (so every script touches one Redis Cluster slot):
//! - `events`: a Redis Stream. An event with `eventSeq` n is entry `(n+1)-0` (Redis
//!   refuses `0-0`); an event without one is `(m)-k`, after the last numbered event's `m`,
//!   k counting up from 1 (relayed live, never replayed); the end is one more such entry
//!   with field `e`. Trimmed to the replay's `max_events_per_stream` exactly, oldest
//!   first, so the last entry removed is known (an approximate `MAXLEN ~` trim removes
//!   whole nodes unseen, which would leave "was the event I need trimmed?" unanswerable
//!   for Partners whose `eventSeq` skips numbers).
//! - `meta`: a hash: `owner` (AIC), `session`, `recorder` (the recording's token: every
//!   write and renewal checks it, so a recorder whose copy was started anew elsewhere
//!   stops instead of mixing into it), `trimmed` (the last entry removed), `end`,
//!   `broken` (the copy has a gap: it is never served again, the re-stream goes to the
//!   Partner).
//! - `recorder`: the recording instance's lease (`PX recorder_lease_ttl`, renewed every
//!   third of it, deleted at the end); a live stream without it is not served.
//! - `followed`: set by an instance following the stream for a Leader (see
//!   the reading side); the recorder asks for it before `detach_timeout` cancels an
//!   unfollowed stream.
//!
//! Every key has a TTL: a live stream's `replay.retention` + `recorder_lease_ttl`
//! (refreshed with the lease), a finished one's `replay.retention`.
//!
//! Writes go through one bounded queue per instance (`queue_events`) to one task that
//! pipelines them (`batch_events` per round trip, `write_timeout`); the request and relay
//! paths never wait for Redis. A stream whose event finds the queue full, whose write
//! failed, or whose copy Redis lost (restarted empty) is marked broken: nothing more of it
//! is written, and its mark reaches Redis with the next lease renewal (until then its copy
//! only lacks the end, and a follower elsewhere stops at the recorder's lease). So a
//! follower elsewhere may get fewer events than exist, never a hole: a gap is always told.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{lock, ms, Cluster};
use crate::sse::replay::{
    Cursor, Entry, FollowedElsewhere, FollowerGuard, Gap, StreamEnd, StreamKey, StreamMeta,
    StreamRecord, NO_SEQ,
};

mod keys;
mod write;

pub(crate) use keys::{entry_fields, EntryId, ReplayKeys};
pub(crate) use write::{lease_loop, write_loop};

/// One stream's copy, as the recording instance keeps track of it.
pub(crate) struct MirrorStream {
    /// Its place in `Mirror::live`.
    reg: u64,
    /// This recording's name in the copy's meta (instance id and a number unique in the
    /// process): a recorder whose copy another one started anew (a re-stream forwarded
    /// elsewhere while it still ran) stops writing instead of mixing into it.
    token: String,
    keys: ReplayKeys,
    /// The replay's `max_events_per_stream` when the stream opened.
    maxlen: usize,
    /// The replay's `retention` when the stream opened.
    retention: Duration,
    /// The id the next entry without `eventSeq` builds on.
    last: Mutex<EntryId>,
    /// The copy has a gap: nothing more is written.
    broken: AtomicBool,
    /// Why (`None` while whole), for the mark written to Redis.
    why: Mutex<Option<&'static str>>,
    /// The start was written: the lease exists, renew it.
    opened: AtomicBool,
    /// The end was written: the lease is gone, nothing to renew.
    closed: AtomicBool,
}

enum Op {
    Open {
        stream: Arc<MirrorStream>,
        owner: String,
        session: String,
    },
    Append {
        stream: Arc<MirrorStream>,
        id: EntryId,
        entry: Entry,
    },
    End {
        stream: Arc<MirrorStream>,
        id: EntryId,
        reason: &'static str,
    },
}

impl Op {
    fn stream(&self) -> &Arc<MirrorStream> {
        match self {
            Op::Open { stream, .. } | Op::Append { stream, .. } | Op::End { stream, .. } => stream,
        }
    }
}

/// This instance's writes to Redis: the queue, and the streams whose lease it renews.
pub(crate) struct Mirror {
    tx: mpsc::Sender<Op>,
    rx: Mutex<Option<mpsc::Receiver<Op>>>,
    live: Mutex<HashMap<u64, Weak<MirrorStream>>>,
    next: AtomicU64,
    /// Ops queued, and ops the writer has handled (written, or dropped with their
    /// stream's copy): the queue is flushed when the second catches up with the first.
    queued: AtomicU64,
    handled: AtomicU64,
    /// Recordings whose end is not queued yet: the flush at shutdown waits for their
    /// ends (the closing signal makes them) before it counts the queue.
    unfinished: AtomicU64,
}

impl Mirror {
    pub(crate) fn new(queue: usize) -> Mirror {
        let (tx, rx) = mpsc::channel(queue);
        Mirror {
            tx,
            rx: Mutex::new(Some(rx)),
            live: Mutex::default(),
            next: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            unfinished: AtomicU64::new(0),
        }
    }

    fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

impl Cluster {
    /// Whether recorded streams are written to Redis.
    pub(crate) fn shares_replay(&self) -> bool {
        self.settings.replay.enabled
    }

    /// Marks `stream`'s copy broken (once), counting it under `reason`; the lease loop
    /// writes the mark.
    fn break_copy(&self, stream: &Arc<MirrorStream>, reason: &'static str) {
        if stream.broken.swap(true, Ordering::AcqRel) {
            return;
        }
        *lock(&stream.why) = Some(reason);
        tracing::debug!(key = %stream.keys.events, reason, "replay copy in Redis has a gap");
        self.metrics
            .replay_gaps
            .get_or_create(&crate::metrics::ReasonLabels { reason })
            .inc();
        lock(&self.mirror.live).insert(stream.reg, Arc::downgrade(stream));
    }

    /// Waits (at most `within`) until every recording has queued its end and the write
    /// queue is empty, so the ends of the streams closed at shutdown reach Redis.
    ///
    /// Flushed means handled, not merely taken off the queue: a batch the writer holds
    /// is waited for too (stopping the writer then would cut its round trip).
    pub(crate) async fn replay_flushed(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        // First the recordings' ends: a recorder task reacts to the closing signal on its
        // own worker, possibly after the listener returned; counting the queue before its
        // end is queued would stop the writer with the end unwritten (the copy would then
        // lose its recorder unannounced).
        while self.mirror.unfinished.load(Ordering::Acquire) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let queued = self.mirror.queued.load(Ordering::Acquire);
        while self.mirror.handled.load(Ordering::Acquire) < queued
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn enqueue(&self, op: Op) {
        let stream = op.stream().clone();
        if stream.broken.load(Ordering::Acquire) {
            return;
        }
        match self.mirror.tx.try_send(op) {
            Ok(()) => {
                self.mirror.queued.fetch_add(1, Ordering::AcqRel);
            }
            Err(mpsc::error::TrySendError::Full(_)) => self.break_copy(&stream, "queue_full"),
            Err(mpsc::error::TrySendError::Closed(_)) => self.break_copy(&stream, "write_failed"),
        }
        self.metrics
            .replay_write_queue_depth
            .set(self.mirror.depth() as i64);
    }
}

/// A record of this instance's buffer whose events are also written to Redis.
pub(crate) struct Mirrored {
    inner: Arc<dyn StreamRecord>,
    stream: Arc<MirrorStream>,
    cluster: Arc<Cluster>,
    /// Its end was queued (or it was dropped without one): no longer counted in
    /// `Mirror::unfinished`.
    done: AtomicBool,
}

impl Mirrored {
    /// Leaves `Mirror::unfinished`, once.
    fn done(&self) {
        if !self.done.swap(true, Ordering::AcqRel) {
            self.cluster
                .mirror
                .unfinished
                .fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Mirrored {
    /// A recording dropped without its end (its task cancelled) has no end to wait for.
    fn drop(&mut self) {
        self.done();
    }
}

/// Wraps a record just opened for `key`, so its events are written to Redis too.
pub(crate) fn mirrored(
    cluster: &Arc<Cluster>,
    key: &StreamKey,
    inner: Arc<dyn StreamRecord>,
    limits: &crate::sse::memory::ReplayLimits,
) -> Arc<dyn StreamRecord> {
    let reg = cluster.mirror.next.fetch_add(1, Ordering::Relaxed);
    static RECORDINGS: AtomicU64 = AtomicU64::new(0);
    let n = RECORDINGS.fetch_add(1, Ordering::Relaxed);
    let stream = Arc::new(MirrorStream {
        reg,
        token: cluster.holder(n),
        keys: ReplayKeys::new(cluster, key),
        maxlen: limits.max_events_per_stream,
        retention: limits.retention,
        last: Mutex::new(EntryId(0, 0)),
        broken: AtomicBool::new(false),
        why: Mutex::new(None),
        opened: AtomicBool::new(false),
        closed: AtomicBool::new(false),
    });
    let meta = inner.meta();
    let op = Op::Open {
        stream: stream.clone(),
        owner: meta.owner.to_string(),
        session: meta.session_id.clone().unwrap_or_default(),
    };
    lock(&cluster.mirror.live).insert(reg, Arc::downgrade(&stream));
    cluster.enqueue(op);
    cluster.mirror.unfinished.fetch_add(1, Ordering::AcqRel);
    Arc::new(Mirrored {
        inner,
        stream,
        cluster: cluster.clone(),
        done: AtomicBool::new(false),
    })
}

impl MirrorStream {
    /// The id of the next entry: `seq`'s own, or the next one after the last.
    fn next_id(&self, seq: u64) -> EntryId {
        let mut last = lock(&self.last);
        *last = match seq {
            NO_SEQ => EntryId(last.0, last.1 + 1),
            s => EntryId::of_seq(s),
        };
        *last
    }
}

impl StreamRecord for Mirrored {
    fn meta(&self) -> &StreamMeta {
        self.inner.meta()
    }

    fn append(&self, entry: Entry) {
        self.append_all(&mut std::iter::once(entry));
    }

    fn append_all(&self, entries: &mut dyn Iterator<Item = Entry>) {
        // This instance's followers first (woken once for the read), then the copy.
        let entries: Vec<Entry> = entries.collect();
        self.inner.append_all(&mut entries.iter().cloned());
        for entry in entries {
            if self.stream.broken.load(Ordering::Acquire) {
                return;
            }
            let id = self.stream.next_id(entry.seq);
            self.cluster.enqueue(Op::Append {
                stream: self.stream.clone(),
                id,
                entry,
            });
        }
    }

    fn finish(&self, end: StreamEnd) {
        self.inner.finish(end);
        let reason = match end {
            StreamEnd::Complete => "complete",
            StreamEnd::Failed { reason } => reason,
        };
        let id = self.stream.next_id(NO_SEQ);
        self.cluster.enqueue(Op::End {
            stream: self.stream.clone(),
            id,
            reason,
        });
        self.done();
    }

    fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }

    fn first_cursor(&self) -> Cursor {
        self.inner.first_cursor()
    }

    fn cursor_after(&self, after: Option<u64>) -> Result<Cursor, Gap> {
        self.inner.cursor_after(after)
    }

    fn read(&self, cursor: &mut Cursor, out: &mut Vec<Entry>) -> Result<Option<StreamEnd>, Gap> {
        self.inner.read(cursor, out)
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes()
    }

    fn followers(&self) -> tokio::sync::watch::Receiver<usize> {
        self.inner.followers()
    }

    fn follow(self: Arc<Self>) -> FollowerGuard {
        self.inner.clone().follow()
    }

    fn unfollow(&self) {
        self.inner.unfollow();
    }

    fn followed_elsewhere(&self) -> Option<FollowedElsewhere> {
        let (cluster, key) = (self.cluster.clone(), self.stream.keys.followed.clone());
        Some(Box::pin(async move {
            let found = cluster
                .call("replay_followed", |mut c| async move {
                    redis::cmd("EXISTS")
                        .arg(key)
                        .query_async::<i64>(&mut c)
                        .await
                })
                .await;
            matches!(found, Ok(1))
        }))
    }
}

impl MirrorStream {
    /// The TTL of a live stream's keys.
    fn live_ttl(&self, cluster: &Cluster) -> u64 {
        ms(self.retention + cluster.settings.replay.recorder_lease_ttl)
    }
}

#[cfg(test)]
mod tests;
