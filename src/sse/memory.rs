//! The in-memory replay store (the default).
//!
//! Bounds: per stream (events, bytes), in total (bytes, streams), and a retention time
//! after a stream ends. Over budget, the oldest *finished* streams go first; only when
//! none is left are the oldest events of open streams trimmed (their readers get an
//! explicit gap error, never a silent one). A record evicted from the index while its
//! stream is still open keeps serving the Leaders already following it.
//!
//! Locking: the index lock may be taken before a record's lock, never after it.
//!
//! Memory: each event is copied into blocks of its own record (`super::slots`), so the
//! Partner connection's read buffer it arrived in is not kept alive, and the store counts
//! what it really holds: the blocks and the log's slots, not only the event bytes. Every
//! budget (`max_bytes_per_stream`, `max_total_bytes`) and `replay_buffer_bytes` use that
//! figure.
//!
//! Accounting: a record's bytes and events are added to and taken from the store's totals
//! only while that record's lock is held, so the totals are always the sum of what the
//! records hold and can never go below zero (a trim or clear racing an append cannot
//! subtract bytes before they were added).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::replay::{
    Cursor, Entry, FollowerGuard, Gap, ReplayStats, ReplayStore, StreamEnd, StreamKey, StreamMeta,
    StreamRecord, NO_SEQ,
};
use super::slots::EventLog;

/// The store's bounds (see `[replay]` in the config).
#[derive(Debug, Clone, Copy)]
pub struct ReplayLimits {
    /// Events kept per stream.
    pub max_events_per_stream: usize,
    /// Bytes kept per stream.
    pub max_bytes_per_stream: usize,
    /// Bytes kept in all.
    pub max_total_bytes: usize,
    /// Streams kept.
    pub max_streams: usize,
    /// How long a finished stream stays replayable.
    pub retention: Duration,
}

use crate::sync::lock;

struct Totals {
    bytes: AtomicUsize,
    events: AtomicUsize,
    evicted_streams: AtomicU64,
    evicted_events: AtomicU64,
}

struct Index {
    map: HashMap<StreamKey, Arc<MemRecord>>,
    /// Open records in creation order (may hold stale ids; checked against the map).
    opened: VecDeque<(StreamKey, u64)>,
    /// Finished records in finishing order.
    finished: VecDeque<(StreamKey, u64, Instant)>,
    next_id: u64,
}

impl Index {
    /// Drops creation-order ids whose record left the index or was replaced.
    fn drop_stale_opened(&mut self) {
        let map = &self.map;
        self.opened
            .retain(|(k, i)| map.get(k).is_some_and(|r| r.id == *i));
    }
}

struct Shared {
    limits: ReplayLimits,
    totals: Totals,
    index: Mutex<Index>,
}

/// The in-memory store.
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct LogState {
    /// The events, in blocks of the record's own.
    log: EventLog,
    evicted_through: Option<u64>,
    last_seq: Option<u64>,
    end: Option<StreamEnd>,
}

impl LogState {
    fn new() -> LogState {
        LogState {
            log: EventLog::default(),
            evicted_through: None,
            last_seq: None,
            end: None,
        }
    }

    /// The memory this log holds.
    fn held(&self) -> usize {
        self.log.held()
    }

    /// Removes the oldest entry (and the block it was the last one of); false when
    /// there is none.
    fn pop_front(&mut self) -> bool {
        let Some(seq) = self.log.pop_front() else {
            return false;
        };
        if seq != NO_SEQ {
            self.evicted_through = Some(self.evicted_through.map_or(seq, |x| x.max(seq)));
        }
        true
    }

    /// Drops every entry and block, and the room they took.
    fn clear(&mut self) {
        if let Some(last) = self.last_seq {
            self.evicted_through = Some(last);
        }
        self.log.clear();
    }
}

/// One stream's log, in memory.
pub(crate) struct MemRecord {
    id: u64,
    key: StreamKey,
    meta: StreamMeta,
    state: Mutex<LogState>,
    changes: watch::Sender<u64>,
    followers: watch::Sender<usize>,
    shared: Weak<Shared>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new(limits: ReplayLimits) -> MemoryStore {
        MemoryStore {
            shared: Arc::new(Shared {
                limits,
                totals: Totals {
                    bytes: AtomicUsize::new(0),
                    events: AtomicUsize::new(0),
                    evicted_streams: AtomicU64::new(0),
                    evicted_events: AtomicU64::new(0),
                },
                index: Mutex::new(Index {
                    map: HashMap::new(),
                    opened: VecDeque::new(),
                    finished: VecDeque::new(),
                    next_id: 0,
                }),
            }),
        }
    }
}

impl Shared {
    /// Drops finished records past their retention.
    fn expire(&self, index: &mut Index, now: Instant) {
        while let Some((key, id, at)) = index.finished.front() {
            if *at + self.limits.retention > now {
                break;
            }
            if index.map.get(key).is_some_and(|r| r.id == *id) {
                if let Some(r) = index.map.remove(key) {
                    r.clear();
                }
            }
            index.finished.pop_front();
        }
    }

    /// Evicts until the totals are within budget (`extra_streams` = a stream about to be
    /// added).
    fn make_room(&self, index: &mut Index, extra_streams: usize) {
        let t = &self.totals;
        let over = |index: &Index| {
            t.bytes.load(Ordering::Acquire) > self.limits.max_total_bytes
                || index.map.len() + extra_streams > self.limits.max_streams
        };
        // 1. The oldest finished streams.
        while over(index) {
            let Some((key, id, _)) = index.finished.pop_front() else {
                break;
            };
            if index.map.get(&key).is_some_and(|r| r.id == id) {
                if let Some(r) = index.map.remove(&key) {
                    r.clear();
                    t.evicted_streams.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // 2. Too many streams, all open: the oldest leaves the index (its followers keep it).
        while index.map.len() + extra_streams > self.limits.max_streams {
            let Some((key, id)) = index.opened.pop_front() else {
                break;
            };
            if index.map.get(&key).is_some_and(|r| r.id == id) {
                index.map.remove(&key);
                t.evicted_streams.fetch_add(1, Ordering::Relaxed);
            }
        }
        // 3. Too many bytes, all open: trim the oldest events of the oldest streams.
        let mut i = 0;
        while t.bytes.load(Ordering::Acquire) > self.limits.max_total_bytes
            && i < index.opened.len()
        {
            let (key, id) = &index.opened[i];
            match index.map.get(key) {
                Some(r) if r.id == *id => {
                    if !r.trim_one() {
                        i += 1;
                    }
                }
                _ => i += 1,
            }
        }
    }
}

impl ReplayStore for MemoryStore {
    fn open(&self, key: StreamKey, meta: StreamMeta) -> Arc<dyn StreamRecord> {
        let sh = &self.shared;
        let mut index = lock(&sh.index);
        sh.expire(&mut index, Instant::now());
        if let Some(old) = index.map.remove(&key) {
            old.clear();
        }
        sh.make_room(&mut index, 1);
        let id = index.next_id;
        index.next_id += 1;
        let record = Arc::new(MemRecord {
            id,
            key: key.clone(),
            meta,
            state: Mutex::new(LogState::new()),
            changes: watch::channel(0).0,
            followers: watch::channel(0).0,
            shared: Arc::downgrade(sh),
        });
        // Keep the creation-order queue from growing with stale ids.
        if index.opened.len() > 2 * sh.limits.max_streams {
            index.drop_stale_opened();
        }
        index.opened.push_back((key.clone(), id));
        index.map.insert(key, record.clone());
        record
    }

    fn find(&self, key: &StreamKey) -> Option<Arc<dyn StreamRecord>> {
        let mut index = lock(&self.shared.index);
        self.shared.expire(&mut index, Instant::now());
        index
            .map
            .get(key)
            .map(|r| r.clone() as Arc<dyn StreamRecord>)
    }

    fn sweep(&self) {
        let mut index = lock(&self.shared.index);
        self.shared.expire(&mut index, Instant::now());
        // Let the index shrink after a burst: stale creation-order ids go, and tables
        // far larger than what they hold are reallocated.
        index.drop_stale_opened();
        let oversized = |cap: usize, len: usize| cap > 4 * len.max(16);
        if oversized(index.map.capacity(), index.map.len()) {
            index.map.shrink_to_fit();
        }
        if oversized(index.opened.capacity(), index.opened.len()) {
            index.opened.shrink_to_fit();
        }
        if oversized(index.finished.capacity(), index.finished.len()) {
            index.finished.shrink_to_fit();
        }
    }

    fn streams(&self) -> Vec<(StreamKey, StreamMeta)> {
        let mut index = lock(&self.shared.index);
        self.shared.expire(&mut index, Instant::now());
        index
            .map
            .iter()
            .map(|(k, r)| (k.clone(), r.meta.clone()))
            .collect()
    }

    fn stats(&self) -> ReplayStats {
        let t = &self.shared.totals;
        ReplayStats {
            streams: lock(&self.shared.index).map.len(),
            bytes: t.bytes.load(Ordering::Acquire),
            events: t.events.load(Ordering::Acquire),
            evicted_streams: t.evicted_streams.load(Ordering::Relaxed),
            evicted_events: t.evicted_events.load(Ordering::Relaxed),
        }
    }
}

impl MemRecord {
    fn totals(&self) -> Option<Arc<Shared>> {
        self.shared.upgrade()
    }

    /// Removes the oldest entry; false when there is none.
    fn trim_one(&self) -> bool {
        let sh = self.totals();
        let mut st = lock(&self.state);
        let before = st.held();
        if !st.pop_front() {
            return false;
        }
        if let Some(sh) = sh {
            sh.totals
                .bytes
                .fetch_sub(before - st.held(), Ordering::AcqRel);
            sh.totals.events.fetch_sub(1, Ordering::AcqRel);
            sh.totals.evicted_events.fetch_add(1, Ordering::Relaxed);
        }
        drop(st);
        true
    }

    /// Drops every entry (the record left the store).
    fn clear(&self) {
        let sh = self.totals();
        let mut st = lock(&self.state);
        let (bytes, n) = (st.held(), st.log.len());
        st.clear();
        if let Some(sh) = sh {
            sh.totals.bytes.fetch_sub(bytes, Ordering::AcqRel);
            sh.totals.events.fetch_sub(n, Ordering::AcqRel);
        }
        drop(st);
        self.changes.send_modify(|v| *v += 1);
    }
}

impl Drop for MemRecord {
    fn drop(&mut self) {
        let st = lock(&self.state);
        if let Some(sh) = self.shared.upgrade() {
            sh.totals.bytes.fetch_sub(st.held(), Ordering::AcqRel);
            sh.totals.events.fetch_sub(st.log.len(), Ordering::AcqRel);
        }
    }
}

impl StreamRecord for MemRecord {
    fn meta(&self) -> &StreamMeta {
        &self.meta
    }

    fn append(&self, entry: Entry) {
        self.append_all(&mut std::iter::once(entry));
    }

    /// One lock of the record for a whole read's events, and one wake-up of its
    /// followers (a watch notification per event was a quarter of the relay's CPU).
    fn append_all(&self, entries: &mut dyn Iterator<Item = Entry>) {
        let sh = self.totals();
        let limits = sh.as_ref().map(|s| s.limits);
        let mut entries = entries.peekable();
        let mut appended = false;
        while entries.peek().is_some() {
            let mut st = lock(&self.state);
            let mut over_budget = false;
            while !over_budget {
                let Some(entry) = entries.next() else { break };
                appended = true;
                let before = st.held();
                if entry.seq != NO_SEQ {
                    st.last_seq = Some(entry.seq);
                }
                // The copy that lets the Partner connection's read buffer go (module docs).
                st.log.push(&entry);
                drop(entry);
                let mut trimmed = 0;
                if let Some(l) = limits {
                    while (st.log.len() > l.max_events_per_stream
                        || st.held() > l.max_bytes_per_stream)
                        && st.log.len() > 1
                    {
                        st.pop_front();
                        trimmed += 1;
                    }
                }
                let after = st.held();
                // Counted under the record's lock (see the module docs). A record outlives
                // its store only in tests and at shutdown; it still logs then.
                if let Some(sh) = &sh {
                    let t = &sh.totals;
                    if after >= before {
                        t.bytes.fetch_add(after - before, Ordering::AcqRel);
                    } else {
                        t.bytes.fetch_sub(before - after, Ordering::AcqRel);
                    }
                    t.events.fetch_add(1, Ordering::AcqRel);
                    t.events.fetch_sub(trimmed, Ordering::AcqRel);
                    if trimmed > 0 {
                        t.evicted_events
                            .fetch_add(trimmed as u64, Ordering::Relaxed);
                    }
                    over_budget = t.bytes.load(Ordering::Acquire) > sh.limits.max_total_bytes;
                }
            }
            drop(st);
            // Over the store's budget: room is made (this record's lock released first,
            // as making room may trim it) before the next event goes in.
            if let Some(sh) = sh.as_ref().filter(|_| over_budget) {
                sh.make_room(&mut lock(&sh.index), 0);
            }
        }
        if appended {
            self.changes.send_modify(|v| *v += 1);
        }
    }

    fn finish(&self, end: StreamEnd) {
        lock(&self.state).end = Some(end);
        if let Some(sh) = self.totals() {
            let mut index = lock(&sh.index);
            if index.map.get(&self.key).is_some_and(|r| r.id == self.id) {
                index
                    .finished
                    .push_back((self.key.clone(), self.id, Instant::now()));
            }
        }
        self.changes.send_modify(|v| *v += 1);
    }

    fn is_finished(&self) -> bool {
        lock(&self.state).end.is_some()
    }

    fn first_cursor(&self) -> Cursor {
        let st = lock(&self.state);
        Cursor {
            next_pos: st.log.base(),
            live_from: 0,
        }
    }

    fn cursor_after(&self, after: Option<u64>) -> Result<Cursor, Gap> {
        let st = lock(&self.state);
        let gap = || Gap {
            first_available_seq: st.log.first_seq(),
            evicted_through: st.evicted_through.unwrap_or(0),
        };
        if let Some(evicted) = st.evicted_through {
            if after.is_none_or(|a| a < evicted) {
                return Err(gap());
            }
        }
        let end = st.log.end();
        let skip = st.log.position(|seq| after.is_none_or(|a| seq > a));
        Ok(Cursor {
            next_pos: skip,
            live_from: end,
        })
    }

    fn read(&self, cursor: &mut Cursor, out: &mut Vec<Entry>) -> Result<Option<StreamEnd>, Gap> {
        let st = lock(&self.state);
        if cursor.next_pos < st.log.base() {
            return Err(Gap {
                first_available_seq: st.log.first_seq(),
                evicted_through: st.evicted_through.unwrap_or(0),
            });
        }
        st.log.read_from(cursor.next_pos, cursor.live_from, out);
        cursor.next_pos = st.log.end();
        Ok(st.end)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn followers(&self) -> watch::Receiver<usize> {
        self.followers.subscribe()
    }

    fn follow(self: Arc<Self>) -> FollowerGuard {
        self.followers.send_modify(|n| *n += 1);
        FollowerGuard(self)
    }

    fn unfollow(&self) {
        self.followers.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Aic;
    use bytes::Bytes;

    fn limits() -> ReplayLimits {
        ReplayLimits {
            max_events_per_stream: 1000,
            max_bytes_per_stream: 1 << 20,
            max_total_bytes: 1 << 30,
            max_streams: 100_000,
            retention: Duration::from_secs(600),
        }
    }

    fn key(i: usize) -> StreamKey {
        StreamKey {
            partner: "p".into(),
            task_id: format!("t{i}").into(),
        }
    }

    fn meta() -> StreamMeta {
        StreamMeta {
            owner: Aic::parse("10001000011K912345E789ABCDEF2353").unwrap(),
            session_id: None,
        }
    }

    fn entry(seq: u64, len: usize) -> Entry {
        Entry {
            seq,
            bytes: Bytes::from(vec![b'x'; len]),
            id_start: 0,
            id_len: 0,
        }
    }

    /// Hole 11: appends racing clears (a stream restarted under the same key) never make
    /// the byte total wrap (a wrapped total looks over budget and makes appends trim open
    /// streams; with budgets far above what the test holds, any trim is the wrap's doing).
    /// More appenders than cores make the scheduler preempt some of them between their
    /// push and their accounting, where the old code let a clear subtract first; the wrap
    /// then lasts as long as that appender is off its core, long enough to read.
    #[test]
    #[expect(
        clippy::disallowed_methods,
        reason = "a race between real threads, bounded by the wall clock"
    )]
    fn totals_never_underflow_under_races() {
        let store = Arc::new(MemoryStore::new(ReplayLimits {
            max_events_per_stream: usize::MAX,
            max_bytes_per_stream: usize::MAX,
            ..limits()
        }));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let raced = Arc::new(Mutex::new(store.open(key(0), meta())));
        let appenders: Vec<_> = (0..8)
            .map(|_| {
                let (record, stop) = (raced.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let r = lock(&record).clone();
                        for seq in 0..64 {
                            r.append(entry(seq, 10));
                        }
                    }
                })
            })
            .collect();
        let started = std::time::Instant::now();
        let mut reopened = 0u64;
        while started.elapsed() < Duration::from_millis(2000) {
            // Replacing the record clears the old one while it is still appended to.
            *lock(&raced) = store.open(key(0), meta());
            reopened += 1;
            let st = store.stats();
            // What the appenders can have added at most: far below a wrapped total.
            if st.bytes > 1 << 30 || st.evicted_events != 0 || st.evicted_streams != 0 {
                stop.store(true, Ordering::Relaxed);
                panic!("the total wrapped after {reopened} reopenings: {st:?}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        for a in appenders {
            a.join().unwrap();
        }
        assert_eq!(store.stats().evicted_events, 0);
    }

    /// What the records in the index hold, summed.
    fn held(store: &MemoryStore) -> usize {
        let index = lock(&store.shared.index);
        index.map.values().map(|r| lock(&r.state).held()).sum()
    }

    fn seqs(r: &Arc<dyn StreamRecord>, mut c: Cursor) -> Vec<u64> {
        let mut out = Vec::new();
        r.read(&mut c, &mut out).unwrap();
        out.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn cursor_after_sees_every_later_event_or_a_gap() {
        let store = MemoryStore::new(ReplayLimits {
            max_events_per_stream: 3,
            ..limits()
        });
        let r = store.open(key(0), meta());
        for s in [1, 2, 5, 7] {
            r.append(entry(s, 10));
        }
        // 1 was evicted (3 events per stream): resuming after 0 or from the start is a gap.
        assert_eq!(r.cursor_after(None).unwrap_err().evicted_through, 1);
        assert!(r.cursor_after(Some(0)).is_err());
        assert_eq!(seqs(&r, r.cursor_after(Some(1)).unwrap()), vec![2, 5, 7]);
        assert_eq!(seqs(&r, r.cursor_after(Some(2)).unwrap()), vec![5, 7]);
        assert_eq!(seqs(&r, r.cursor_after(Some(3)).unwrap()), vec![5, 7]);
        assert_eq!(
            seqs(&r, r.cursor_after(Some(7)).unwrap()),
            Vec::<u64>::new()
        );
        assert_eq!(store.stats().evicted_events, 1);
    }

    #[test]
    fn events_without_seq_are_live_only() {
        let store = MemoryStore::new(limits());
        let r = store.open(key(0), meta());
        r.append(entry(1, 1));
        r.append(entry(NO_SEQ, 1));
        r.append(entry(2, 1));
        assert_eq!(seqs(&r, r.first_cursor()), vec![1, NO_SEQ, 2]);
        let mut c = r.cursor_after(None).unwrap();
        assert_eq!(seqs(&r, c), vec![1, 2]);
        let mut out = Vec::new();
        r.read(&mut c, &mut out).unwrap();
        r.append(entry(NO_SEQ, 1));
        out.clear();
        r.read(&mut c, &mut out).unwrap();
        assert_eq!(out.len(), 1, "a live event after joining is delivered");
    }

    #[test]
    fn a_slow_reader_gets_a_gap_not_a_silent_skip() {
        let store = MemoryStore::new(ReplayLimits {
            max_events_per_stream: 2,
            ..limits()
        });
        let r = store.open(key(0), meta());
        let mut c = r.first_cursor();
        for s in 1..=5 {
            r.append(entry(s, 1));
        }
        let mut out = Vec::new();
        assert!(r.read(&mut c, &mut out).is_err());
    }

    /// A read's events go in together: followers are woken once, the store's budget holds,
    /// and the room comes from a finished stream, not from the batch's own events.
    #[test]
    fn a_batch_wakes_followers_once_and_stays_within_budget() {
        let budget = 20_000;
        let store = MemoryStore::new(ReplayLimits {
            max_total_bytes: budget,
            ..limits()
        });
        let other = store.open(key(1), meta());
        other.append_all(&mut (1..=50).map(|s| entry(s, 300)));
        other.finish(StreamEnd::Complete);
        let r = store.open(key(2), meta());
        let mut changes = r.changes();
        let seen = *changes.borrow_and_update();
        r.append_all(&mut (1..=100).map(|s| entry(s, 100)));
        assert_eq!(
            *changes.borrow_and_update(),
            seen + 1,
            "one wake-up for the batch"
        );
        let st = store.stats();
        assert!(st.bytes <= budget, "{st:?}");
        assert_eq!(st.bytes, held(&store));
        // Room was made from the finished stream, not from the batch's own events.
        assert_eq!(seqs(&r, r.cursor_after(None).unwrap()).len(), 100);
        assert!(
            store.find(&key(1)).is_none(),
            "the finished stream made room"
        );
    }

    /// Issue test 7: 1,000 streams x 100 events within the total budget, the oldest
    /// finished streams evicted first.
    #[test]
    fn thousand_streams_stay_within_budget_oldest_finished_first() {
        let budget = 2_000_000; // 2 MB; the load below is 10 MB
        let store = MemoryStore::new(ReplayLimits {
            max_total_bytes: budget,
            max_streams: 100_000,
            ..limits()
        });
        let mut records = Vec::new();
        for i in 0..1000 {
            let r = store.open(key(i), meta());
            for s in 1..=100 {
                r.append(entry(s, 100));
                assert!(store.stats().bytes <= budget, "over budget at stream {i}");
            }
            // Every stream but the multiples of ten finishes.
            if i % 10 != 0 {
                r.finish(StreamEnd::Complete);
            }
            records.push(r);
        }
        let st = store.stats();
        assert!(st.bytes <= budget, "{st:?}");
        assert_eq!(st.bytes, held(&store), "accounting matches the records");
        // Open streams were never touched while finished ones remained: all ten-multiples
        // are still complete, and the finished survivors are the most recent ones.
        for i in (0..1000).step_by(10) {
            if let Some(r) = store.find(&key(i)) {
                assert_eq!(
                    seqs(&r, r.cursor_after(None).unwrap()).len(),
                    100,
                    "open stream {i} lost events"
                );
            }
        }
        let finished_kept: Vec<usize> = (0..1000)
            .filter(|i| i % 10 != 0 && store.find(&key(*i)).is_some())
            .collect();
        let oldest_kept = finished_kept.first().copied().unwrap_or(1000);
        assert!((oldest_kept..1000)
            .filter(|i| i % 10 != 0)
            .all(|i| store.find(&key(i)).is_some()));
        assert!(st.evicted_streams > 0);
        drop(records);
        assert_eq!(store.stats().bytes, held(&store));
    }

    #[test]
    fn stream_count_cap_and_retention() {
        let store = MemoryStore::new(ReplayLimits {
            max_streams: 3,
            ..limits()
        });
        let a = store.open(key(0), meta());
        a.finish(StreamEnd::Complete);
        let _b = store.open(key(1), meta());
        let _c = store.open(key(2), meta());
        let _d = store.open(key(3), meta());
        // The finished one went first.
        assert!(store.find(&key(0)).is_none());
        assert!(store.find(&key(1)).is_some());
        let _e = store.open(key(4), meta());
        // All open: the oldest open one leaves the index.
        assert!(store.find(&key(1)).is_none());
        assert_eq!(store.stats().streams, 3);
    }

    /// Issue 13: `sweep` expires finished records with no open or lookup, and leaves the
    /// open ones and those within retention.
    #[tokio::test(start_paused = true)]
    async fn sweep_expires_finished_records_only() {
        let store = MemoryStore::new(limits());
        let open = store.open(key(0), meta());
        for i in 1..=50 {
            let r = store.open(key(i), meta());
            r.append(entry(1, 100));
            r.finish(StreamEnd::Complete);
        }
        tokio::time::advance(Duration::from_secs(300)).await;
        let late = store.open(key(51), meta());
        late.finish(StreamEnd::Complete);
        tokio::time::advance(Duration::from_secs(301)).await;
        assert_eq!(store.stats().streams, 52, "stats expire nothing");
        store.sweep();
        assert_eq!(store.stats().streams, 2);
        assert_eq!(store.stats().bytes, held(&store));
        assert!(store.find(&key(51)).is_some());
        drop(open);
    }

    #[tokio::test(start_paused = true)]
    async fn finished_streams_expire_after_retention() {
        let store = MemoryStore::new(ReplayLimits {
            retention: Duration::from_secs(600),
            ..limits()
        });
        let r = store.open(key(0), meta());
        r.append(entry(1, 10));
        r.finish(StreamEnd::Complete);
        tokio::time::advance(Duration::from_secs(599)).await;
        assert!(store.find(&key(0)).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(store.find(&key(0)).is_none());
        drop(r);
        assert_eq!(store.stats().bytes, 0);
    }
}
