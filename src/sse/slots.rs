//! How the in-memory replay store keeps a stream's events: compact, in memory of its own.
//!
//! An event reaches the store as a slice of the Partner connection's read buffer, which
//! the slice keeps whole (hyper allocates 8 KiB or more per read on a quiet connection,
//! so a 150-byte event held 8 KiB). [`EventLog`] copies each event into blocks it owns,
//! so the read buffer is freed once the event is relayed. In a block, an event is a small
//! header (its `eventSeq`, where its JSON-RPC id sits and its length, as LEB128 varints)
//! followed by its bytes; the log keeps, per event, only the 4-byte offset of that header
//! in its block. A full block is frozen into a `Bytes` that readers slice without copying;
//! events still in the newest block are copied out for a reader, in one piece per read.
//!
//! Hand-written rather than a crate: the blocks are freed in the log's own FIFO order and
//! counted for the replay budgets, which no general arena does.

use std::collections::VecDeque;

use bytes::Bytes;

use super::replay::{Entry, NO_SEQ};

/// The sizes a block takes as it grows, each an allocator size class (jemalloc's, and
/// close to glibc's), up to the largest block; an event larger than that gets a block of
/// its own size.
///
/// The largest, which every block of a long log has, is 1,792 bytes rather than 2,048:
/// jemalloc carves 1,792-byte objects 16 at a time from 7-page slabs, 2,048-byte ones 2 at
/// a time from single pages, and keeps a 128-byte record per slab it has ever had at once,
/// for good. With 10,000 streams holding 60 events each, 2 KiB blocks took 27,000 slabs at
/// the peak and left 3.4 MiB of those records behind after the streams ended (issue 13).
const BLOCK_STEPS: [usize; 7] = [256, 384, 512, 768, 1024, 1280, 1792];
const MAX_BLOCK: usize = BLOCK_STEPS[BLOCK_STEPS.len() - 1];

/// Below this many block bytes a log is short: its newest block starts at the smallest
/// step and is reallocated up the steps as events arrive (at most six copies of a block
/// of under 1.8 KiB), so the room it has not used yet stays under a third of it. A longer
/// log starts each block at the largest size, where the newest block's unused room is a
/// small share of what the log holds and no copy is made.
const SHORT_LOG: usize = 16 * 1024;

/// The longest header: four varints (10 + 5 + 5 + 5 bytes).
const MAX_HEADER: usize = 25;

fn put_varint(out: &mut [u8; MAX_HEADER], at: &mut usize, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out[*at] = byte;
            *at += 1;
            return;
        }
        out[*at] = byte | 0x80;
        *at += 1;
    }
}

/// The smallest step that holds `n` bytes, or `n` itself past the largest.
fn step_for(n: usize) -> usize {
    BLOCK_STEPS.into_iter().find(|&s| s >= n).unwrap_or(n)
}

/// Reads a varint written by `put_varint` at `*at`.
fn get_varint(b: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    while let Some(&byte) = b.get(*at) {
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    v
}

/// An event's header, read back from its block.
struct Header {
    seq: u64,
    id_start: u32,
    id_len: u32,
    /// Where the event's bytes start and end in the block.
    body: std::ops::Range<usize>,
}

fn read_header(block: &[u8], offset: u32) -> Header {
    let mut at = offset as usize;
    // Stored plus one, so that `NO_SEQ` (u64::MAX) takes one byte, as 0.
    let seq = get_varint(block, &mut at).wrapping_sub(1);
    let id_start = get_varint(block, &mut at) as u32;
    let id_len = get_varint(block, &mut at) as u32;
    let len = get_varint(block, &mut at) as usize;
    Header {
        seq,
        id_start,
        id_len,
        body: at..at + len,
    }
}

/// A full block: the log position just after its last event, its size, and its bytes.
struct Sealed {
    end: u64,
    size: usize,
    bytes: Bytes,
}

/// Grows a full deque by a third rather than letting `VecDeque` double it, so the unused
/// room stays under a third of the used: a 4-byte offset then costs at most 5.3 bytes in
/// logs of a dozen events or more, and a sealed block's 48 bytes are shared by a dozen
/// events.
pub(super) fn reserve_for_push<T>(deque: &mut VecDeque<T>) {
    if deque.len() == deque.capacity() {
        deque.reserve_exact((deque.len() / 3).max(4));
    }
}

/// One stream's events, oldest first, at log positions `base()..end()`.
#[derive(Default)]
pub(super) struct EventLog {
    /// Per event, the offset of its header in its block.
    offsets: VecDeque<u32>,
    /// Position of `offsets[0]`.
    base: u64,
    /// Full blocks, oldest first.
    sealed: VecDeque<Sealed>,
    /// The newest block: its events so far, with room for more.
    open: Vec<u8>,
    /// Position of the newest block's first event.
    open_first: u64,
    /// The bytes of every block held (used or not).
    block_bytes: usize,
}

impl EventLog {
    /// The memory this log holds: its blocks, offsets and sealed-block entries.
    pub(super) fn held(&self) -> usize {
        self.block_bytes
            + self.offsets.capacity() * std::mem::size_of::<u32>()
            + self.sealed.capacity() * std::mem::size_of::<Sealed>()
    }

    pub(super) fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Position of the oldest event held.
    pub(super) fn base(&self) -> u64 {
        self.base
    }

    /// Position the next event will take.
    pub(super) fn end(&self) -> u64 {
        self.base + self.offsets.len() as u64
    }

    /// The events from position `from` on, each with its block (`None`: the newest) and
    /// its header's offset; one binary search, then a walk.
    fn walk(&self, from: u64) -> impl Iterator<Item = (u64, Option<&Sealed>, u32)> + '_ {
        let from = from.max(self.base);
        let mut block = self.sealed.partition_point(|b| b.end <= from);
        self.offsets
            .range((from - self.base) as usize..)
            .zip(from..)
            .map(move |(&offset, pos)| {
                if pos >= self.open_first {
                    return (pos, None, offset);
                }
                while self.sealed[block].end <= pos {
                    block += 1;
                }
                (pos, Some(&self.sealed[block]), offset)
            })
    }

    fn block<'a>(&'a self, sealed: Option<&'a Sealed>) -> &'a [u8] {
        sealed.map_or(&self.open[..], |b| &b.bytes[..])
    }

    /// The `eventSeq` of each event from position `from` on (`NO_SEQ` for those without).
    fn seqs(&self, from: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.walk(from).map(|(pos, sealed, offset)| {
            let mut at = offset as usize;
            (pos, get_varint(self.block(sealed), &mut at).wrapping_sub(1))
        })
    }

    /// The lowest `eventSeq` held.
    pub(super) fn first_seq(&self) -> Option<u64> {
        self.seqs(self.base)
            .map(|(_, seq)| seq)
            .find(|s| *s != NO_SEQ)
    }

    /// The first position whose event has an `eventSeq` for which `wanted` holds, or
    /// `end()`.
    pub(super) fn position(&self, wanted: impl Fn(u64) -> bool) -> u64 {
        self.seqs(self.base)
            .find(|&(_, seq)| seq != NO_SEQ && wanted(seq))
            .map_or_else(|| self.end(), |(pos, _)| pos)
    }

    /// Copies `entry` into the newest block (or a new one) at position `end()`.
    pub(super) fn push(&mut self, entry: &Entry) {
        let mut header = [0u8; MAX_HEADER];
        let mut h = 0;
        put_varint(&mut header, &mut h, entry.seq.wrapping_add(1));
        put_varint(&mut header, &mut h, u64::from(entry.id_start));
        put_varint(&mut header, &mut h, u64::from(entry.id_len));
        put_varint(&mut header, &mut h, entry.bytes.len() as u64);
        let n = h + entry.bytes.len();
        let pos = self.end();
        let (len, cap) = (self.open.len(), self.open.capacity());
        if cap - len < n {
            if len > 0 && len + n <= MAX_BLOCK && self.block_bytes < SHORT_LOG {
                // A short log's newest block grows to the next step instead.
                let size = step_for(len + n);
                self.open.reserve_exact(size - len);
                self.block_bytes += self.open.capacity() - cap;
            } else {
                if len > 0 {
                    let full = Bytes::from(std::mem::take(&mut self.open));
                    reserve_for_push(&mut self.sealed);
                    self.sealed.push_back(Sealed {
                        end: pos,
                        size: cap,
                        bytes: full,
                    });
                } else {
                    self.block_bytes -= cap;
                }
                let size = if self.block_bytes < SHORT_LOG {
                    step_for(n)
                } else {
                    MAX_BLOCK.max(n)
                };
                self.open = Vec::with_capacity(size);
                self.open_first = pos;
                self.block_bytes += self.open.capacity();
            }
        }
        reserve_for_push(&mut self.offsets);
        self.offsets.push_back(self.open.len() as u32);
        self.open.extend_from_slice(&header[..h]);
        self.open.extend_from_slice(&entry.bytes);
    }

    /// Removes the oldest event and returns its `eventSeq` (or `NO_SEQ`); frees its block
    /// when it was the block's last event. `None` when the log is empty.
    pub(super) fn pop_front(&mut self) -> Option<u64> {
        let (_, seq) = self.seqs(self.base).next()?;
        self.offsets.pop_front();
        self.base += 1;
        if self.sealed.front().is_some_and(|b| b.end <= self.base) {
            if let Some(b) = self.sealed.pop_front() {
                self.block_bytes -= b.size;
            }
        }
        if self.offsets.is_empty() {
            // The newest block went too: let go of it.
            self.block_bytes -= self.open.capacity();
            self.open = Vec::new();
            self.open_first = self.base;
        }
        Some(seq)
    }

    /// Drops every event and block, and the room they took; positions go on from `end()`.
    pub(super) fn clear(&mut self) {
        let end = self.end();
        *self = EventLog {
            base: end,
            open_first: end,
            ..EventLog::default()
        };
    }

    /// Appends the events from position `from` on (at least `base()`) to `out`, skipping
    /// those without `eventSeq` before `live_from`. Events of full blocks are slices of
    /// them; those of the newest block are copied out together, once.
    pub(super) fn read_from(&self, from: u64, live_from: u64, out: &mut Vec<Entry>) {
        let mut open_copy: Option<(Bytes, usize)> = None;
        for (pos, sealed, offset) in self.walk(from) {
            let h = read_header(self.block(sealed), offset);
            if h.seq == NO_SEQ && pos < live_from {
                continue;
            }
            let bytes = match sealed {
                Some(b) => b.bytes.slice(h.body),
                None => {
                    let (copy, start) = open_copy.get_or_insert_with(|| {
                        let start = offset as usize;
                        (Bytes::copy_from_slice(&self.open[start..]), start)
                    });
                    copy.slice(h.body.start - *start..h.body.end - *start)
                }
            };
            out.push(Entry {
                seq: h.seq,
                bytes,
                id_start: h.id_start,
                id_len: h.id_len,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, id: (u32, u32), text: &[u8]) -> Entry {
        Entry {
            seq,
            bytes: Bytes::copy_from_slice(text),
            id_start: id.0,
            id_len: id.1,
        }
    }

    fn all(log: &EventLog) -> Vec<Entry> {
        let mut out = Vec::new();
        log.read_from(0, 0, &mut out);
        out
    }

    #[test]
    fn events_read_back_as_stored() {
        let mut log = EventLog::default();
        let cases = [
            (0, (0, 0)),
            (1, (5, 2)),
            (NO_SEQ, (0, 0)),
            (u64::MAX - 1, (u32::MAX, u32::MAX)),
            (300, (1 << 20, 16 * 1024)),
        ];
        for (seq, id) in cases {
            log.push(&entry(seq, id, b"data: {\"id\":7}\n\n"));
        }
        let back = all(&log);
        assert_eq!(back.len(), cases.len());
        for ((seq, id), e) in cases.iter().zip(&back) {
            assert_eq!((e.seq, e.id_start, e.id_len), (*seq, id.0, id.1));
            assert_eq!(&e.bytes[..], b"data: {\"id\":7}\n\n");
        }
        assert_eq!(log.first_seq(), Some(0));
        assert_eq!(log.seqs(2).next(), Some((2, NO_SEQ)));
        assert_eq!(log.position(|s| s > 1 && s != NO_SEQ), 3);
    }

    #[test]
    fn blocks_grow_seal_and_are_freed_in_order() {
        let mut log = EventLog::default();
        let text = [b'x'; 100];
        for seq in 0..40 {
            log.push(&entry(seq, (0, 0), &text));
        }
        // 104-byte events: the first block grows through the steps to 1792 (17 events),
        // so does the second; the newest holds the last six in 768.
        assert_eq!(log.sealed.len(), 2);
        assert_eq!(log.block_bytes, 1792 + 1792 + 768);
        let back = all(&log);
        assert_eq!(back.len(), 40);
        // Events of a sealed block are slices of it, not copies.
        assert_eq!(
            back[1].bytes.as_ptr(),
            back[0].bytes.as_ptr().wrapping_add(104)
        );
        assert!(back
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == i as u64 && e.bytes[..] == text));
        for seq in 0..16 {
            assert_eq!(log.pop_front(), Some(seq));
        }
        assert_eq!(log.sealed.len(), 2, "event 16 is still in the first block");
        assert_eq!(log.pop_front(), Some(16));
        assert_eq!(log.block_bytes, 1792 + 768);
        while log.pop_front().is_some() {}
        assert_eq!((log.block_bytes, log.open.capacity(), log.len()), (0, 0, 0));
        assert_eq!((log.base(), log.end()), (40, 40));
        // The positions go on; a large event gets a block of its own size.
        log.push(&entry(41, (0, 0), &[b'y'; 10_000]));
        assert_eq!(log.block_bytes, 10_005, "a 5-byte header and the event");
        assert_eq!(all(&log)[0].seq, 41);
        log.clear();
        assert_eq!((log.held(), log.base(), log.len()), (0, 41, 0));
    }

    /// A short log's newest block grows a step at a time, so its unused room stays under
    /// a third of it once past the first step; a long log's blocks start at the largest.
    #[test]
    fn a_short_log_wastes_little_and_a_long_one_copies_nothing() {
        for size in (40..=600).step_by(37) {
            let mut log = EventLog::default();
            let text = vec![b'z'; size];
            let mut grown = 0;
            while log.block_bytes < SHORT_LOG {
                let cap = log.open.capacity();
                log.push(&entry(1, (0, 0), &text));
                let (len, now) = (log.open.len(), log.open.capacity());
                if now > cap && len > size + 4 {
                    grown += 1;
                }
                if now > BLOCK_STEPS[0] {
                    assert!(
                        (now - len) * 3 <= now,
                        "{size}-byte events: {len} of {now} used"
                    );
                }
            }
            assert!(grown > 0, "{size}-byte events: the block never grew");
            let sealed = log.sealed.len();
            while log.sealed.len() < sealed + 3 {
                let cap = log.open.capacity();
                log.push(&entry(1, (0, 0), &text));
                let now = log.open.capacity();
                assert!(
                    now == cap || now == MAX_BLOCK,
                    "{size}: grew {cap} -> {now}"
                );
            }
        }
        // The case of the memory probe's short hold: 15 events of 171 bytes (with their
        // headers) hold 1792 + 1024 bytes of blocks, 10% over their size (doubling
        // blocks held 3840, 50% over).
        let mut log = EventLog::default();
        for _ in 0..15 {
            log.push(&entry(1, (0, 0), &[b'e'; 166]));
        }
        assert_eq!(log.block_bytes, 1792 + 1024);
    }

    #[test]
    fn reading_the_newest_block_copies_once_and_skips_old_unsequenced_events() {
        let mut log = EventLog::default();
        log.push(&entry(NO_SEQ, (0, 0), b"a"));
        log.push(&entry(1, (0, 0), b"bb"));
        log.push(&entry(NO_SEQ, (0, 0), b"ccc"));
        let mut out = Vec::new();
        log.read_from(0, 2, &mut out);
        let texts: Vec<&[u8]> = out.iter().map(|e| &e.bytes[..]).collect();
        assert_eq!(texts, [&b"bb"[..], b"ccc"]);
        // Both come from one copy of the open block.
        let gap = out[1].bytes.as_ptr() as usize - out[0].bytes.as_ptr() as usize;
        assert_eq!(
            gap,
            2 + 4,
            "the second event follows the first and its header"
        );
    }

    /// What the module docs state: with deques grown by a third, a 4-byte offset costs at
    /// most 5.3 bytes at every length from 12 to 20,000 events.
    #[test]
    fn offsets_cost_at_most_a_third_more_than_their_size() {
        let mut log: VecDeque<u32> = VecDeque::new();
        for n in 1..=20_000usize {
            reserve_for_push(&mut log);
            log.push_back(0);
            if n >= 12 {
                let per_event = log.capacity() as f64 * 4.0 / n as f64;
                assert!(per_event <= 5.34, "{n} events: {per_event} bytes each");
            }
        }
    }
}
