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
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use redis::Value;
use tokio::sync::mpsc;

use super::{lock, ms, Cluster};
use crate::sse::replay::{
    Cursor, Entry, FollowedElsewhere, FollowerGuard, Gap, StreamEnd, StreamKey, StreamMeta,
    StreamRecord, NO_SEQ,
};

/// `KEYS` events, meta, recorder; `ARGV` owner, session (`""`: none), recorder token,
/// lease ms, TTL ms. Starts a stream's copy (replacing an earlier one).
const OPEN: &str = r#"
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'recorder', ARGV[3])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[2], 'session', ARGV[2]) end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
"#;

/// `KEYS` events, meta, recorder; `ARGV` entries kept, live TTL ms, finished TTL ms,
/// then per entry: id, kind (`d` event, `e` end), data (event bytes or end reason), id
/// range (`start:len`), after the recorder token (`ARGV[4]`). All of one stream's entries
/// of a write batch in one call. 1 written; -1 the copy is gone (Redis lost it); -2 it is
/// marked broken; -3 an id is not above the last one (an `eventSeq` out of order: the
/// copy is marked broken); -4 another recorder started the task's copy anew.
const APPEND: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if redis.call('HGET', KEYS[2], 'recorder') ~= ARGV[4] then return -4 end
if redis.call('HEXISTS', KEYS[2], 'broken') == 1 then return -2 end
local ttl = ARGV[2]
for i = 5, #ARGV, 4 do
  local r = redis.pcall('XADD', KEYS[1], ARGV[i], ARGV[i + 1], ARGV[i + 2], 'i', ARGV[i + 3])
  if type(r) == 'table' and r.err then
    redis.call('HSET', KEYS[2], 'broken', 'order')
    return -3
  end
  if ARGV[i + 1] == 'e' then
    redis.call('HSET', KEYS[2], 'end', ARGV[i + 2])
    redis.call('DEL', KEYS[3])
    ttl = ARGV[3]
  end
end
local over = redis.call('XLEN', KEYS[1]) - tonumber(ARGV[1])
if over > 0 then
  local gone = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', over)
  local last = gone[#gone][1]
  local ms, sq = string.match(last, '^(%d+)-(%d+)$')
  redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. string.format('%d', tonumber(sq) + 1))
  redis.call('HSET', KEYS[2], 'trimmed', last)
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
"#;

/// `KEYS` events, meta, recorder; `ARGV` recorder token, lease ms, TTL ms. 1 renewed; 2
/// it ended meanwhile; 3 another recorder started it anew; 0 the copy is gone or broken.
const RENEW: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if redis.call('HGET', KEYS[2], 'recorder') ~= ARGV[1] then return 3 end
if redis.call('HEXISTS', KEYS[2], 'broken') == 1 then return 0 end
if redis.call('HEXISTS', KEYS[2], 'end') == 1 then return 2 end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"#;

/// `KEYS` meta, recorder; `ARGV` reason, recorder token. Marks a copy broken (if Redis
/// still has it and it is still this recorder's).
const BREAK: &str = r#"
if redis.call('HGET', KEYS[1], 'recorder') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'broken', ARGV[1])
  redis.call('DEL', KEYS[2])
end
return 1
"#;

static OPEN_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(OPEN));
static APPEND_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(APPEND));
static RENEW_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RENEW));
static BREAK_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(BREAK));

/// A stream's keys in Redis.
#[derive(Debug, Clone)]
pub(crate) struct ReplayKeys {
    pub events: String,
    pub meta: String,
    pub recorder: String,
    pub followed: String,
}

impl ReplayKeys {
    pub(crate) fn new(cluster: &Cluster, key: &StreamKey) -> ReplayKeys {
        // The Partner name's length first, so (`a:b`, `c`) and (`a`, `b:c`) differ.
        let tag = format!(
            "replay:{}:{}:{}",
            key.partner.len(),
            key.partner,
            key.task_id
        );
        ReplayKeys {
            events: cluster.key(&tag, "events"),
            meta: cluster.key(&tag, "meta"),
            recorder: cluster.key(&tag, "recorder"),
            followed: cluster.key(&tag, "followed"),
        }
    }

    /// `EVALSHA` of `script` on the copy's three keys (events, meta, recorder), for the
    /// script's `ARGV` to follow.
    fn on_copy(&self, script: &redis::Script) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(3)
            .arg(&self.events)
            .arg(&self.meta)
            .arg(&self.recorder);
        cmd
    }
}

/// An entry id of the copy: `(ms, seq)` as Redis writes it, `ms-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EntryId(pub u64, pub u64);

impl EntryId {
    /// The id of an event numbered `seq`.
    pub(crate) fn of_seq(seq: u64) -> EntryId {
        EntryId(seq + 1, 0)
    }

    /// The `eventSeq` of the entry, or `NO_SEQ`.
    pub(crate) fn seq(self) -> u64 {
        match self {
            EntryId(ms, 0) => ms - 1,
            _ => NO_SEQ,
        }
    }

    pub(crate) fn parse(s: &[u8]) -> Option<EntryId> {
        let s = std::str::from_utf8(s).ok()?;
        let (ms, seq) = s.split_once('-')?;
        Some(EntryId(ms.parse().ok()?, seq.parse().ok()?))
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

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
}

impl Mirror {
    pub(crate) fn new(queue: usize) -> Mirror {
        let (tx, rx) = mpsc::channel(queue);
        Mirror {
            tx,
            rx: Mutex::new(Some(rx)),
            live: Mutex::default(),
            next: AtomicU64::new(0),
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

    /// Waits (at most `within`) until the write queue is empty, so the ends of the
    /// streams closed at shutdown reach Redis.
    pub(crate) async fn replay_flushed(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.mirror.depth() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn enqueue(&self, op: Op) {
        let stream = op.stream().clone();
        if stream.broken.load(Ordering::Acquire) {
            return;
        }
        match self.mirror.tx.try_send(op) {
            Ok(()) => {}
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
    Arc::new(Mirrored {
        inner,
        stream,
        cluster: cluster.clone(),
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

/// Writes the queue to Redis, one pipelined batch at a time, until the queue closes.
pub(crate) async fn write_loop(cluster: Arc<Cluster>) {
    let Some(mut rx) = lock(&cluster.mirror.rx).take() else {
        return;
    };
    let n = cluster.settings.replay.batch_events;
    let mut batch = Vec::with_capacity(n);
    while rx.recv_many(&mut batch, n).await > 0 {
        cluster
            .metrics
            .replay_write_queue_depth
            .set(cluster.mirror.depth() as i64);
        write(&cluster, std::mem::take(&mut batch)).await;
        batch.reserve(n);
    }
}

/// What one command of a write batch does for its stream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Does {
    Open,
    Append { ends: bool },
}

/// One script call: a stream's start, or all its entries of the batch, in order.
#[derive(Clone)]
struct Command {
    stream: Arc<MirrorStream>,
    does: Does,
    cmd: redis::Cmd,
}

/// The batch as script calls: per stream, its start (if in the batch), then one call for
/// all its entries (per stream order kept; streams are independent of each other). One
/// call per stream instead of one per event keeps Redis's per-script cost off each event.
fn commands(cluster: &Cluster, ops: Vec<Op>) -> Vec<Command> {
    let mut out: Vec<Command> = Vec::new();
    for op in ops {
        let stream = op.stream().clone();
        if stream.broken.load(Ordering::Acquire) {
            continue;
        }
        let k = &stream.keys;
        let (id, kind, data, range): (EntryId, &str, &[u8], String) = match &op {
            Op::Open { owner, session, .. } => {
                let mut cmd = k.on_copy(&OPEN_SCRIPT);
                cmd.arg(owner)
                    .arg(session)
                    .arg(&stream.token)
                    .arg(ms(cluster.settings.replay.recorder_lease_ttl))
                    .arg(stream.live_ttl(cluster));
                out.push(Command {
                    stream,
                    does: Does::Open,
                    cmd,
                });
                continue;
            }
            Op::Append { id, entry, .. } => (
                *id,
                "d",
                entry.bytes.as_ref(),
                format!("{}:{}", entry.id_start, entry.id_len),
            ),
            Op::End { id, reason, .. } => (*id, "e", reason.as_bytes(), "0:0".to_owned()),
        };
        let last = out
            .iter_mut()
            .rev()
            .find(|c| Arc::ptr_eq(&c.stream, &stream));
        let command = match last {
            Some(c) if matches!(c.does, Does::Append { .. }) => c,
            _ => {
                let mut cmd = k.on_copy(&APPEND_SCRIPT);
                cmd.arg(stream.maxlen)
                    .arg(stream.live_ttl(cluster))
                    .arg(ms(stream.retention))
                    .arg(&stream.token);
                out.push(Command {
                    stream: stream.clone(),
                    does: Does::Append { ends: false },
                    cmd,
                });
                out.last_mut().expect("just pushed")
            }
        };
        command
            .cmd
            .arg(id.to_string())
            .arg(kind)
            .arg(data)
            .arg(range);
        if kind == "e" {
            command.does = Does::Append { ends: true };
        }
    }
    out
}

/// Writes one batch; streams whose write failed are marked broken. Scripts Redis does not
/// know (it restarted) are loaded and only the calls it refused for that are sent again.
async fn write(cluster: &Arc<Cluster>, ops: Vec<Op>) {
    let mut cmds = commands(cluster, ops);
    for attempt in 0..2 {
        if cmds.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for c in &cmds {
            pipe.add_command(c.cmd.clone());
        }
        let timeout = cluster.settings.replay.write_timeout;
        let sent = cluster
            .call_within("replay_write", timeout, |mut c| async move {
                pipe.query_async::<Vec<redis::RedisResult<i64>>>(&mut c)
                    .await
            })
            .await;
        let results = match sent {
            Ok(r) if r.len() == cmds.len() => r,
            _ => {
                for c in &cmds {
                    cluster.break_copy(&c.stream, "write_failed");
                }
                return;
            }
        };
        let mut unknown_script = Vec::new();
        for (c, result) in cmds.into_iter().zip(results) {
            match result {
                Ok(1) => match c.does {
                    Does::Open => c.stream.opened.store(true, Ordering::Release),
                    Does::Append { ends: true } => c.stream.closed.store(true, Ordering::Release),
                    Does::Append { ends: false } => {}
                },
                Ok(-1) => cluster.break_copy(&c.stream, "lost"),
                Ok(-3) => cluster.break_copy(&c.stream, "order"),
                Ok(-4) => replaced(&c.stream),
                // Already marked in Redis.
                Ok(_) => c.stream.broken.store(true, Ordering::Release),
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    unknown_script.push(c)
                }
                Err(_) => cluster.break_copy(&c.stream, "write_failed"),
            }
        }
        if unknown_script.is_empty() {
            return;
        }
        if attempt == 0 && load_scripts(cluster).await.is_ok() {
            cmds = unknown_script;
            continue;
        }
        for c in &unknown_script {
            cluster.break_copy(&c.stream, "write_failed");
        }
        return;
    }
}

/// Another recorder started this task's copy anew: this one stops writing and renewing,
/// and leaves that copy alone (no gap: the copy is whole, just not this recording's).
fn replaced(stream: &MirrorStream) {
    tracing::debug!(key = %stream.keys.events, "replay copy started anew by another recorder: no longer written here");
    stream.broken.store(true, Ordering::Release);
    stream.closed.store(true, Ordering::Release);
}

async fn load_scripts(cluster: &Cluster) -> Result<(), super::ClusterError> {
    let timeout = cluster.settings.replay.write_timeout;
    cluster
        .call_within("replay_write", timeout, |mut c| async move {
            let mut pipe = redis::pipe();
            for text in [OPEN, APPEND, RENEW, BREAK] {
                pipe.cmd("SCRIPT").arg("LOAD").arg(text);
            }
            pipe.query_async::<Vec<Value>>(&mut c).await.map(|_| ())
        })
        .await
}

/// Renews the recorder's lease of every live copy, every third of
/// `cluster.replay.recorder_lease_ttl`, and writes the broken marks.
pub(crate) async fn lease_loop(cluster: Arc<Cluster>) {
    let every = (cluster.settings.replay.recorder_lease_ttl / 3).max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        renew(&cluster).await;
    }
}

async fn renew(cluster: &Arc<Cluster>) {
    let streams: Vec<(u64, Arc<MirrorStream>)> = {
        let mut live = lock(&cluster.mirror.live);
        live.retain(|_, s| {
            s.upgrade()
                .is_some_and(|s| !s.closed.load(Ordering::Acquire))
        });
        live.iter()
            .filter_map(|(id, s)| Some((*id, s.upgrade()?)))
            // A start still queued has no lease yet (a broken one is marked regardless).
            .filter(|(_, s)| s.opened.load(Ordering::Acquire) || s.broken.load(Ordering::Acquire))
            .collect()
    };
    let lease = ms(cluster.settings.replay.recorder_lease_ttl);
    for chunk in streams.chunks(cluster.settings.replay.batch_events) {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (_, s) in chunk {
            let k = &s.keys;
            let mut cmd = redis::cmd("EVALSHA");
            match *lock(&s.why) {
                Some(reason) => cmd
                    .arg(BREAK_SCRIPT.get_hash())
                    .arg(2)
                    .arg(&k.meta)
                    .arg(&k.recorder)
                    .arg(reason)
                    .arg(&s.token),
                None => cmd
                    .arg(RENEW_SCRIPT.get_hash())
                    .arg(3)
                    .arg(&k.events)
                    .arg(&k.meta)
                    .arg(&k.recorder)
                    .arg(&s.token)
                    .arg(lease)
                    .arg(s.live_ttl(cluster)),
            };
            pipe.add_command(cmd);
        }
        let timeout = cluster.settings.replay.write_timeout;
        let Ok(results) = cluster
            .call_within("replay_lease", timeout, |mut c| async move {
                pipe.query_async::<Vec<redis::RedisResult<i64>>>(&mut c)
                    .await
            })
            .await
        else {
            continue;
        };
        if results
            .iter()
            .any(|r| matches!(r, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)))
        {
            // Loaded now; renewed at the next tick, well within the lease.
            let _ = load_scripts(cluster).await;
            continue;
        }
        let mut live = lock(&cluster.mirror.live);
        for ((id, s), r) in chunk.iter().zip(results) {
            match (s.broken.load(Ordering::Acquire), r) {
                // The mark is written: nothing more to do for it.
                (true, Ok(_)) => {
                    live.remove(id);
                }
                (false, Ok(0)) => {
                    drop(live);
                    cluster.break_copy(s, "lost");
                    live = lock(&cluster.mirror.live);
                }
                (false, Ok(3)) => {
                    replaced(s);
                    live.remove(id);
                }
                _ => {}
            }
        }
    }
}

/// Fields of one copy entry: `(kind, data, id range)`.
pub(crate) fn entry_fields(fields: &[Value]) -> Option<(u8, Bytes, u32, u32)> {
    let mut kind = None;
    let mut range = (0, 0);
    for pair in fields.chunks(2) {
        let [Value::BulkString(name), Value::BulkString(value)] = pair else {
            return None;
        };
        match name.as_slice() {
            b"d" | b"e" => kind = Some((name[0], Bytes::copy_from_slice(value))),
            b"i" => {
                let text = std::str::from_utf8(value).ok()?;
                let (s, l) = text.split_once(':')?;
                range = (s.parse().ok()?, l.parse().ok()?);
            }
            _ => {}
        }
    }
    let (kind, data) = kind?;
    Some((kind, data, range.0, range.1))
}
