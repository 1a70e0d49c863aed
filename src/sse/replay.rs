//! The replay buffer's interface: a keyed store of stream records.
//!
//! Two small traits so that the in-memory default (`memory::MemoryStore`) and a
//! Redis-backed store for multi-instance deployments can both implement them: a record is
//! an append-only log of events (XADD/XRANGE-shaped), plus a change signal and a follower
//! count.
//!
//! Resume semantics: a record always knows the highest `eventSeq` it evicted, so
//! [`StreamRecord::cursor_after`] either yields a cursor that will see *every* event after
//! the requested one, or says [`Gap`]; never a silent gap.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;

use crate::identity::Aic;

/// Marks an entry that has no `eventSeq` (relayed live, never replayed).
pub(crate) const NO_SEQ: u64 = u64::MAX;

/// Which stream: (Partner, taskId).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamKey {
    /// Partner name.
    pub partner: Arc<str>,
    /// The task's id.
    pub task_id: Arc<str>,
}

/// Who started the stream.
#[derive(Debug, Clone)]
pub struct StreamMeta {
    /// The AIC that started it; only it may re-stream.
    pub owner: Aic,
    /// The `sessionId` it was started with.
    pub session_id: Option<String>,
}

/// One buffered event: its exact bytes, and where its JSON-RPC id sits in them. (How a
/// store keeps it is the store's own: the in-memory one packs it into its blocks behind a
/// 4-byte offset.)
#[derive(Debug, Clone)]
pub struct Entry {
    /// `eventSeq`, or `NO_SEQ`.
    pub seq: u64,
    /// The event as the Partner sent it (through its blank line).
    pub bytes: Bytes,
    /// Start of the JSON-RPC id value in `bytes` (`id_len == 0`: no id).
    pub id_start: u32,
    /// Length of the id value.
    pub id_len: u32,
}

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The Partner closed it after a terminal task state.
    Complete,
    /// It ended abnormally; followers get a final JSON-RPC error event with this reason.
    Failed {
        /// Short reason (`error.data.reason`).
        reason: &'static str,
    },
}

/// Events a reader needs are no longer held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// The lowest `eventSeq` still held, if any.
    pub first_available_seq: Option<u64>,
    /// The highest `eventSeq` evicted.
    pub evicted_through: u64,
}

/// A reader's position in a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// Position of the next entry to read.
    pub next_pos: u64,
    /// Entries without `eventSeq` before this position are skipped (they were live
    /// before this reader joined).
    pub live_from: u64,
}

/// Totals, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Records in the store.
    pub streams: usize,
    /// Bytes of buffered events (the budget's measure).
    pub bytes: usize,
    /// Buffered events.
    pub events: usize,
    /// Records evicted (budget or stream count), not counting expiry.
    pub evicted_streams: u64,
    /// Events evicted from records that stayed.
    pub evicted_events: u64,
}

/// The store.
pub trait ReplayStore: Send + Sync {
    /// Starts a record for `key`, replacing any earlier one.
    fn open(&self, key: StreamKey, meta: StreamMeta) -> Arc<dyn StreamRecord>;
    /// The record for `key`, unless it expired or was evicted.
    fn find(&self, key: &StreamKey) -> Option<Arc<dyn StreamRecord>>;
    /// Totals.
    fn stats(&self) -> ReplayStats;
    /// Drops finished records past their retention (the upkeep timer calls it, so they go
    /// even when no stream is opened or looked up).
    fn sweep(&self);
    /// Every stream it holds and who started it (at most `replay.max_streams`), named to
    /// a new process taking this one's sockets over (`sse::handed`).
    fn streams(&self) -> Vec<(StreamKey, StreamMeta)>;
}

/// One stream's log.
pub trait StreamRecord: Send + Sync {
    /// Who started it.
    fn meta(&self) -> &StreamMeta;
    /// Appends an event (the store may evict older ones to stay in budget).
    fn append(&self, entry: Entry);
    /// Appends several events in order (one read's), waking followers once for all.
    fn append_all(&self, entries: &mut dyn Iterator<Item = Entry>) {
        for entry in entries {
            self.append(entry);
        }
    }
    /// Marks the stream ended.
    fn finish(&self, end: StreamEnd);
    /// Whether the stream has ended (its recorder is gone).
    fn is_finished(&self) -> bool;
    /// A cursor at the very start, for the Leader whose request opened the stream.
    fn first_cursor(&self) -> Cursor;
    /// A cursor that sees every event with `eventSeq > after` (all when `None`), or the
    /// gap that makes that impossible.
    fn cursor_after(&self, after: Option<u64>) -> Result<Cursor, Gap>;
    /// Clones the entries after `cursor` into `out` and advances it. `Ok(Some(end))` once
    /// the stream ended and everything was read; `Err` if entries the cursor still needed
    /// were evicted.
    fn read(&self, cursor: &mut Cursor, out: &mut Vec<Entry>) -> Result<Option<StreamEnd>, Gap>;
    /// Ticks on every append and on finish.
    fn changes(&self) -> watch::Receiver<u64>;
    /// The number of readers following the stream.
    fn followers(&self) -> watch::Receiver<usize>;
    /// Counts a reader in (the returned guard counts it out when dropped).
    fn follow(self: Arc<Self>) -> FollowerGuard;
    /// Counts a reader out (called by `FollowerGuard`).
    fn unfollow(&self);
    /// Whether a reader elsewhere (a Leader following the stream through another
    /// instance) still follows it, asked before an unfollowed stream is cancelled at its
    /// Partner. `None`: nobody else can read it.
    fn followed_elsewhere(&self) -> Option<FollowedElsewhere> {
        None
    }
}

/// The answer of [`StreamRecord::followed_elsewhere`], when it has to be asked.
pub(crate) type FollowedElsewhere =
    std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

/// Keeps a reader counted while alive.
pub struct FollowerGuard(pub(crate) Arc<dyn StreamRecord>);

impl Drop for FollowerGuard {
    fn drop(&mut self) {
        self.0.unfollow();
    }
}
